// dx = dy where x > 0, else 0 (ReLU's gradient; the left derivative at 0, and
// 0 for a NaN x, matching the CPU path). x > 0 is decided on the bits
// (relu_bits.wgsl, prepended).

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> dx: array<f32>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        dx[i] = select(0.0, dy[i], is_positive(x[i]));
    }
}
