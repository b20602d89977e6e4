//! Test-time augmentation: a model's logits averaged over transformed views
//! of each image, as airbench evaluates (its `tta_level` 1 and 2).

use crate::error::{AetherError, Result};
use crate::model::Model;

/// Which views [`Model::predict_tta`] averages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tta {
    /// The image alone (plain logits).
    None,
    /// The image and its left-right mirror, equally weighted.
    Mirror,
    /// Half [`Tta::Mirror`] of the image, half the mean of [`Tta::Mirror`]
    /// of the image translated by one pixel up-left and down-right (its edge
    /// reflected, as PyTorch's `reflect` padding does).
    MirrorTranslate,
}

impl Model {
    /// Logits (`[n, classes]` flattened) averaged over the views of `tta`,
    /// for NHWC images of the model's input shape.
    pub fn predict_tta(&mut self, x: &[f32], batch_size: usize, tta: Tta) -> Result<Vec<f32>> {
        let [h, w, c] = match *self.input_shape()? {
            [h, w, c] => [h, w, c],
            ref other => {
                return Err(AetherError::Model(format!(
                    "test-time augmentation takes images (H, W, C), the model's input is {other:?}"
                )));
            }
        };
        let mirror = |model: &mut Model, x: &[f32]| -> Result<Vec<f32>> {
            let straight = model.predict(x, batch_size, true)?;
            let flipped = model.predict(&flip(x, [h, w, c]), batch_size, true)?;
            Ok(mean(&[&straight, &flipped]))
        };
        match tta {
            Tta::None => self.predict(x, batch_size, true),
            Tta::Mirror => mirror(self, x),
            Tta::MirrorTranslate => {
                let centre = mirror(self, x)?;
                let up = mirror(self, &translate(x, [h, w, c], -1))?;
                let down = mirror(self, &translate(x, [h, w, c], 1))?;
                Ok(mean(&[&centre, &mean(&[&up, &down])]))
            }
        }
    }

    /// The share of `(x, y)` whose [`Model::predict_tta`] logits are largest
    /// at the label.
    pub fn accuracy_tta(
        &mut self,
        x: &[f32],
        y: &[u32],
        batch_size: usize,
        tta: Tta,
    ) -> Result<f32> {
        let per_sample: usize = self.input_shape()?.iter().product();
        if y.is_empty() || x.len() != y.len() * per_sample {
            return Err(AetherError::Model(format!(
                "{} labels for {} input values of {per_sample} a sample",
                y.len(),
                x.len()
            )));
        }
        let logits = self.predict_tta(x, batch_size, tta)?;
        let classes = logits.len() / y.len();
        let correct = logits
            .chunks_exact(classes)
            .zip(y)
            .filter(|(row, label)| {
                let best = (0..classes).fold(0, |b, k| if row[k] > row[b] { k } else { b });
                best == **label as usize
            })
            .count();
        Ok(correct as f32 / y.len() as f32)
    }
}

/// The elementwise mean of equally long vectors.
fn mean(parts: &[&[f32]]) -> Vec<f32> {
    (0..parts[0].len())
        .map(|i| parts.iter().map(|p| p[i]).sum::<f32>() / parts.len() as f32)
        .collect()
}

/// Every NHWC image of `x` mirrored left-right.
fn flip(x: &[f32], [h, w, c]: [usize; 3]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for image in x.chunks_exact(h * w * c) {
        for row in image.chunks_exact(w * c) {
            for pixel in row.chunks_exact(c).rev() {
                out.extend_from_slice(pixel);
            }
        }
    }
    out
}

/// Every image of `x` sampled at `(y + shift, x + shift)`, reflecting at the
/// edges (index -1 reads 1, index n reads n - 2).
fn translate(x: &[f32], [h, w, c]: [usize; 3], shift: isize) -> Vec<f32> {
    let reflect = |i: isize, n: usize| -> usize {
        let n = n as isize;
        let i = if i < 0 { -i } else { i };
        (if i >= n { 2 * n - 2 - i } else { i }).clamp(0, n - 1) as usize
    };
    let mut out = Vec::with_capacity(x.len());
    for image in x.chunks_exact(h * w * c) {
        for yy in 0..h {
            let sy = reflect(yy as isize + shift, h);
            for xx in 0..w {
                let sx = reflect(xx as isize + shift, w);
                let at = (sy * w + sx) * c;
                out.extend_from_slice(&image[at..at + c]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{flip, translate};

    #[test]
    fn views_move_pixels_as_stated() {
        // One 3x4 image of 2 channels: value = 10 * pixel + channel.
        let (h, w, c) = (3, 4, 2);
        let x: Vec<f32> = (0..h * w)
            .flat_map(|p| (0..c).map(move |ch| (10 * p + ch) as f32))
            .collect();
        let f = flip(&x, [h, w, c]);
        assert_eq!(&f[..4], &[30.0, 31.0, 20.0, 21.0]);
        let down = translate(&x, [h, w, c], 1);
        // Output (0, 0) reads (1, 1); output (2, 3) reads (3 -> 1, 4 -> 2).
        assert_eq!(down[0], 50.0);
        assert_eq!(down[(2 * w + 3) * c], 60.0);
        let up = translate(&x, [h, w, c], -1);
        // Output (0, 0) reads (-1 -> 1, -1 -> 1).
        assert_eq!(up[0], 50.0);
        assert_eq!(up[(w + 1) * c + 1], 1.0);
    }
}
