// The activation a batch-norm kernel fuses (`activation`, with leaky ReLU's
// slope `alpha`), numbered as src/ops/batchnorm.rs's `activation_words`. The
// forward applies it to the normalized value; the backward takes its gradient
// at that value, recomputed from x as normalize computes it, so nothing of the
// forward's output is kept or read. Each is the activation layer's own
// formula: ReLU on the bits (relu.wgsl, activation_relu_backward.wgsl), leaky
// ReLU as activation_leaky_relu*.wgsl, GELU and SiLU by
// activation_smooth_common.wgsl, per value.

const ACTIVATION_NONE: u32 = 0u;
const ACTIVATION_RELU: u32 = 1u;
const ACTIVATION_GELU: u32 = 2u;
const ACTIVATION_SILU: u32 = 3u;
const ACTIVATION_LEAKY_RELU: u32 = 4u;

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
fn activate(v: Lanes, activation: u32, alpha: f32) -> Lanes {
    switch activation {
        case ACTIVATION_RELU: {
            return relu_lanes(v);
        }
        case ACTIVATION_LEAKY_RELU: {
            return select(alpha * v, v, v > Lanes(0.0));
        }
        case ACTIVATION_GELU, ACTIVATION_SILU: {
            return smooth_value_lanes(v, activation);
        }
        default: {
            return v;
        }
    }
}

// The gradient `g` of the activation's output taken through it, at its input
// `z` (the normalized value): dy where z > 0 for ReLU (on the bits: NaN does
// not pass), alpha * dy elsewhere for leaky ReLU, dy times the slope for GELU
// and SiLU; `g` itself without an activation.
fn activation_grad(g: Lanes, z: Lanes, activation: u32, alpha: f32) -> Lanes {
    switch activation {
        case ACTIVATION_RELU: {
            return select(Lanes(0.0), g, passes_lanes(bitcast<LaneBits>(z)));
        }
        case ACTIVATION_LEAKY_RELU: {
            return select(alpha * g, g, passes_lanes(bitcast<LaneBits>(z)));
        }
        case ACTIVATION_GELU, ACTIVATION_SILU: {
            return g * smooth_slope_lanes(z, activation);
        }
        default: {
            return g;
        }
    }
}
