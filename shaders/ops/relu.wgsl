// y = relu(x) elementwise. NaN passes through (x < 0 is false for NaN), matching
// the CPU path, so a diverging run is caught by the loss check downstream.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        let v = x[i];
        y[i] = select(v, 0.0, v < 0.0);
    }
}
