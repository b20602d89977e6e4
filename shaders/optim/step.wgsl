// An optimizer's fused update (update_common.wgsl and the optimizer's
// `update`) over the packed parameters. `step`, the uniform, is declared
// before this by optim/packed.rs, at the binding after the update's state.

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * step.row_stride;
    if (i < step.len) {
        update(i);
    }
}
