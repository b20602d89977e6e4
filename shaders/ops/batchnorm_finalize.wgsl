// Batch norm, pass 2 of every reduction: one workgroup per channel adds that
// channel's chunk partials (two per chunk) — each lane a fixed strided subset in
// order, then a fixed tree — so the result is deterministic and the pass is
// parallel even with thousands of chunks. Then it finishes the statistics:
// mode 0 (moments: partials are (sum, m2 about the chunk's mean)):
//   out_a = mean, out_b = inv_std = 1 / sqrt(M2 / count + eps), where
//   M2 = sum(m2) + sum(n_chunk * (chunk mean - mean)^2) (Chan et al.);
// mode 1: the two plain sums (dbeta, dgamma).
// With `running` (mode 0 only) it also folds the batch statistics into the
// running ones, exactly as batchnorm_running.wgsl does from the stored inv_std:
// new = momentum * running + (1 - momentum) * batch, the batch variance
// recovered as 1 / inv_std^2 - eps and made unbiased. Without it, bindings 4-7
// are stand-ins and not touched.

@group(0) @binding(0) var<storage, read> partial_a: array<f32>;
@group(0) @binding(1) var<storage, read> partial_b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out_a: array<f32>;
@group(0) @binding(3) var<storage, read_write> out_b: array<f32>;
@group(0) @binding(4) var<storage, read> running_mean: array<f32>;
@group(0) @binding(5) var<storage, read> running_var: array<f32>;
@group(0) @binding(6) var<storage, read_write> new_mean: array<f32>;
@group(0) @binding(7) var<storage, read_write> new_var: array<f32>;

struct Params {
    channels: u32,
    chunks: u32,
    rows: u32,
    chunk_rows: u32,
    eps: f32,
    mode: u32,
    // Workgroups per grid row: channel = wid.x + wid.y * row_stride.
    row_stride: u32,
    running: u32,
    momentum: f32,
    unbiased_scale: f32,
}
@group(0) @binding(8) var<uniform> params: Params;

const LANES: u32 = 256u;
var<workgroup> lane_sums: array<vec2<f32>, LANES>;

// The sum of `value` over the workgroup, in a fixed tree; every lane gets it.
// Call from uniform control flow.
fn workgroup_sum(lane: u32, value: vec2<f32>) -> vec2<f32> {
    lane_sums[lane] = value;
    workgroupBarrier();
    for (var width = LANES / 2u; width > 0u; width /= 2u) {
        if (lane < width) {
            lane_sums[lane] += lane_sums[lane + width];
        }
        workgroupBarrier();
    }
    let total = lane_sums[0];
    // Every lane has read the total before `lane_sums` is written again.
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let c = wid.x + wid.y * params.row_stride;
    let live = c < params.channels;
    var sums = vec2(0.0, 0.0);
    if (live) {
        for (var k = lane; k < params.chunks; k += LANES) {
            let i = k * params.channels + c;
            sums += vec2(partial_a[i], partial_b[i]);
        }
    }
    let total = workgroup_sum(lane, sums);
    if (params.mode == 1u) {
        if (lane == 0u && live) {
            out_a[c] = total.x;
            out_b[c] = total.y;
        }
        return;
    }
    let count = f32(params.rows);
    let mean = total.x / count;
    var spread = 0.0;
    if (live) {
        for (var k = lane; k < params.chunks; k += LANES) {
            let n = f32(min(params.chunk_rows, params.rows - k * params.chunk_rows));
            let i = k * params.channels + c;
            let d = partial_a[i] / n - mean;
            spread += partial_b[i] + n * d * d;
        }
    }
    let m2 = workgroup_sum(lane, vec2(spread, 0.0)).x;
    if (lane != 0u || !live) {
        return;
    }
    let inv_std = 1.0 / sqrt(m2 / count + params.eps);
    out_a[c] = mean;
    out_b[c] = inv_std;
    if (params.running != 0u) {
        let batch_var = max(1.0 / (inv_std * inv_std) - params.eps, 0.0) * params.unbiased_scale;
        let keep = params.momentum;
        new_mean[c] = keep * running_mean[c] + (1.0 - keep) * mean;
        new_var[c] = keep * running_var[c] + (1.0 - keep) * batch_var;
    }
}
