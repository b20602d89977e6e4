// One SGD step of element i as torch.optim.SGD takes it (dampening 0),
// update_common.wgsl before it:
//   g  = grad / S + l1 * sign(p) + 2 * l2 * p + weight_decay * decay * p
//   b  = momentum * b + g                      (b starts at 0, so b_1 = g)
//   g  = g + momentum * b  (nesterov)   or   g = b   (momentum > 0)
//   p -= lr * lr_mult * g
// with `decay` and `lr_mult` the segment's group multipliers. b is state[i];
// without momentum the state (then one element) is not touched.

@group(0) @binding(5) var<storage, read_write> state: array<f32>;

struct Params {
    len: u32,
    row_stride: u32,
    segment_count: u32,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    nesterov: u32,
}

// Updates element i; false where i lies in the gap after a segment or the
// step is skipped.
fn update(i: u32) -> bool {
    if (skipped()) {
        return false;
    }
    let seg = segment_of(i, step.segment_count);
    if (i >= seg.end) {
        return false;
    }
    let p = params[i];
    var g = true_grad(i, seg, p) + step.weight_decay * seg.decay * p;
    if (step.momentum != 0.0) {
        let b = step.momentum * state[i] + g;
        state[i] = b;
        if (step.nesterov == 1u) {
            g = g + step.momentum * b;
        } else {
            g = b;
        }
    }
    params[i] = p - step.lr * seg.lr * g;
    return true;
}
