//! Seeded He initialisation: `N(0, 2 / fan_in)` from a SplitMix64 stream, so a
//! model built with the same seed has the same weights on every device.

pub(crate) fn he_normal(len: usize, fan_in: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0x5851_f42d_4c95_7f2d;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        // Uniform in (0, 1]: never 0, so the logarithm below is finite.
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 + f64::EPSILON
    };
    let std = (2.0 / fan_in.max(1) as f64).sqrt();
    (0..len)
        .map(|_| {
            // Box-Muller.
            let (u, v) = (next(), next());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos() * std) as f32
        })
        .collect()
}

/// Sets the first `min(c_in, c_out)` filters of an `[R, S, C_in, C_out]`
/// kernel to the identity (1 at the centre tap of their own channel, 0
/// elsewhere), leaving the others: PyTorch's `dirac_(w[:c_in])`, which
/// airbench uses to start each conv as an implicit residual.
pub(crate) fn dirac_leading_filters(kernel: &mut [f32], [r, s, c_in, c_out]: [usize; 4]) {
    let (cr, cs) = (r / 2, s / 2);
    for o in 0..c_in.min(c_out) {
        for rr in 0..r {
            for ss in 0..s {
                for i in 0..c_in {
                    let centre = (rr, ss, i) == (cr, cs, o);
                    kernel[((rr * s + ss) * c_in + i) * c_out + o] = f32::from(u8::from(centre));
                }
            }
        }
    }
}
