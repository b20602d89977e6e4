// Global average pool backward: dx[n, h, w, c] = dy[n, c] / (H * W), one
// invocation per input element.

@group(0) @binding(0) var<storage, read> dy: array<f32>;
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;

struct Params {
    len: u32,
    hw: u32,
    c: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i >= params.len) {
        return;
    }
    let n = i / (params.hw * params.c);
    let ch = i % params.c;
    dx[i] = dy[n * params.c + ch] / f32(params.hw);
}
