// Batch norm backward, input gradient, from the finished per-channel sums:
// dx = gamma * inv_std * (g - sum(g) / count - xhat * sum(g * xhat) / count),
// the standard formula gamma * inv_std / count * (count * g - ...) rearranged;
// a `Lanes` of values per invocation (batchnorm_lanes*.wgsl; `len` and
// `channels` count lanes). g is dy taken through the fused activation
// (batchnorm_activation.wgsl) at the normalized value xhat * gamma + beta, as
// normalize computed it; without one beta is not read. `dx` is stored as
// batchnorm_grad_*.wgsl says (f32, or clipped f16 for a conv before that
// rounds its gradient to f16), and its saturation flagged as
// batchnorm_grad_flag.wgsl says where the model asks.

@group(0) @binding(0) var<storage, read> dy: array<Lanes>;
@group(0) @binding(1) var<storage, read> x: array<Lanes>;
@group(0) @binding(2) var<storage, read> mean: array<Lanes>;
@group(0) @binding(3) var<storage, read> inv_std: array<Lanes>;
@group(0) @binding(4) var<storage, read> gamma: array<Lanes>;
@group(0) @binding(5) var<storage, read> beta: array<Lanes>;
@group(0) @binding(6) var<storage, read> sum_dy: array<Lanes>;
@group(0) @binding(7) var<storage, read> sum_dy_xhat: array<Lanes>;
@group(0) @binding(8) var<storage, read_write> dx: array<GradBits>;

struct Params {
    len: u32,
    channels: u32,
    count: u32,
    row_stride: u32,
    activation: u32,
    alpha: f32,
}
// `params` is bound by batchnorm_grad_flag.wgsl or batchnorm_grad_unflagged.wgsl.

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i >= params.len) {
        return;
    }
    let c = i % params.channels;
    let count = f32(params.count);
    let s = inv_std[c];
    let xhat = (x[i] - mean[c]) * s;
    var g = dy[i];
    if (params.activation != ACTIVATION_NONE) {
        g = activation_grad(g, xhat * gamma[c] + beta[c], params.activation, params.alpha);
    }
    let bits = grad_bits(gamma[c] * s * (g - sum_dy[c] / count - xhat * (sum_dy_xhat[c] / count)));
    dx[i] = bits;
    flag_saturation(bits);
}
