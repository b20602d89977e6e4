// Batch norm, pass 2 of every reduction: one workgroup per channel sums that
// channel's chunk partials — each lane a fixed strided subset in order, then a
// fixed tree — so the result is deterministic and the pass is parallel even
// with thousands of chunks. Then it finishes the statistic:
// mode 0: mean = sum / count; mode 1: inv_std = 1 / sqrt(sum / count + eps);
// mode 2: the plain sum (dgamma, dbeta).

@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

struct Params {
    channels: u32,
    chunks: u32,
    count: u32,
    eps: f32,
    mode: u32,
    // Workgroups per grid row: channel = wid.x + wid.y * row_stride.
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

const LANES: u32 = 256u;
var<workgroup> lane_sums: array<f32, LANES>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let c = wid.x + wid.y * params.row_stride;
    var sum = 0.0;
    if (c < params.channels) {
        for (var k = lane; k < params.chunks; k += LANES) {
            sum += partials[k * params.channels + c];
        }
    }
    lane_sums[lane] = sum;
    workgroupBarrier();
    for (var width = LANES / 2u; width > 0u; width /= 2u) {
        if (lane < width) {
            lane_sums[lane] += lane_sums[lane + width];
        }
        workgroupBarrier();
    }
    if (lane != 0u || c >= params.channels) {
        return;
    }
    let total = lane_sums[0];
    let count = f32(params.count);
    switch params.mode {
        case 0u: {
            out[c] = total / count;
        }
        case 1u: {
            out[c] = 1.0 / sqrt(total / count + params.eps);
        }
        default: {
            out[c] = total;
        }
    }
}
