// The finiteness check before an optimizer's update (segments.wgsl before
// it). Under a model's loss scale, element i of a segment whose gradient is
// Inf or NaN raises the scaler's overflow flag (word 2 of its state): the
// update skips the step, and the scaler's update (loss_scale_update.wgsl) then
// halves a dynamic scale, or closes the gate where no smaller scale can help.
// Without one such a gradient, and always a loss that is not finite, lowers
// the gate to this step's number at once, so the update and the
// BatchNorm commits of this step, and of every step after it, change nothing
// until the host has read the gate and reset it. Finiteness is judged from
// the bits: comparisons with NaN may be folded away (shared/gpu README).

@group(0) @binding(0) var<storage, read> grads: array<f32>;
@group(0) @binding(1) var<storage, read> segments: array<Segment>;
@group(0) @binding(2) var<storage, read> loss: array<f32>;
@group(0) @binding(3) var<storage, read_write> gate: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> scaler: array<atomic<u32>>;

struct Check {
    len: u32,
    row_stride: u32,
    segment_count: u32,
    // The optimizer's step number (from 1), written into the gate.
    step: u32,
    // 1 where `loss` holds the step's loss, 0 where it is a stand-in.
    has_loss: u32,
    // 1 under a model's loss scale, whose update follows.
    scaled: u32,
}
@group(0) @binding(5) var<uniform> check: Check;

fn finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * check.row_stride;
    if (i == 0u && check.has_loss == 1u && !finite(loss[0])) {
        atomicMin(&gate[0], check.step);
    }
    if (i < check.len) {
        let seg = segment_of(i, check.segment_count);
        if (i < seg.end && !finite(grads[i])) {
            if (check.scaled == 1u) {
                atomicOr(&scaler[2], 1u);
            } else {
                atomicMin(&gate[0], check.step);
            }
        }
    }
}
