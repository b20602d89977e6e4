// Copies `width` channels of every pixel between two NHWC tensors with
// different channel counts: Concat's forward (each input into its channel range
// of the output) and its backward (each input's range of the gradient out).
// dst[row * dst_channels + dst_offset + c] = src[row * src_channels + src_offset + c].

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;

struct Params {
    len: u32,
    row_stride: u32,
    width: u32,
    src_channels: u32,
    src_offset: u32,
    dst_channels: u32,
    dst_offset: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        let row = i / params.width;
        let c = i % params.width;
        dst[row * params.dst_channels + params.dst_offset + c] =
            src[row * params.src_channels + params.src_offset + c];
    }
}
