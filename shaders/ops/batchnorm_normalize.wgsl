// Batch norm forward: y = (x - mean[c]) * inv_std[c] * gamma[c] + beta[c], c the
// last (channel) axis, a `Lanes` of values per invocation (batchnorm_lanes*.wgsl;
// `len` and `channels` count lanes). `spread` holds inv_std (training) or, with
// spread_is_variance = 1, the running variance (inference), turned into
// 1 / sqrt(var + eps) here. The result goes through the fused activation
// (batchnorm_activation.wgsl: ReLU decided on the bits as relu.wgsl does,
// leaky ReLU, GELU or SiLU by their layers' formulas). `y` is stored as
// batchnorm_act_*.wgsl says (f32, or f16 for a consumer that rounds to it).

@group(0) @binding(0) var<storage, read> x: array<Lanes>;
@group(0) @binding(1) var<storage, read> mean: array<Lanes>;
@group(0) @binding(2) var<storage, read> spread: array<Lanes>;
@group(0) @binding(3) var<storage, read> gamma: array<Lanes>;
@group(0) @binding(4) var<storage, read> beta: array<Lanes>;
@group(0) @binding(5) var<storage, read_write> y: array<ActBits>;

struct Params {
    len: u32,
    channels: u32,
    row_stride: u32,
    spread_is_variance: u32,
    eps: f32,
    activation: u32,
    alpha: f32,
}
@group(0) @binding(6) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i >= params.len) {
        return;
    }
    let c = i % params.channels;
    var inv_std = spread[c];
    if (params.spread_is_variance != 0u) {
        inv_std = Lanes(1.0) / sqrt(inv_std + Lanes(params.eps));
    }
    let v = (x[i] - mean[c]) * inv_std * gamma[c] + beta[c];
    y[i] = act_bits(activate(v, params.activation, params.alpha));
}
