// Batch norm backward, pass 1: per chunk of rows, the per-channel partials of
// sum(dy) (-> dbeta) and sum(dy * xhat) (-> dgamma), xhat = (x - mean) * inv_std,
// a `Lanes` of channels per invocation. With params.relu_gate, dy is taken only
// where the fused ReLU's output `relu_y` passes (else `relu_y` is bound to dy and
// not read).

@group(0) @binding(0) var<storage, read> dy: array<Lanes>;
@group(0) @binding(1) var<storage, read> relu_y: array<ActBits>;
@group(0) @binding(2) var<storage, read> x: array<Lanes>;
@group(0) @binding(3) var<storage, read> mean: array<Lanes>;
@group(0) @binding(4) var<storage, read> inv_std: array<Lanes>;
@group(0) @binding(5) var<storage, read_write> partial_dy: array<Lanes>;
@group(0) @binding(6) var<storage, read_write> partial_dy_xhat: array<Lanes>;
@group(0) @binding(7) var<uniform> params: ReduceParams;

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
        for (var row = lane.begin + lid.y; row < lane.end; row += ROW_LANES) {
            let i = row * params.channels + lane.channel;
            var g = dy[i];
            if (params.relu_gate != 0u) {
                g = select(Lanes(0.0), g, act_passes(relu_y[i]));
            }
            sums = SumPair(sums.a + g, sums.b + g * ((x[i] - m) * s));
        }
    }
    let total = reduce_lanes(lid, sums);
    if (lid.y == 0u && lane.live) {
        partial_dy[lane.slot] = total.a;
        partial_dy_xhat[lane.slot] = total.b;
    }
}
