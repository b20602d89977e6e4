// conv_backward_cast_fp16: one dispatch writes both fp16 operands of the
// backward pass, 8 elements per invocation (two 16-byte loads, one 16-byte
// store). Groups [0, dvalues_groups) are dvalues, the groups after them the
// inputs; both clipped to +-65504 (70000 -> 65504), as every f32 -> f16
// conversion of aether saturates.

@group(0) @binding(0) var<storage, read> dvalues: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> inputs: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dvalues_f16: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> inputs_f16: array<vec4<u32>>;

struct Params {
    dvalues_len: u32,
    inputs_len: u32,
    row_stride: u32,
}
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let group = gid.x + gid.y * params.row_stride;
    let dvalues_groups = (params.dvalues_len + 7u) / 8u;
    let inputs_groups = (params.inputs_len + 7u) / 8u;
    if (group < dvalues_groups) {
        let lo = dvalues[2u * group];
        let hi = dvalues[2u * group + 1u];
        dvalues_f16[group] = cast_group(lo, hi, 8u * group, params.dvalues_len, true);
    } else if (group - dvalues_groups < inputs_groups) {
        let g = group - dvalues_groups;
        inputs_f16[g] = cast_group(inputs[2u * g], inputs[2u * g + 1u], 8u * g, params.inputs_len, true);
    }
}
