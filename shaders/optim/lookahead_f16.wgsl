// lookahead.wgsl over the packed parameters, writing the f16 mirror of each
// new value as step_f16.wgsl does.

@group(0) @binding(4) var<storage, read_write> params_f16: array<f16>;
@group(0) @binding(5) var<uniform> step: Lookahead;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * step.row_stride;
    if (i < step.len && lookahead(i)) {
        let bits = f16_bits4(clip_f16_range4(vec4(bitcast<u32>(params[i])))).x;
        params_f16[i] = f16(unpack2x16float(bits).x);
    }
}
