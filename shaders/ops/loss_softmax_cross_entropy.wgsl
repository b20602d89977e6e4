// Fused softmax + categorical cross-entropy, one thread per row. With m the row
// maximum at index a and rest = sum_{j != a} exp(x_j - m):
//   loss_row = sum_k t_k (m - x_k) + (sum_k t_k) log1p(rest)    (no cancellation)
//   dlogits_k = (p_k - t_k) / N, and for k = a: ((1 - t_a) - rest / (1 + rest)) / N
// so a confident correct row keeps its (tiny) loss and gradient to a few ULP.
// A label >= K matches no class: its target is s / K everywhere.
// Each row writes loss_row / N; a separate pass sums them in a fixed order.

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> labels: array<u32>;
@group(0) @binding(2) var<storage, read_write> dlogits: array<f32>;
@group(0) @binding(3) var<storage, read_write> row_losses: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

fn input_value(i: u32) -> f32 {
    return logits[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * params.row_stride;
    if (row >= params.rows) {
        return;
    }
    let classes = params.classes;
    let base = row * classes;
    let top = row_max(base, classes);
    let m = top.value;
    var rest = 0.0;
    for (var k = 0u; k < classes; k++) {
        if (k != top.index) {
            let e = exp_of_difference(logits[base + k], m);
            dlogits[base + k] = e; // finished in the next loop
            rest += e;
        }
    }
    let label = labels[row];
    let s = params.smoothing;
    let off_target = s / f32(classes);
    let on_target = (1.0 - s) + off_target;
    let norm = 1.0 / (1.0 + rest);
    let inv_rows = 1.0 / f32(params.rows);
    var weighted_gap = 0.0;
    for (var k = 0u; k < classes; k++) {
        let t = select(off_target, on_target, k == label);
        weighted_gap += t * (m - logits[base + k]);
        var g: f32;
        if (k == top.index) {
            let one_minus_t = select(1.0 - off_target, s - off_target, k == label);
            g = one_minus_t - rest * norm;
        } else {
            g = dlogits[base + k] * norm - t;
        }
        dlogits[base + k] = g * inv_rows;
    }
    let target_total = select(s, 1.0, label < classes);
    row_losses[row] = (weighted_gap + target_total * log1p_accurate(rest)) * inv_rows;
}
