//! airbench's whitening initialisation: a first conv whose filters are the
//! eigenvectors of the covariance of the training images' patches, scaled by
//! the inverse square root of their eigenvalues, and their negatives (so a
//! GELU after it keeps both signs of every whitened component).

use crate::error::{AetherError, Result};

/// Eigenvalues below this (plus the eigenvalue) are not amplified further:
/// airbench's `eps`.
const EPSILON: f64 = 5e-4;

/// The kernel `[R, S, C, 2 * R * S * C]` (aether's layout) that whitens the
/// `R x S` patches of `images` (NHWC, `[n, side, side, channels]`
/// flattened), as airbench's `init_whitening_conv`: filter `k` is the
/// eigenvector of the patch covariance with the k-th largest eigenvalue
/// `lambda`, divided by `sqrt(lambda + 5e-4)`; filter `k + R*S*C` is its
/// negative. Computed in f64.
pub fn whitening_kernel(
    images: &[f32],
    side: usize,
    channels: usize,
    (r, s): (usize, usize),
) -> Result<Vec<f32>> {
    let per = side * side * channels;
    let bad = |reason: String| AetherError::InvalidShape {
        op: "whitening_kernel",
        shape: vec![images.len() / per.max(1), side, side, channels],
        reason,
    };
    if per == 0 || images.is_empty() || !images.len().is_multiple_of(per) {
        return Err(bad(format!(
            "{} values are not whole {side}x{side}x{channels} images",
            images.len()
        )));
    }
    if r == 0 || s == 0 || r > side || s > side {
        return Err(bad(format!("a {r}x{s} patch does not fit the images")));
    }
    if let Some(v) = images.iter().find(|v| !v.is_finite()) {
        return Err(bad(format!("value {v} is not finite")));
    }
    let dim = r * s * channels;
    let mut covariance = vec![0.0f64; dim * dim];
    let mut patch = vec![0.0f64; dim];
    let mut count = 0usize;
    for image in images.chunks_exact(per) {
        for y in 0..=side - r {
            for x in 0..=side - s {
                for (k, value) in patch.iter_mut().enumerate() {
                    let (rr, ss, c) = (k / (s * channels), (k / channels) % s, k % channels);
                    *value = f64::from(image[((y + rr) * side + x + ss) * channels + c]);
                }
                for a in 0..dim {
                    for b in a..dim {
                        covariance[a * dim + b] += patch[a] * patch[b];
                    }
                }
                count += 1;
            }
        }
    }
    for a in 0..dim {
        for b in a..dim {
            covariance[a * dim + b] /= count as f64;
            covariance[b * dim + a] = covariance[a * dim + b];
        }
    }
    let (values, vectors) = symmetric_eigen(covariance, dim);
    let mut order: Vec<usize> = (0..dim).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    let filters = 2 * dim;
    let mut kernel = vec![0.0f32; dim * filters];
    for (k, &e) in order.iter().enumerate() {
        let scale = 1.0 / (values[e].max(0.0) + EPSILON).sqrt();
        for row in 0..dim {
            let w = (vectors[row * dim + e] * scale) as f32;
            kernel[row * filters + k] = w;
            kernel[row * filters + k + dim] = -w;
        }
    }
    Ok(kernel)
}

/// Eigenvalues and eigenvectors (columns of the row-major `n x n` result) of
/// the symmetric `matrix`, by cyclic Jacobi rotations: exact to f64 rounding
/// for the small matrices (12 x 12) whitening needs.
fn symmetric_eigen(mut a: Vec<f64>, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut v = vec![0.0f64; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|p| (0..n).filter(move |&q| q != p).map(move |q| (p, q)))
            .map(|(p, q)| a[p * n + q].powi(2))
            .sum();
        let scale: f64 = (0..n)
            .map(|i| a[i * n + i].powi(2))
            .sum::<f64>()
            .max(f64::MIN_POSITIVE);
        if off <= 1e-30 * scale {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

#[cfg(test)]
mod tests {
    use super::symmetric_eigen;

    #[test]
    fn jacobi_diagonalises_a_symmetric_matrix() {
        let n = 5;
        // A symmetric matrix with distinct, known structure: B^T B + diag.
        let b: Vec<f64> = (0..n * n)
            .map(|k| ((k * 7 + 3) % 11) as f64 - 5.0)
            .collect();
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (0..n).map(|k| b[k * n + i] * b[k * n + j]).sum::<f64>()
                    + if i == j { i as f64 } else { 0.0 };
            }
        }
        let (values, v) = symmetric_eigen(a.clone(), n);
        // A v_e = lambda_e v_e for every eigenpair, and V is orthonormal.
        for e in 0..n {
            for i in 0..n {
                let av: f64 = (0..n).map(|k| a[i * n + k] * v[k * n + e]).sum();
                assert!(
                    (av - values[e] * v[i * n + e]).abs() < 1e-9,
                    "pair {e} row {i}"
                );
            }
            for f in 0..n {
                let dot: f64 = (0..n).map(|k| v[k * n + e] * v[k * n + f]).sum();
                assert!((dot - f64::from(u8::from(e == f))).abs() < 1e-12);
            }
        }
    }
}
