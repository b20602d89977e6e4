// Batch norm: shared part of the partial-sum kernels. One workgroup covers
// TILE_CHANNELS channels (local x) of one chunk of `chunk_rows` rows; its ROW_LANES
// row lanes (local y) each sum rows lane, lane + ROW_LANES, ... in order, then a
// fixed tree over the lanes gives the chunk's per-channel partial. The same input
// therefore always gives the same bits (no atomics, no scheduling dependence).

const TILE_CHANNELS: u32 = 16u;
const ROW_LANES: u32 = 16u;

struct ReduceParams {
    channels: u32,
    rows: u32,
    chunk_rows: u32,
    channel_tiles: u32,
    groups: u32,
    group_stride: u32,
    // 1 where a kernel takes its gradient through a fused ReLU (backward sums).
    relu_gate: u32,
}

// Two sums per lane: the backward pass needs sum(dy) and sum(dy * xhat) at once.
var<workgroup> lanes: array<vec2<f32>, 256>;

// The workgroup's flat index in the folded grid (uniform across the workgroup).
fn group_index(wid: vec3<u32>) -> u32 {
    return wid.x + wid.y * params.group_stride;
}

// Sums `value` over the row lanes; the total is valid in row lane 0. Call from
// uniform control flow: every invocation of the workgroup must reach it.
fn reduce_lanes(lid: vec3<u32>, value: vec2<f32>) -> vec2<f32> {
    let slot = lid.y * TILE_CHANNELS + lid.x;
    lanes[slot] = value;
    workgroupBarrier();
    for (var stride = ROW_LANES / 2u; stride > 0u; stride /= 2u) {
        if (lid.y < stride) {
            lanes[slot] += lanes[slot + stride * TILE_CHANNELS];
        }
        workgroupBarrier();
    }
    return lanes[lid.x];
}
