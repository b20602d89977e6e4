// The fused softmax + cross-entropy of up to 256 rows with both of a training
// step's sums, in one workgroup: the loss (the row losses added by
// loss_sum.wgsl's tree, so the same bits) and the count of correct rows
// (loss_correct.wgsl's rule), with each row's dlogits. Three dispatches fewer
// than the row kernel, the correct kernel and their two sums
// (docs/lab/perf-notes.md, entry 72). loss_softmax_cross_entropy_row.wgsl is
// prepended, with the logits, labels and dlogits bindings.

@group(0) @binding(3) var<storage, read_write> loss: array<f32>;
@group(0) @binding(4) var<storage, read_write> correct: array<u32>;
@group(0) @binding(5) var<storage, read> scale_state: array<u32>;
@group(0) @binding(6) var<uniform> params: Params;

const ROWS: u32 = 256u;
var<workgroup> losses: array<f32, ROWS>;
var<workgroup> hits: array<u32, ROWS>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) row: u32) {
    var row_loss = 0.0;
    var hit = 0u;
    if (row < params.rows) {
        let r = softmax_cross_entropy_row(row);
        row_loss = r.loss;
        hit = select(0u, 1u, r.top == labels[row]);
    }
    losses[row] = row_loss;
    hits[row] = hit;
    for (var stride = ROWS / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (row < stride) {
            losses[row] += losses[row + stride];
            hits[row] += hits[row + stride];
        }
    }
    if (row == 0u) {
        loss[0] = losses[0];
        correct[0] = hits[0];
    }
}
