// The fused softmax + categorical cross-entropy of one row (see
// loss_softmax_cross_entropy.wgsl): writes the row's dlogits and returns its
// loss divided by N, with the index of its maximum (the first on ties, as
// loss_correct.wgsl takes it). Both kernels it is prepended to bind logits,
// labels and dlogits as here; each declares its own outputs after them, then
// `scale_state` and `params` last. The gradient is multiplied by the loss
// scale S (optim/scale.rs) where SCALED is 1: word 0 of `scale_state` as f32
// bits, a power of two, so dlogits is exactly S times the unscaled gradient.

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> labels: array<u32>;
@group(0) @binding(2) var<storage, read_write> dlogits: array<f32>;

override SCALED: u32 = 0u;

fn loss_scale() -> f32 {
    if (SCALED == 0u) {
        return 1.0;
    }
    return bitcast<f32>(scale_state[0]);
}

fn input_value(i: u32) -> f32 {
    return logits[i];
}

struct RowLoss {
    loss: f32,
    top: u32,
}

fn softmax_cross_entropy_row(row: u32) -> RowLoss {
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
    let grad_scale = loss_scale();
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
        dlogits[base + k] = (g * inv_rows) * grad_scale;
    }
    let target_total = select(s, 1.0, label < classes);
    return RowLoss((weighted_gap + target_total * log1p_accurate(rest)) * inv_rows, top.index);
}
