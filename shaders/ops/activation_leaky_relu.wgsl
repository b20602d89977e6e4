// y = x where x > 0, else alpha * x. A NaN x gives alpha * NaN = NaN, matching
// the CPU path.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

struct Params {
    len: u32,
    row_stride: u32,
    alpha: f32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        let v = x[i];
        y[i] = select(params.alpha * v, v, v > 0.0);
    }
}
