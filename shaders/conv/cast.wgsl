// One tensor f32 -> f16, optionally clipped to +-65504 (override CLIP = 1).
// Used for forward operands and as the two-dispatch fallback of the fused
// backward cast.

override CLIP: u32 = 0u;

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

fn prepared(b: u32) -> u32 {
    return select(b, clip_f16_range(b), CLIP == 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let word = gid.x + gid.y * params.row_stride;
    let i = 2u * word;
    if (i < params.len) {
        let hi = select(0u, prepared(src[min(i + 1u, params.len - 1u)]), i + 1u < params.len);
        dst[word] = pack_f16_pair(prepared(src[i]), hi);
    }
}
