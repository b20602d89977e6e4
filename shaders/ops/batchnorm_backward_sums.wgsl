// Batch norm backward, pass 1: per chunk of rows, the per-channel partials of
// sum(dy) (-> dbeta) and sum(dy * xhat) (-> dgamma), xhat = (x - mean) * inv_std.
// With params.relu_gate, dy is taken only where the fused ReLU's output
// `relu_y` passes (else `relu_y` is bound to dy and not read).

@group(0) @binding(0) var<storage, read> dy: array<f32>;
@group(0) @binding(1) var<storage, read> relu_y: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> mean: array<f32>;
@group(0) @binding(4) var<storage, read> inv_std: array<f32>;
@group(0) @binding(5) var<storage, read_write> partial_dy: array<f32>;
@group(0) @binding(6) var<storage, read_write> partial_dy_xhat: array<f32>;
@group(0) @binding(7) var<uniform> params: ReduceParams;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let group = group_index(wid);
    if (group >= params.groups) {
        return;
    }
    let lane = chunk_lane(group, lid);
    var sums = vec2(0.0, 0.0);
    if (lane.live) {
        let m = mean[lane.channel];
        let s = inv_std[lane.channel];
        for (var row = lane.begin + lid.y; row < lane.end; row += ROW_LANES) {
            let i = row * params.channels + lane.channel;
            var g = dy[i];
            if (params.relu_gate != 0u && !is_positive(relu_y[i])) {
                g = 0.0;
            }
            sums += vec2(g, g * ((x[i] - m) * s));
        }
    }
    let total = reduce_lanes(lid, sums);
    if (lid.y == 0u && lane.live) {
        partial_dy[lane.slot] = total.x;
        partial_dy_xhat[lane.slot] = total.y;
    }
}
