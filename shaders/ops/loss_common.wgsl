// Shared by the loss kernels (prepended to each): the row-kernel parameters and
// exp/log helpers accurate to a few ULP where the builtins are not.
//
// The loss of a confident, correct prediction is log1p(sum of exp(x_j - max)
// over the other classes): a tiny number whose relative accuracy is that of
// those exponentials. The builtin exp only promises 3 + 2|x| ULP (drivers
// compute exp2(x * log2e), losing |x| * 2^-24 in the argument), and x - max
// itself rounds by up to |x - max| * 2^-24. So both operands are range-reduced
// separately (Cody-Waite, exact for |x| < 16384) before subtracting. Likewise the
// builtin log only promises an absolute 2^-21 on [0.5, 2], useless for the log
// of a probability near 1, so that range goes through an atanh series.

struct Params {
    rows: u32,
    classes: u32,
    row_stride: u32,
    smoothing: f32,
}

const LOG2E: f32 = 1.4426950408889634;
// ln 2 split so that k * LN2_HI is exact for |k| < 2^15.
const LN2_HI: f32 = 0.693359375;
const LN2_LO: f32 = -2.12194440e-4;

// (k, r) with x = k ln2 + r and |r| <= ln2 / 2 (plus a hair); r is exact to
// about 1e-9 for |x| <= 80.
fn reduce_by_ln2(x: f32) -> vec2<f32> {
    let k = round(x * LOG2E);
    return vec2<f32>(k, (x - k * LN2_HI) - k * LN2_LO);
}

// exp(r) for |r| <= 0.36: Taylor series to r^7, truncation below 1e-8 relative.
fn exp_near_zero(r: f32) -> f32 {
    return 1.0 + r * (1.0 + r * (1.0 / 2.0 + r * (1.0 / 6.0 + r * (1.0 / 24.0
        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
}

// exp(x - m) for x <= m (m the row maximum), without rounding x - m first.
fn exp_of_difference(x: f32, m: f32) -> f32 {
    let direct = x - m;
    if (direct < -104.0) {
        return 0.0; // below half the smallest subnormal
    }
    if (max(abs(x), abs(m)) >= 16384.0) {
        return exp(direct); // the reduction is no longer exact out here
    }
    let rx = reduce_by_ln2(x);
    let rm = reduce_by_ln2(m);
    // |rx.r - rm.r| <= ln2: reduce once more so the series stays short.
    let rd = reduce_by_ln2(rx.y - rm.y);
    return ldexp(exp_near_zero(rd.y), i32(rx.x - rm.x + rd.x));
}

// log(1 + u) for u >= -0.5: 2 atanh(u / (2 + u)) by its series where u <= 1
// (|z| <= 1/3, truncation below 2e-9 relative), the builtin log beyond (where
// log(1 + u) > ln 2 and its relative error is a few ULP).
fn log1p_accurate(u: f32) -> f32 {
    if (u > 1.0) {
        return log(1.0 + u);
    }
    let z = u / (2.0 + u);
    let z2 = z * z;
    return 2.0 * z * (1.0 + z2 * (1.0 / 3.0 + z2 * (1.0 / 5.0 + z2 * (1.0 / 7.0
        + z2 * (1.0 / 9.0 + z2 * (1.0 / 11.0 + z2 * (1.0 / 13.0 + z2 * (1.0 / 15.0))))))));
}

// log(p) for p in (0, 1]: p - 1 is exact for p >= 0.5 (Sterbenz).
fn log_probability(p: f32) -> f32 {
    if (p >= 0.5) {
        return log1p_accurate(p - 1.0);
    }
    return log(p);
}

struct RowMax {
    index: u32,
    value: f32,
}

// The first index of the row maximum and that maximum (a NaN never replaces it).
// Each kernel defines `input_value(i)`, element i of its [N, K] operand.
fn row_max(row_base: u32, classes: u32) -> RowMax {
    var best = RowMax(0u, input_value(row_base));
    for (var k = 1u; k < classes; k++) {
        let v = input_value(row_base + k);
        if (v > best.value) {
            best = RowMax(k, v);
        }
    }
    return best;
}
