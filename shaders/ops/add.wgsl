// y = a + b elementwise (a residual add, or two gradients summed where a
// tensor feeds several layers), a `Value` per invocation (arith_lanes*.wgsl;
// `len` counts them). One f32 rounding, as on the CPU path.

@group(0) @binding(0) var<storage, read> a: array<Value>;
@group(0) @binding(1) var<storage, read> b: array<Value>;
@group(0) @binding(2) var<storage, read_write> y: array<Value>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        y[i] = a[i] + b[i];
    }
}
