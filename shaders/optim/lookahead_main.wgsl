// lookahead.wgsl over the packed parameters.

@group(0) @binding(4) var<uniform> step: Lookahead;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * step.row_stride;
    if (i < step.len) {
        lookahead(i);
    }
}
