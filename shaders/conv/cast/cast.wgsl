// One tensor f32 -> f16, 8 elements per invocation, optionally clipped to
// +-65504 (override CLIP = 1). Used for operands a kernel cannot read as f32
// and as the two-dispatch fallback of the fused backward cast.

override CLIP: u32 = 0u;

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let group = gid.x + gid.y * params.row_stride;
    if (8u * group < params.len) {
        dst[group] = cast_group(src[2u * group], src[2u * group + 1u], 8u * group, params.len, CLIP == 1u);
    }
}
