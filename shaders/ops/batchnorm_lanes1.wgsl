// One value per invocation of the elementwise batch-norm kernels (the channel
// count does not divide by 4). See batchnorm_lanes4.wgsl.

alias Lanes = f32;
alias LaneBits = u32;
alias LaneMask = bool;

fn relu_lanes(v: Lanes) -> Lanes {
    return select(v, 0.0, is_negative(bitcast<u32>(v)));
}

fn passes_lanes(b: LaneBits) -> LaneMask {
    return is_positive(b);
}

fn smooth_value_lanes(v: Lanes, activation: u32) -> Lanes {
    return smooth_value(v, activation);
}

fn smooth_slope_lanes(v: Lanes, activation: u32) -> Lanes {
    return smooth_slope(v, activation);
}
