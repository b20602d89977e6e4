// Batch norm forward, pass 1: per chunk of rows, each channel's sum and the sum
// of squared deviations from the chunk's own mean (partials[chunk, c] = (sum,
// m2)), a `Lanes` of channels per invocation. The finalize pass merges the
// chunks exactly (Chan et al.): deviations, never E[x^2] - E[x]^2, which cancels
// catastrophically when the data has an offset. The chunk is read twice; the
// second read comes from cache.

@group(0) @binding(0) var<storage, read> x: array<Lanes>;
@group(0) @binding(1) var<storage, read_write> partial_sum: array<Lanes>;
@group(0) @binding(2) var<storage, read_write> partial_m2: array<Lanes>;
@group(0) @binding(3) var<uniform> params: ReduceParams;

@compute @workgroup_size(TILE_LANES, ROW_LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let group = group_index(wid);
    if (group >= params.groups) {
        return;
    }
    let lane = chunk_lane(group, lid);
    var sum = Lanes(0.0);
    if (lane.live) {
        for (var row = lane.begin + lid.y; row < lane.end; row += ROW_LANES) {
            sum += x[row * params.channels + lane.channel];
        }
    }
    let total = reduce_lanes(lid, SumPair(sum, Lanes(0.0))).a;
    // Every lane has read its total before the second reduction reuses `lanes`.
    workgroupBarrier();
    let chunk_mean = total / f32(lane.end - lane.begin);
    var m2 = Lanes(0.0);
    if (lane.live) {
        for (var row = lane.begin + lid.y; row < lane.end; row += ROW_LANES) {
            let d = x[row * params.channels + lane.channel] - chunk_mean;
            m2 += d * d;
        }
    }
    let total_m2 = reduce_lanes(lid, SumPair(m2, Lanes(0.0))).a;
    if (lid.y == 0u && lane.live) {
        partial_sum[lane.slot] = total;
        partial_m2[lane.slot] = total_m2;
    }
}
