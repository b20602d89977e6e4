// GELU (exact, erf form) and SiLU, shared by their forward and backward
// kernels. The formulas are the CPU path's (src/ops/activation.rs), evaluated
// in f32 in the same order: erf by Abramowitz & Stegun 7.1.26 (|error| <
// 1.5e-7), sigmoid as 1 / (1 + exp(-x)). A NaN x gives NaN.

const FRAC_1_SQRT_2: f32 = 0.70710678118654752;
const FRAC_1_SQRT_2PI: f32 = 0.39894228040143268;

fn erf_approx(v: f32) -> f32 {
    let a = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let e = 1.0 - poly * exp(-a * a);
    return select(e, -e, v < 0.0);
}

fn gelu_of(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_approx(v * FRAC_1_SQRT_2));
}

fn gelu_slope(v: f32) -> f32 {
    let cdf = 0.5 * (1.0 + erf_approx(v * FRAC_1_SQRT_2));
    return cdf + v * FRAC_1_SQRT_2PI * exp(-0.5 * v * v);
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

fn silu_of(v: f32) -> f32 {
    return v * sigmoid(v);
}

fn silu_slope(v: f32) -> f32 {
    let s = sigmoid(v);
    return s * (1.0 + v * (1.0 - s));
}
