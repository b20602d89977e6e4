// Four values per invocation of the batch-norm kernels (normalize, backward dx
// and the two partial-sum kernels), where the channel count divides by 4: one
// 16-byte load per tensor and one channel index (an integer division) per 4
// values, 4 consecutive channels of one row, so per-channel vectors are read
// as vec4 too. The kernels are written once against `Lanes`;
// batchnorm_lanes1.wgsl is the one-value version. ReLU's decisions stay per
// value, on the bits, and the smooth activations' formulas per value
// (batchnorm_activation.wgsl).

alias Lanes = vec4<f32>;
alias LaneBits = vec4<u32>;
alias LaneMask = vec4<bool>;

fn relu_lanes(v: Lanes) -> Lanes {
    let b = bitcast<vec4<u32>>(v);
    let negative = vec4(is_negative(b.x), is_negative(b.y), is_negative(b.z), is_negative(b.w));
    return select(v, Lanes(0.0), negative);
}

fn passes_lanes(b: LaneBits) -> LaneMask {
    return vec4(is_positive(b.x), is_positive(b.y), is_positive(b.z), is_positive(b.w));
}

fn smooth_value_lanes(v: Lanes, activation: u32) -> Lanes {
    return vec4(
        smooth_value(v.x, activation),
        smooth_value(v.y, activation),
        smooth_value(v.z, activation),
        smooth_value(v.w, activation),
    );
}

fn smooth_slope_lanes(v: Lanes, activation: u32) -> Lanes {
    return vec4(
        smooth_slope(v.x, activation),
        smooth_slope(v.y, activation),
        smooth_slope(v.z, activation),
        smooth_slope(v.w, activation),
    );
}
