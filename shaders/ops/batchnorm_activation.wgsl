// The activation a batch-norm kernel fuses (params.activation), numbered as
// src/ops/batchnorm.rs's FusedActivation::code: ReLU decides on the bits
// (relu_bits.wgsl); GELU and SiLU are activation_smooth_common.wgsl's f32
// formulas, per value, so a fused layer computes what the activation layer's
// own kernels compute.

const ACTIVATION_NONE: u32 = 0u;
const ACTIVATION_RELU: u32 = 1u;
const ACTIVATION_GELU: u32 = 2u;
const ACTIVATION_SILU: u32 = 3u;

fn smooth_value(v: f32, activation: u32) -> f32 {
    if (activation == ACTIVATION_SILU) {
        return silu_of(v);
    }
    return gelu_of(v);
}

fn smooth_slope(v: f32, activation: u32) -> f32 {
    if (activation == ACTIVATION_SILU) {
        return silu_slope(v);
    }
    return gelu_slope(v);
}

// normalize's output through the activation.
fn activate(v: Lanes, activation: u32) -> Lanes {
    switch activation {
        case ACTIVATION_RELU: {
            return relu_lanes(v);
        }
        case ACTIVATION_GELU, ACTIVATION_SILU: {
            return smooth_value_lanes(v, activation);
        }
        default: {
            return v;
        }
    }
}
