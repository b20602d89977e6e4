// dweight, pass 2: sums the split-K slices in a fixed order (bit-identical runs,
// no float atomics) and splits the result into dW[K, C_out] and dbias[C_out].
// Each output's slices are added in SPLIT_LANES lanes, lane l adding slices
// l, l + SPLIT_LANES, ... in order, then a fixed tree adds the lanes. Two ways
// to lay that out, the same sums in the same order (the same bits):
// - lanes (`reduce_slices`): a workgroup takes OUTPUTS consecutive outputs,
//   an invocation per lane of each, the tree in workgroup memory. For few
//   outputs (a few thousand) and many slices (up to a few hundred), where one
//   invocation per output left most of the GPU idle while each walked every
//   slice.
// - columns (`reduce_column`, params.columns = 1): an invocation per output,
//   its lanes and tree in registers. For many outputs and few slices (a wide
//   layer's dW split a few ways), where the lanes' barriers and tree cost more
//   than the loads.
// The entry point comes after this file: dweight_reduce_main.wgsl, or
// dweight_reduce_flip.wgsl, which also writes dinput's flipped filter.

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
    // 1: an invocation per output (`reduce_column`); 0: lanes.
    columns: u32,
}
// `params` is bound by the entry point's file, after its other bindings.

const OUTPUTS: u32 = 32u;
const SPLIT_LANES: u32 = 8u;
var<workgroup> lane_sums: array<f32, OUTPUTS * SPLIT_LANES>;

const REDUCE_WORKGROUP: u32 = OUTPUTS * SPLIT_LANES;

// Writes output `i` (of dW, then dbias) of the reduce.
fn store_output(i: u32, total: f32) {
    let weights = R * S * C_IN * C_OUT;
    if (i < weights) {
        dw[i] = total;
    } else {
        dbias[i - weights] = total;
    }
}

// Output `i` of the reduce in columns mode: the lanes and their tree of
// `reduce_slices`, in registers.
fn reduce_column(i: u32) {
    if (i >= R * S * C_IN * C_OUT + C_OUT) {
        return;
    }
    var lanes: array<f32, SPLIT_LANES>;
    for (var lane = 0u; lane < SPLIT_LANES; lane++) {
        var sum = 0.0;
        for (var z = lane; z < params.splits; z += SPLIT_LANES) {
            sum += partial[z * params.slice_stride + i];
        }
        lanes[lane] = sum;
    }
    for (var width = SPLIT_LANES / 2u; width > 0u; width /= 2u) {
        for (var lane = 0u; lane < width; lane++) {
            lanes[lane] += lanes[lane + width];
        }
    }
    store_output(i, lanes[0]);
}

// Workgroup `group`'s share of the reduce in lanes mode, for its invocation
// `index`. Call from uniform control flow (it has barriers).
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
    store_output(i, lane_sums[index]);
}

// Invocation `index` of workgroup `wid`: its share of the reduce in either
// mode (`row_stride` counts workgroups in lanes mode, invocations in columns
// mode). Call from uniform control flow.
fn reduce(wid: vec3<u32>, index: u32) {
    if (params.columns != 0u) {
        reduce_column(wid.x * REDUCE_WORKGROUP + index + wid.y * params.row_stride);
    } else {
        reduce_slices(wid.x + wid.y * params.row_stride, index);
    }
}
