// Global average pool: one workgroup per (n, c) pair. Lane t sums elements
// t, t + 256, ... of the H*W plane in order, then a fixed tree (strides 128 .. 1)
// adds the lanes, so the result is the same bits on every run. The CPU path
// follows the same order.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

struct Params {
    hw: u32,
    c: u32,
    pairs: u32,
    // Workgroups per grid row.
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

const LANES: u32 = 256u;
var<workgroup> partial: array<f32, LANES>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    // Uniform across the workgroup, so the early return keeps barriers uniform.
    let pair = wg.x + wg.y * params.row_stride;
    if (pair >= params.pairs) {
        return;
    }
    let n = pair / params.c;
    let ch = pair % params.c;
    let base = n * params.hw * params.c + ch;
    var sum = 0.0;
    for (var i = lane; i < params.hw; i += LANES) {
        sum += x[base + i * params.c];
    }
    partial[lane] = sum;
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            partial[lane] += partial[lane + stride];
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        y[pair] = partial[0] / f32(params.hw);
    }
}
