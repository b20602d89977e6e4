// dx = dy * gelu'(x) or dy * silu'(x) (entry points `gelu_backward`,
// `silu_backward`); the helpers come from activation_smooth_common.wgsl.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> dx: array<f32>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn gelu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        dx[i] = dy[i] * gelu_slope(x[i]);
    }
}

@compute @workgroup_size(256)
fn silu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        dx[i] = dy[i] * silu_slope(x[i]);
    }
}
