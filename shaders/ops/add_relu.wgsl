// y = relu(a + b) elementwise: a residual add with the ReLU after it folded in
// (one pass instead of two), a `Value` per invocation (arith_lanes*.wgsl). The
// ReLU is decided on the sum's raw bits (relu_bits.wgsl), so NaN passes
// through as on the CPU path.

@group(0) @binding(0) var<storage, read> a: array<Value>;
@group(0) @binding(1) var<storage, read> b: array<Value>;
@group(0) @binding(2) var<storage, read_write> y: array<Bits>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        let s = bitcast<Bits>(a[i] + b[i]);
        y[i] = select(s, Bits(0u), negative(s));
    }
}
