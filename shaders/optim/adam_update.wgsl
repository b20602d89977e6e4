// One Adam / AdamW step over every parameter of a model, packed into flat
// buffers and updated in place. Each parameter tensor is a segment with its own
// L1/L2 regularization and a flag excluding it from weight decay (BatchNorm).
//   g  = grad + l1 * sign(p) + 2 * l2 * p
//   m  = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g^2
//   p -= decay_lr * p                         (AdamW: lr * weight_decay; Adam: 0)
//   p -= lr_t * m / (sqrt(v) + eps)           (lr_t carries the bias correction)
// The gate (finite_check.wgsl) holds 0xffffffff while every step so far was
// finite; any other value skips the update, so a step with a non-finite loss
// or gradient, and every step after it, leaves parameters and moments as they
// were. The entry points (adam.wgsl, adam_f16.wgsl) declare the bindings
// after these six: the uniform `step`, and in adam_f16.wgsl the f16 mirror
// before it.

@group(0) @binding(0) var<storage, read> grads: array<f32>;
@group(0) @binding(1) var<storage, read_write> params: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read> segments: array<Segment>;
@group(0) @binding(5) var<storage, read> gate: array<u32>;

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
// start at aligned offsets), which belongs to no parameter, or the gate is
// closed.
fn update(i: u32) -> bool {
    if (gate[0] != 0xffffffffu) {
        return false;
    }
    let seg = segment_of(i, step.segment_count);
    if (i >= seg.end) {
        return false;
    }
    var p = params[i];
    let g = grads[i] + seg.l1 * sign(p) + 2.0 * seg.l2 * p;
    let m_new = step.beta1 * m[i] + (1.0 - step.beta1) * g;
    let v_new = step.beta2 * v[i] + (1.0 - step.beta2) * g * g;
    m[i] = m_new;
    v[i] = v_new;
    if (seg.decays == 1u) {
        p = p - step.decay_lr * p;
    }
    params[i] = p - step.lr_t * m_new / (sqrt(v_new) + step.eps);
    return true;
}
