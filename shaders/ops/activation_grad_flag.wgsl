// An activation's f16 dx (activation_grad_f16.wgsl) raises the loss scaler's
// overflow flag (word 2) in the pass that writes it, by the test
// optim/saturation_check.wgsl runs on a stored f16 gradient: f16 bits 0x7bff
// and up (65504, inf, NaN) after the clip, in either half of a word. The
// model then records no check of its own for that gradient. The scaler is
// bound after dx, so the parameters come after it.

@group(0) @binding(3) var<storage, read_write> scaler: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> params: Params;

fn flag_saturation(words: vec4<u32>) {
    if (f16_at_limit4(words) || f16_at_limit4(words >> vec4(16u))) {
        atomicOr(&scaler[2], 1u);
    }
}
