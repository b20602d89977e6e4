// An optimizer's fused update (update_common.wgsl and the optimizer's
// `update`) that also writes each updated parameter as f16 into a packed
// mirror, the operand of the f16 conv kernels, so no cast runs before the next
// forward. The conversion is conv/f16_bits.wgsl's, so the mirror has the bits
// `cast_f16` would give. (The source starts with `enable f16;`.) The mirror
// `params_f16` and the uniform `step` are declared before this by
// optim/packed.rs, at the bindings after the update's state.

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * step.row_stride;
    if (i < step.len && update(i)) {
        // The f16 value widened exactly to f32, so the final conversion is exact.
        let bits = f16_bits4(clip_f16_range4(vec4(bitcast<u32>(params[i])))).x;
        params_f16[i] = f16(unpack2x16float(bits).x);
    }
}
