//! A deterministic, procedurally generated image set: 10 classes of
//! `H x W x 3` images (NHWC, values around [0, 1]) that a small CNN can learn
//! but not trivially. A class is the conjunction of a colour tint (shared by two
//! classes) and a stripe orientation (shared by two classes), so neither colour
//! nor orientation alone identifies it; per image the tint, orientation,
//! stripe frequency, phase, contrast and brightness are jittered and strong
//! pixel noise is added. Made in code: nothing is downloaded.

use crate::{AetherError, Result};

/// `n` images and labels from `seed`; the same arguments give the same data.
/// Sizes whose `n x h x w x 3` values a `Vec` cannot index are an
/// [`AetherError::InvalidShape`], not a panic.
pub fn synthetic_images(n: usize, h: usize, w: usize, seed: u64) -> Result<(Vec<f32>, Vec<u32>)> {
    let values = [n, h, w, 3]
        .into_iter()
        .try_fold(1usize, usize::checked_mul)
        .ok_or_else(|| AetherError::InvalidShape {
            op: "synthetic_images",
            shape: vec![n, h, w, 3],
            reason: "more values than a usize can count".into(),
        })?;
    let mut state = seed ^ 0xa076_1d64_78bd_642f;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut images = Vec::with_capacity(values);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        let class = (next() * 10.0) as u32 % 10;
        let tint_id = (class / 2) as f32;
        let angle = (class % 5) as f32 * std::f32::consts::PI / 5.0 + (next() - 0.5) * 0.4;
        let frequency = 0.25 + 0.2 * next();
        let tint = [
            0.5 + 0.3 * (tint_id * 1.3).sin() + (next() - 0.5) * 0.3,
            0.5 + 0.3 * (tint_id * 2.1 + 1.0).sin() + (next() - 0.5) * 0.3,
            0.5 + 0.3 * (tint_id * 2.9 + 2.0).sin() + (next() - 0.5) * 0.3,
        ];
        let phase = next() * std::f32::consts::TAU;
        let contrast = 0.1 + 0.25 * next();
        let brightness = next() * 0.4 - 0.2;
        let (dx, dy) = (angle.cos(), angle.sin());
        for y in 0..h {
            for x in 0..w {
                let stripe = ((x as f32 * dx + y as f32 * dy) * frequency + phase).sin();
                for tint_c in tint {
                    let noise = (next() - 0.5) * 0.8;
                    images.push(tint_c * 0.5 + contrast * stripe + brightness + noise);
                }
            }
        }
        labels.push(class);
    }
    Ok((images, labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_past_usize_are_an_error_naming_the_shape() {
        let err = synthetic_images(usize::MAX / 2, 2, 2, 1).unwrap_err();
        assert!(
            matches!(&err, AetherError::InvalidShape { op: "synthetic_images", shape, .. }
                if shape == &[usize::MAX / 2, 2, 2, 3]),
            "{err}"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_images_and_another_seed_others() {
        let (x, y) = synthetic_images(5, 3, 4, 9).unwrap();
        assert_eq!((x.len(), y.len()), (5 * 3 * 4 * 3, 5));
        assert_eq!(synthetic_images(5, 3, 4, 9).unwrap(), (x.clone(), y));
        assert_ne!(synthetic_images(5, 3, 4, 10).unwrap().0, x);
    }
}
