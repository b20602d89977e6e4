// Batch norm forward, pass 1: per chunk of rows, each channel's sum and the sum
// of squared deviations from the chunk's own mean (partials[chunk, c] = (sum,
// m2)), a `Lanes` of channels per invocation. The finalize pass merges the
// chunks exactly (Chan et al.): deviations, never E[x^2] - E[x]^2, which cancels
// catastrophically when the data has an offset. Each lane reads its rows of the
// chunk once, into registers, for both sums.

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
    var values: array<Lanes, ROWS_PER_LANE>;
    var sum = Lanes(0.0);
    for (var k = 0u; k < ROWS_PER_LANE; k++) {
        let row = lane.begin + lid.y + k * ROW_LANES;
        values[k] = Lanes(0.0);
        if (lane.live && row < lane.end) {
            values[k] = x[row * params.channels + lane.channel];
        }
    }
    for (var k = 0u; k < ROWS_PER_LANE; k++) {
        sum += values[k];
    }
    let total = reduce_lanes(lid, SumPair(sum, Lanes(0.0))).a;
    // Every lane has read its total before the second reduction reuses `lanes`.
    workgroupBarrier();
    let chunk_mean = total / f32(lane.end - lane.begin);
    var m2 = Lanes(0.0);
    for (var k = 0u; k < ROWS_PER_LANE; k++) {
        let d = values[k] - chunk_mean;
        let row = lane.begin + lid.y + k * ROW_LANES;
        m2 += select(Lanes(0.0), d * d, lane.live && row < lane.end);
    }
    let total_m2 = reduce_lanes(lid, SumPair(m2, Lanes(0.0))).a;
    if (lid.y == 0u && lane.live) {
        partial_sum[lane.slot] = total;
        partial_m2[lane.slot] = total_m2;
    }
}
