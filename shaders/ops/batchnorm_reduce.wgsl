// Batch norm: shared part of the partial-sum kernels, written against `Lanes`
// (batchnorm_lanes*.wgsl): each invocation sums a `Lanes` of consecutive
// channels, and `channels` counts lanes. One workgroup covers TILE_LANES lanes
// (local x) of one chunk of `chunk_rows` rows; its ROW_LANES row lanes (local y)
// each sum rows lane, lane + ROW_LANES, ... in order, then a fixed tree over the
// row lanes gives the chunk's per-channel partial. A channel's sums therefore
// do not depend on the lane width, and the same input always gives the same
// bits (no atomics, no scheduling dependence).

const TILE_LANES: u32 = 8u;
const ROW_LANES: u32 = 32u;
// Rows of a chunk each row lane takes: CHUNK_ROWS / ROW_LANES (src/ops/batchnorm.rs
// checks). The moments kernel loads them in a loop of this constant count, so
// they are issued together and stay in registers for its second sum (rows
// past the chunk's `end` are skipped). The backward sums loop over the rows
// as they come: holding three operands' rows in registers measured slower
// there (docs/lab/perf-notes.md, entry 87).
const ROWS_PER_LANE: u32 = 8u;

struct ReduceParams {
    channels: u32,
    rows: u32,
    chunk_rows: u32,
    channel_tiles: u32,
    groups: u32,
    group_stride: u32,
    // The fused activation the backward sums take the gradient through, and
    // leaky ReLU's slope (batchnorm_activation.wgsl); 0 elsewhere.
    activation: u32,
    alpha: f32,
}

// Two sums per invocation: the backward pass needs sum(dy) and sum(dy * xhat) at once.
struct SumPair {
    a: Lanes,
    b: Lanes,
}

var<workgroup> lanes: array<SumPair, 256>;

// The workgroup's flat index in the folded grid (uniform across the workgroup).
fn group_index(wid: vec3<u32>) -> u32 {
    return wid.x + wid.y * params.group_stride;
}

// What one invocation of a partial-sum kernel covers: its channel lane, the
// rows [begin, end) of its chunk, and the slot of the chunk's partial in
// `partials[chunk, channel]`. `live` is false for lanes past the last channel.
struct ChunkLane {
    channel: u32,
    begin: u32,
    end: u32,
    slot: u32,
    live: bool,
}

fn chunk_lane(group: u32, lid: vec3<u32>) -> ChunkLane {
    let channel = (group % params.channel_tiles) * TILE_LANES + lid.x;
    let chunk = group / params.channel_tiles;
    let begin = chunk * params.chunk_rows;
    let end = min(begin + params.chunk_rows, params.rows);
    let live = channel < params.channels;
    return ChunkLane(channel, begin, end, chunk * params.channels + channel, live);
}

// Sums `value` over the row lanes; the total is valid in row lane 0. Call from
// uniform control flow: every invocation of the workgroup must reach it.
fn reduce_lanes(lid: vec3<u32>, value: SumPair) -> SumPair {
    let slot = lid.y * TILE_LANES + lid.x;
    lanes[slot] = value;
    workgroupBarrier();
    for (var stride = ROW_LANES / 2u; stride > 0u; stride /= 2u) {
        if (lid.y < stride) {
            let other = lanes[slot + stride * TILE_LANES];
            lanes[slot] = SumPair(lanes[slot].a + other.a, lanes[slot].b + other.b);
        }
        workgroupBarrier();
    }
    return lanes[lid.x];
}
