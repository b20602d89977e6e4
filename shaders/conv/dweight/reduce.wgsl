// dweight, pass 2: sums the split-K slices in a fixed order (bit-identical runs,
// no float atomics) and splits the result into dW[K, C_out] and dbias[C_out].
// A workgroup takes OUTPUTS consecutive outputs with SPLIT_LANES lanes each:
// lane l adds slices l, l + SPLIT_LANES, ... in order, then a fixed tree adds
// the lanes. The outputs are few (a few thousand) and the slices many (up to a
// few hundred), so one invocation per output left most of the GPU idle while
// each walked every slice. The entry point comes after this file:
// dweight_reduce_main.wgsl, or dweight_reduce_flip.wgsl, which also writes
// dinput's flipped filter.

@group(0) @binding(0) var<storage, read> partial: array<f32>;
@group(0) @binding(1) var<storage, read_write> dw: array<f32>;
@group(0) @binding(2) var<storage, read_write> dbias: array<f32>;

struct Params {
    splits: u32,
    // Workgroups per grid row.
    row_stride: u32,
    // Values from one slice to the next: K + 1 rows of C_OUT, or more (the
    // halo kernel's dbias tiles), of which the first K + 1 rows are read.
    slice_stride: u32,
}
// `params` is bound by the entry point's file, after its other bindings.

const OUTPUTS: u32 = 32u;
const SPLIT_LANES: u32 = 8u;
var<workgroup> lane_sums: array<f32, OUTPUTS * SPLIT_LANES>;

const REDUCE_WORKGROUP: u32 = OUTPUTS * SPLIT_LANES;

// Workgroup `group`'s share of the reduce, for its invocation `index`. Call
// from uniform control flow (it has barriers).
fn reduce_slices(group: u32, index: u32) {
    // Adjacent invocations take adjacent outputs of one slice: coalesced reads.
    let column = index % OUTPUTS;
    let lane = index / OUTPUTS;
    let i = group * OUTPUTS + column;
    let weights = R * S * C_IN * C_OUT;
    let per_slice = weights + C_OUT;
    var sum = 0.0;
    if (i < per_slice) {
        for (var z = lane; z < params.splits; z += SPLIT_LANES) {
            sum += partial[z * params.slice_stride + i];
        }
    }
    lane_sums[index] = sum;
    workgroupBarrier();
    for (var width = SPLIT_LANES / 2u; width > 0u; width /= 2u) {
        if (lane < width) {
            lane_sums[index] += lane_sums[index + width * OUTPUTS];
        }
        workgroupBarrier();
    }
    if (lane != 0u || i >= per_slice) {
        return;
    }
    let total = lane_sums[index];
    if (i < weights) {
        dw[i] = total;
    } else {
        dbias[i - weights] = total;
    }
}
