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
