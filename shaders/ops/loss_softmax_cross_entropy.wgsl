// Fused softmax + categorical cross-entropy, one thread per row. With m the row
// maximum at index a and rest = sum_{j != a} exp(x_j - m):
//   loss_row = sum_k t_k (m - x_k) + (sum_k t_k) log1p(rest)    (no cancellation)
//   dlogits_k = (p_k - t_k) / N, and for k = a: ((1 - t_a) - rest / (1 + rest)) / N
// so a confident correct row keeps its (tiny) loss and gradient to a few ULP.
// A label >= K matches no class: its target is s / K everywhere.
// Each row writes loss_row / N (loss_softmax_cross_entropy_row.wgsl, prepended,
// with the logits, labels and dlogits bindings); a separate pass sums them in a
// fixed order.

@group(0) @binding(3) var<storage, read_write> row_losses: array<f32>;
@group(0) @binding(4) var<storage, read> scale_state: array<u32>;
@group(0) @binding(5) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * params.row_stride;
    if (row >= params.rows) {
        return;
    }
    row_losses[row] = softmax_cross_entropy_row(row).loss;
}
