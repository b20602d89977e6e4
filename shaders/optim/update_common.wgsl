// What every fused optimizer update shares (segments.wgsl before it, the
// optimizer's `update` after it): the bindings up to its per-element state,
// the skip rule and the true gradient. Each optimizer's file declares its
// `Params` uniform (len, row_stride and segment_count first) and
// `fn update(i: u32) -> bool` and its per-element state at bindings 5, 6, ...
// (one binding each, so none is longer than the parameters); the entry point
// (step.wgsl or step_f16.wgsl) binds the f16 mirror and the uniform after
// them (optim/packed.rs declares those two).
//
// The gate (finite_check.wgsl) holds 0xffffffff while every step so far was
// finite; the loss scaler's state (optim/scale.rs) holds the scale S as f32
// bits in word 0 and this step's overflow flag in word 2. A closed gate or a
// raised flag skips the update, so parameters and state stay as they were.

@group(0) @binding(0) var<storage, read> grads: array<f32>;
@group(0) @binding(1) var<storage, read_write> params: array<f32>;
@group(0) @binding(2) var<storage, read> segments: array<Segment>;
@group(0) @binding(3) var<storage, read> gate: array<u32>;
@group(0) @binding(4) var<storage, read> scaler: array<u32>;

fn skipped() -> bool {
    return gate[0] != 0xffffffffu || scaler[2] != 0u;
}

// The gradient of element i of `seg` with the loss scale divided out (exact:
// S is a power of two) and the L1/L2 penalties added.
fn true_grad(i: u32, seg: Segment, p: f32) -> f32 {
    let inv_scale = 1.0 / bitcast<f32>(scaler[0]);
    return grads[i] * inv_scale + seg.l1 * sign(p) + 2.0 * seg.l2 * p;
}
