// Global average pool: each workgroup takes PLANES_PER_GROUP (n, c) pairs with
// PLANE_LANES lanes each. Lane t of a pair sums elements t, t + PLANE_LANES, ...
// of its H*W plane in order, then a fixed tree (strides PLANE_LANES / 2 .. 1)
// adds the lanes, so the result is the same bits on every run. The CPU path
// follows the same order. Few lanes per pair, because the planes of a CNN head
// are small (16 values in the v1 model): a workgroup per pair left most lanes idle.
//
// A lane's loop is cut into dispatches of at most LANE_ITERATIONS each, the
// running sum carried between them in `carry` in the same order: lavapipe
// (llvmpipe) stops every invocation after 65535 loop iterations in all, and
// returned 0.125 for a plane of 2^20 ones (see src/ops/pool.rs).

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> carry: array<f32>;

struct Params {
    hw: u32,
    c: u32,
    pairs: u32,
    // Workgroups per grid row.
    row_stride: u32,
    // This dispatch's elements of each plane: [first, end); first is a
    // multiple of PLANE_LANES, 0 for the first dispatch.
    first: u32,
    end: u32,
    // 1 for the last dispatch, which adds the lanes and writes y.
    last: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

const PLANE_LANES: u32 = 16u;
const PLANES_PER_GROUP: u32 = 16u;
var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) index: u32,
) {
    let lane = index % PLANE_LANES;
    let pair = (wg.x + wg.y * params.row_stride) * PLANES_PER_GROUP + index / PLANE_LANES;
    var sum = 0.0;
    if (pair < params.pairs) {
        let slot = pair * PLANE_LANES + lane;
        if (params.first > 0u) {
            sum = carry[slot];
        }
        let base = (pair / params.c) * params.hw * params.c + pair % params.c;
        for (var i = params.first + lane; i < params.end; i += PLANE_LANES) {
            sum += x[base + i * params.c];
        }
        if (params.last == 0u) {
            carry[slot] = sum;
        }
    }
    if (params.last == 0u) {
        return;
    }
    partial[index] = sum;
    workgroupBarrier();
    for (var stride = PLANE_LANES / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            partial[index] += partial[index + stride];
        }
        workgroupBarrier();
    }
    if (lane == 0u && pair < params.pairs) {
        y[pair] = partial[index] / f32(params.hw);
    }
}
