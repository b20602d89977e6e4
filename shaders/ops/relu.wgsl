// y = relu(x) elementwise, decided on the raw bits: negative non-zero numbers
// become +0, while NaN (any payload) and -0.0 pass through unchanged, matching
// the CPU path. Float comparisons are avoided because some drivers (NVIDIA,
// see shared/gpu/README.md) do not keep NaN through them; a diverging run must
// reach the loss check as NaN.

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        let b = x[i];
        y[i] = select(b, 0u, is_negative(b));
    }
}
