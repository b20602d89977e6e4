// One Adam / AdamW step of element i (update_common.wgsl before it):
//   g  = grad / S + l1 * sign(p) + 2 * l2 * p
//   m  = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g^2
//   p -= decay_lr * lr * decay * p             (AdamW: lr * weight_decay; Adam: 0)
//   p -= lr_t * lr * m / (sqrt(v) + eps)       (lr_t carries the bias correction)
// with `decay` and `lr` the segment's group multipliers (the decay scales
// with the group's rate, as PyTorch's AdamW takes its group's lr).

@group(0) @binding(5) var<storage, read_write> m: array<f32>;
@group(0) @binding(6) var<storage, read_write> v: array<f32>;

struct Params {
    len: u32,
    row_stride: u32,
    segment_count: u32,
    lr_t: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    decay_lr: f32,
}

// Updates element i; false where i lies in the gap after a segment (segments
// start at aligned offsets), which belongs to no parameter, or the step is
// skipped.
fn update(i: u32) -> bool {
    if (skipped()) {
        return false;
    }
    let seg = segment_of(i, step.segment_count);
    if (i >= seg.end) {
        return false;
    }
    var p = params[i];
    let g = true_grad(i, seg, p);
    let m_new = step.beta1 * m[i] + (1.0 - step.beta1) * g;
    let v_new = step.beta2 * v[i] + (1.0 - step.beta2) * g * g;
    m[i] = m_new;
    v[i] = v_new;
    p = p - step.decay_lr * seg.lr * seg.decay * p;
    params[i] = p - step.lr_t * seg.lr * m_new / (sqrt(v_new) + step.eps);
    return true;
}
