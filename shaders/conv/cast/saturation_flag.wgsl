// The clipped cast of an output gradient raises the loss scaler's overflow
// flag (word 2) in the pass that writes it, by the test
// optim/saturation_check.wgsl runs on it: f16 bits 0x7bff and up (65504, inf,
// NaN) after the clip, which is f32 above 65488 before it. The model then
// records no check of its own for that gradient. The scaler is bound after
// dst, so the parameters come after it.

@group(0) @binding(2) var<storage, read_write> scaler: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> params: Params;

fn flag_saturation(halves: vec4<u32>) {
    if (f16_at_limit4(halves) || f16_at_limit4(halves >> vec4(16u))) {
        atomicOr(&scaler[2], 1u);
    }
}
