// dx = (a + b) where y > 0, else 0: the last two gradients a forked tensor
// receives, summed, and the gradient of the ReLU folded into the layer they
// flow into (relu_backward of the sum) in the same pass, a `Value` per
// invocation (arith_lanes*.wgsl). y > 0 is decided on the bits
// (relu_bits.wgsl), as relu_backward decides it.

@group(0) @binding(0) var<storage, read> a: array<Value>;
@group(0) @binding(1) var<storage, read> b: array<Value>;
@group(0) @binding(2) var<storage, read> y: array<Bits>;
@group(0) @binding(3) var<storage, read_write> dx: array<Value>;

struct Params {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        dx[i] = select(Value(0.0), a[i] + b[i], positive(y[i]));
    }
}
