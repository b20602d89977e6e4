// Batch norm backward, pass 1: per chunk of rows, the per-channel partials of
// sum(g) (-> dbeta) and sum(g * xhat) (-> dgamma), xhat = (x - mean) * inv_std,
// a `Lanes` of channels per invocation. g is dy taken through the fused
// activation (batchnorm_activation.wgsl) at the normalized value xhat * gamma
// + beta, as normalize computed it; without one gamma and beta are not read.

@group(0) @binding(0) var<storage, read> dy: array<Lanes>;
@group(0) @binding(1) var<storage, read> x: array<Lanes>;
@group(0) @binding(2) var<storage, read> mean: array<Lanes>;
@group(0) @binding(3) var<storage, read> inv_std: array<Lanes>;
@group(0) @binding(4) var<storage, read> gamma: array<Lanes>;
@group(0) @binding(5) var<storage, read> beta: array<Lanes>;
@group(0) @binding(6) var<storage, read_write> partial_dy: array<Lanes>;
@group(0) @binding(7) var<storage, read_write> partial_dy_xhat: array<Lanes>;
@group(0) @binding(8) var<uniform> params: ReduceParams;

@compute @workgroup_size(TILE_LANES, ROW_LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let group = group_index(wid);
    if (group >= params.groups) {
        return;
    }
    let lane = chunk_lane(group, lid);
    var sums = SumPair(Lanes(0.0), Lanes(0.0));
    if (lane.live) {
        let m = mean[lane.channel];
        let s = inv_std[lane.channel];
        let scale = gamma[lane.channel];
        let shift = beta[lane.channel];
        for (var row = lane.begin + lid.y; row < lane.end; row += ROW_LANES) {
            let i = row * params.channels + lane.channel;
            let xhat = (x[i] - m) * s;
            var g = dy[i];
            if (params.activation != ACTIVATION_NONE) {
                g = activation_grad(g, xhat * scale + shift, params.activation, params.alpha);
            }
            sums = SumPair(sums.a + g, sums.b + g * xhat);
        }
    }
    let total = reduce_lanes(lid, sums);
    if (lid.y == 0u && lane.live) {
        partial_dy[lane.slot] = total.a;
        partial_dy_xhat[lane.slot] = total.b;
    }
}
