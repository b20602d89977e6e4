// One tensor f32 -> f16, 8 elements per invocation, optionally clipped to
// +-65504 (override CLIP = 1). Used for operands a kernel cannot read as f32,
// for a conv's f32 output gradient (with saturation_flag.wgsl, raising the
// loss scaler's flag where it saturates; else saturation_unflagged.wgsl), and
// as the two-dispatch fallback of the fused backward cast. Elements past the
// tensor are written as 0, which never flags.

override CLIP: u32 = 0u;

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;

// The parameters' binding is declared by the saturation snippet, after the
// scaler's where there is one.
struct Params {
    len: u32,
    row_stride: u32,
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let group = gid.x + gid.y * params.row_stride;
    if (8u * group < params.len) {
        let halves = cast_group(src[2u * group], src[2u * group + 1u], 8u * group, params.len, CLIP == 1u);
        dst[group] = halves;
        flag_saturation(halves);
    }
}
