// Backward dx's f16 saturation raises the loss scaler's overflow flag (word 2)
// in the pass that writes it, by the test optim/saturation_check.wgsl runs on a
// stored f16 gradient: f16 bits 0x7bff and up (65504, inf, NaN) after the
// clip. The model then records no check of its own for that gradient. The
// scaler is bound after dx, so the parameters come after it.

@group(0) @binding(9) var<storage, read_write> scaler: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> params: Params;

fn flag_saturation(b: GradBits) {
    if (f16_at_limit4(vec4(b.x, b.x >> 16u, b.y, b.y >> 16u))) {
        atomicOr(&scaler[2], 1u);
    }
}
