//! Loss-side ops (softmax, its backward, the fused softmax cross-entropy,
//! cross-entropy on probabilities, correct counts) on every device, checked
//! against f64 references written here from the definitions, and by finite
//! differences on the CPU path.

mod common;

use aether::ops::loss::{
    correct_count, cross_entropy, softmax, softmax_backward, softmax_cross_entropy,
    softmax_cross_entropy_with_correct,
};
use aether::{AetherError, Device, Tensor};
use common::Rng;

/// Norm-relative error bound of an f32 result against its f64 reference.
const F32_BOUND: f64 = 1e-5;
/// Relative error bound of a loss value (see [`LOSS_FLOOR`] near zero).
const LOSS_BOUND: f64 = 1e-5;
/// Absolute slack of a loss near zero. A row's loss there is about the sum of
/// its other classes' exp(z - max), and a GPU's exp may give 0 near the
/// smallest normal f32: Mesa 26 lavapipe gave a loss of 0 against a reference
/// of 1.7e-38 (3 classes, logits up to 80). `9 * f32::MIN_POSITIVE` (1.1e-37)
/// allows one such term for each other class of 10 (`CLASS_COUNTS`).
const LOSS_FLOOR: f64 = 9.0 * f32::MIN_POSITIVE as f64;
/// Norm-relative bound of an analytic gradient against central differences of
/// the f64 loss (their own error is near 1e-10 at these steps).
const FD_BOUND: f64 = 1e-5;

const CLASS_COUNTS: [usize; 2] = [10, 3];
/// 300 rows: the GPU sums the rows over two workgroups, then one.
const ROW_COUNTS: [usize; 3] = [1, 7, 300];
/// Logit magnitudes: moderate, and large enough that a naive exp overflows.
const LOGIT_SCALES: [f64; 2] = [3.0, 80.0];
const SMOOTHINGS: [f32; 2] = [0.0, 0.05];

/// The clip bounds of cross-entropy, as the f32 values the crate (and Aether-ML,
/// whose float32 arrays round the bounds) uses.
const P_MIN: f64 = 1e-7f32 as f64;
const P_MAX: f64 = (1.0f32 - 1e-7f32) as f64;

/// Asserts `|got - want| <= bound * |want| + sqrt(len) * f32::MIN_POSITIVE` in the
/// 2-norm: values below the smallest normal f32 (a confident row's gradient at
/// logit gaps past 87) cannot be held to a relative bound.
fn assert_norm_close(got: &[f32], want: &[f64], bound: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    assert!(
        norm > 0.0,
        "{what}: reference is zero, the comparison would be empty"
    );
    let floor = (want.len() as f64).sqrt() * f64::from(f32::MIN_POSITIVE);
    assert!(
        diff <= bound * norm + floor,
        "{what}: norm-relative error {:e} > {bound:e}",
        diff / norm
    );
}

fn assert_loss_close(got: f32, want: f64, what: &str) {
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= LOSS_BOUND * want.abs() + LOSS_FLOOR,
        "{what}: loss {got} vs reference {want} (relative error {:e})",
        err / want.abs()
    );
}

fn random_logits(rng: &mut Rng, rows: usize, classes: usize, scale: f64) -> Vec<f32> {
    (0..rows * classes)
        .map(|_| (f64::from(rng.uniform()) * scale) as f32)
        .collect()
}

fn random_labels(rng: &mut Rng, rows: usize, classes: usize) -> Vec<u32> {
    (0..rows)
        .map(|_| (rng.next_u64() % classes as u64) as u32)
        .collect()
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// `t = (1 - s) * onehot + s / K`; a label outside the classes has no one-hot part.
fn targets(label: u32, classes: usize, smoothing: f64) -> Vec<f64> {
    (0..classes)
        .map(|k| {
            let onehot = if k == label as usize { 1.0 } else { 0.0 };
            (1.0 - smoothing) * onehot + smoothing / classes as f64
        })
        .collect()
}

/// Index of the first maximum of a row.
fn first_argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (k, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = k;
        }
    }
    best
}

/// log softmax of a row by log-sum-exp, the sum split as 1 + rest (rest over the
/// non-maximal entries) so log1p keeps the log of a near-one sum exact.
fn reference_log_softmax(row: &[f64]) -> Vec<f64> {
    let top = first_argmax(row);
    let m = row[top];
    let rest: f64 = row
        .iter()
        .enumerate()
        .filter(|&(k, _)| k != top)
        .map(|(_, &v)| (v - m).exp())
        .sum();
    row.iter().map(|&v| (v - m) - rest.ln_1p()).collect()
}

fn reference_softmax(logits: &[f64], classes: usize) -> Vec<f64> {
    logits
        .chunks(classes)
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = row.iter().map(|&v| (v - m).exp()).collect();
            let total: f64 = exps.iter().sum();
            exps.into_iter().map(move |e| e / total)
        })
        .collect()
}

fn reference_softmax_backward(probs: &[f64], dprobs: &[f64], classes: usize) -> Vec<f64> {
    probs
        .chunks(classes)
        .zip(dprobs.chunks(classes))
        .flat_map(|(p, dp)| {
            let dot: f64 = p.iter().zip(dp).map(|(a, b)| a * b).sum();
            p.iter()
                .zip(dp)
                .map(move |(&p, &d)| p * (d - dot))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Mean of `-sum t log softmax(x)` and its gradient `(softmax(x) - t) / N`; for the
/// maximal entry `p - t` is formed as `expm1(log p) + (1 - t)` so a confident row's
/// tiny gradient is not lost to cancellation.
fn reference_softmax_cross_entropy(
    logits: &[f64],
    labels: &[u32],
    classes: usize,
    smoothing: f64,
) -> (f64, Vec<f64>) {
    let rows = labels.len() as f64;
    let mut loss = 0.0;
    let mut grad = Vec::with_capacity(logits.len());
    for (row, &label) in logits.chunks(classes).zip(labels) {
        let log_p = reference_log_softmax(row);
        let t = targets(label, classes, smoothing);
        let top = first_argmax(row);
        loss -= t.iter().zip(&log_p).map(|(t, lp)| t * lp).sum::<f64>();
        for k in 0..classes {
            let p_minus_t = if k == top {
                log_p[k].exp_m1() + (1.0 - t[k])
            } else {
                log_p[k].exp() - t[k]
            };
            grad.push(p_minus_t / rows);
        }
    }
    (loss / rows, grad)
}

/// Mean of `-sum t log clip(p)` and `-t / clip(p) / N`.
fn reference_cross_entropy(
    probs: &[f64],
    labels: &[u32],
    classes: usize,
    smoothing: f64,
) -> (f64, Vec<f64>) {
    let rows = labels.len() as f64;
    let mut loss = 0.0;
    let mut grad = Vec::with_capacity(probs.len());
    for (row, &label) in probs.chunks(classes).zip(labels) {
        for (&p, t) in row.iter().zip(targets(label, classes, smoothing)) {
            let clipped = p.clamp(P_MIN, P_MAX);
            loss -= t * clipped.ln();
            grad.push(-t / clipped / rows);
        }
    }
    (loss / rows, grad)
}

/// The bits of an f32 tensor's values, for comparisons that must be exact.
fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn labels_tensor(labels: &[u32], device: &Device) -> Tensor {
    Tensor::from_u32(vec![labels.len()], labels.to_vec(), device).unwrap()
}

fn matrix(data: &[f32], classes: usize, device: &Device) -> Tensor {
    Tensor::from_f32(vec![data.len() / classes, classes], data.to_vec(), device).unwrap()
}

test_device!(softmax_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    for classes in CLASS_COUNTS {
        for rows in ROW_COUNTS {
            for scale in LOGIT_SCALES {
                let logits = random_logits(&mut rng, rows, classes, scale);
                let got = softmax(&matrix(&logits, classes, device))
                    .unwrap()
                    .to_vec_f32()
                    .unwrap();
                let want = reference_softmax(&widen(&logits), classes);
                assert_norm_close(
                    &got,
                    &want,
                    F32_BOUND,
                    &format!(
                        "softmax N={rows} K={classes} scale {scale} (seed {})",
                        rng.seed
                    ),
                );
            }
        }
    }
});

test_device!(softmax_backward_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    // Moderate logits: with a near one-hot p, dp - sum(dp * p) cancels in any
    // f32 implementation, which says nothing about the op.
    for classes in CLASS_COUNTS {
        for rows in ROW_COUNTS {
            let logits = random_logits(&mut rng, rows, classes, 3.0);
            let probs = narrow(&reference_softmax(&widen(&logits), classes));
            let dprobs = rng.vec(rows * classes);
            let got = softmax_backward(
                &matrix(&probs, classes, device),
                &matrix(&dprobs, classes, device),
            )
            .unwrap()
            .to_vec_f32()
            .unwrap();
            let want = reference_softmax_backward(&widen(&probs), &widen(&dprobs), classes);
            assert_norm_close(
                &got,
                &want,
                F32_BOUND,
                &format!("softmax_backward N={rows} K={classes} (seed {})", rng.seed),
            );
        }
    }
});

test_device!(
    softmax_cross_entropy_matches_reference,
    |device: &Device| {
        let mut rng = Rng::fresh();
        for classes in CLASS_COUNTS {
            for rows in ROW_COUNTS {
                for scale in LOGIT_SCALES {
                    for smoothing in SMOOTHINGS {
                        let what = format!(
                            "N={rows} K={classes} scale {scale} s={smoothing} (seed {})",
                            rng.seed
                        );
                        let logits = random_logits(&mut rng, rows, classes, scale);
                        let labels = random_labels(&mut rng, rows, classes);
                        let (loss, dlogits) = softmax_cross_entropy(
                            &matrix(&logits, classes, device),
                            &labels_tensor(&labels, device),
                            smoothing,
                        )
                        .unwrap();
                        assert_eq!(loss.dims(), [1]);
                        let (want_loss, want_grad) = reference_softmax_cross_entropy(
                            &widen(&logits),
                            &labels,
                            classes,
                            f64::from(smoothing),
                        );
                        assert_loss_close(loss.to_vec_f32().unwrap()[0], want_loss, &what);
                        assert_norm_close(
                            &dlogits.to_vec_f32().unwrap(),
                            &want_grad,
                            F32_BOUND,
                            &format!("dlogits {what}"),
                        );
                    }
                }
            }
        }
    }
);

test_device!(cross_entropy_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    // Probabilities from logits of scale 80 fall outside the clip range at both ends.
    for classes in CLASS_COUNTS {
        for rows in ROW_COUNTS {
            for scale in LOGIT_SCALES {
                for smoothing in SMOOTHINGS {
                    let what = format!(
                        "N={rows} K={classes} scale {scale} s={smoothing} (seed {})",
                        rng.seed
                    );
                    let logits = random_logits(&mut rng, rows, classes, scale);
                    let probs = narrow(&reference_softmax(&widen(&logits), classes));
                    let labels = random_labels(&mut rng, rows, classes);
                    let (loss, dprobs) = cross_entropy(
                        &matrix(&probs, classes, device),
                        &labels_tensor(&labels, device),
                        smoothing,
                    )
                    .unwrap();
                    assert_eq!(loss.dims(), [1]);
                    let (want_loss, want_grad) = reference_cross_entropy(
                        &widen(&probs),
                        &labels,
                        classes,
                        f64::from(smoothing),
                    );
                    assert_loss_close(loss.to_vec_f32().unwrap()[0], want_loss, &what);
                    assert_norm_close(
                        &dprobs.to_vec_f32().unwrap(),
                        &want_grad,
                        F32_BOUND,
                        &format!("dprobs {what}"),
                    );
                }
            }
        }
    }
});

test_device!(
    correct_count_matches_a_count_with_ties,
    |device: &Device| {
        let mut rng = Rng::fresh();
        for classes in CLASS_COUNTS {
            for rows in ROW_COUNTS {
                let mut scores = random_logits(&mut rng, rows, classes, 3.0);
                let mut labels = random_labels(&mut rng, rows, classes);
                // About half the rows are labelled with their argmax, the rest at random.
                for (row, label) in scores.chunks(classes).zip(labels.iter_mut()) {
                    if rng.next_u64().is_multiple_of(2) {
                        *label = first_argmax(&widen(row)) as u32;
                    }
                }
                // Tied maxima at classes 0 and K - 1, labelled with the first of the tie
                // in rows 0 and 1 and with the second in row 2: counting by the first
                // maximum and by the last maximum must then disagree.
                for tie_row in 0..rows.min(3) {
                    let row = &mut scores[tie_row * classes..(tie_row + 1) * classes];
                    row[0] = 10.0;
                    row[classes - 1] = 10.0;
                    labels[tie_row] = if tie_row < 2 { 0 } else { classes as u32 - 1 };
                }
                let count_with = |pick: fn(&[f64]) -> usize| {
                    scores
                        .chunks(classes)
                        .zip(&labels)
                        .filter(|(row, label)| pick(&widen(row)) == **label as usize)
                        .count() as u32
                };
                let want = count_with(first_argmax);
                let last_max_count = count_with(|row| {
                    let top = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    row.iter().rposition(|&v| v == top).unwrap()
                });
                assert_ne!(want, last_max_count, "the ties must decide the count");
                let got = correct_count(
                    &matrix(&scores, classes, device),
                    &labels_tensor(&labels, device),
                )
                .unwrap();
                assert_eq!(got.dims(), [1]);
                assert_eq!(
                    got.to_vec_u32().unwrap(),
                    [want],
                    "N={rows} K={classes} (seed {})",
                    rng.seed
                );
            }
        }
    }
);

test_device!(losses_are_bit_identical_across_runs, |device: &Device| {
    let mut rng = Rng::fresh();
    let (rows, classes) = (300, 10);
    let logits = matrix(
        &random_logits(&mut rng, rows, classes, 80.0),
        classes,
        device,
    );
    let probs = softmax(&logits).unwrap();
    let labels = labels_tensor(&random_labels(&mut rng, rows, classes), device);
    let run = || {
        let (fused_loss, dlogits) = softmax_cross_entropy(&logits, &labels, 0.05).unwrap();
        let (loss, dprobs) = cross_entropy(&probs, &labels, 0.05).unwrap();
        (
            bits(&fused_loss),
            bits(&dlogits),
            bits(&loss),
            bits(&dprobs),
            correct_count(&logits, &labels)
                .unwrap()
                .to_vec_u32()
                .unwrap(),
        )
    };
    let first = run();
    assert!(first.0[0] != 0 && first.2[0] != 0, "losses are not zero");
    assert_eq!(first, run(), "seed {}", rng.seed);
});

// The step's fused loss, count and gradient (one dispatch on a GPU up to 256
// rows) give the bits of the two separate ops, at 1, 7, 256 and 300 rows (300
// takes the separate path), with ties in some rows and, on a GPU, labels that
// match no class.
test_device!(
    loss_with_correct_count_is_bit_identical_to_the_two,
    |device: &Device| {
        let mut rng = Rng::fresh();
        for rows in [1, 7, 256, 300] {
            for (classes, smoothing) in [(10, 0.05f32), (3, 0.0)] {
                let mut logits = random_logits(&mut rng, rows, classes, 3.0);
                for row in (0..rows).step_by(5) {
                    logits[row * classes + 1] = logits[row * classes];
                }
                let mut labels = random_labels(&mut rng, rows, classes);
                // Right answers too, and one sure wrong one, so the count is
                // neither 0 nor all rows (random labels alone were all right
                // in about 1 of 81 runs of 7 rows of 3).
                let argmax = |row: usize| {
                    first_argmax(&widen(&logits[row * classes..(row + 1) * classes])) as u32
                };
                for row in (0..rows).step_by(3) {
                    labels[row] = argmax(row);
                }
                if rows >= 3 {
                    labels[1] = (argmax(1) + 1) % classes as u32;
                }
                if device.gpu_context().is_some() && rows > 1 {
                    labels[rows / 2] = classes as u32;
                }
                let what = format!("{rows} rows of {classes} (seed {})", rng.seed);
                let logits = matrix(&logits, classes, device);
                let labels = labels_tensor(&labels, device);
                let (loss, correct, dlogits) =
                    softmax_cross_entropy_with_correct(&logits, &labels, smoothing).unwrap();
                let (want_loss, want_dlogits) =
                    softmax_cross_entropy(&logits, &labels, smoothing).unwrap();
                let want_correct = correct_count(&logits, &labels)
                    .unwrap()
                    .to_vec_u32()
                    .unwrap();
                assert_eq!(bits(&loss), bits(&want_loss), "loss of {what}");
                assert_eq!(bits(&dlogits), bits(&want_dlogits), "dlogits of {what}");
                assert_eq!(
                    correct.to_vec_u32().unwrap(),
                    want_correct,
                    "correct of {what}"
                );
                assert!(
                    rows < 3 || (want_correct[0] > 0 && (want_correct[0] as usize) < rows),
                    "{what}"
                );
            }
        }
    }
);

test_device!(out_of_range_labels, |device: &Device| {
    let mut rng = Rng::fresh();
    let (rows, classes, smoothing) = (7, 3, 0.05f32);
    let logits = random_logits(&mut rng, rows, classes, 3.0);
    let probs = narrow(&reference_softmax(&widen(&logits), classes));
    let mut labels = random_labels(&mut rng, rows, classes);
    labels[2] = classes as u32;
    labels[5] = u32::MAX;
    let label_tensor = labels_tensor(&labels, device);
    let logit_tensor = matrix(&logits, classes, device);
    let prob_tensor = matrix(&probs, classes, device);
    let fused = softmax_cross_entropy(&logit_tensor, &label_tensor, smoothing);
    let plain = cross_entropy(&prob_tensor, &label_tensor, smoothing);
    let count = correct_count(&logit_tensor, &label_tensor);
    if device.gpu_context().is_none() {
        // The CPU path checks the labels.
        for err in [fused.unwrap_err(), plain.unwrap_err(), count.unwrap_err()] {
            let text = err.to_string();
            assert!(matches!(err, AetherError::InvalidShape { .. }), "{text}");
            assert!(text.contains("label 3 at row 2"), "{text}");
        }
        return;
    }
    // The GPU matches no class: target s / K for those rows, never correct.
    let s = f64::from(smoothing);
    let (loss, dlogits) = fused.unwrap();
    let (want_loss, want_grad) =
        reference_softmax_cross_entropy(&widen(&logits), &labels, classes, s);
    assert_loss_close(loss.to_vec_f32().unwrap()[0], want_loss, "fused");
    assert_norm_close(
        &dlogits.to_vec_f32().unwrap(),
        &want_grad,
        F32_BOUND,
        &format!("dlogits (seed {})", rng.seed),
    );
    let (loss, dprobs) = plain.unwrap();
    let (want_loss, want_grad) = reference_cross_entropy(&widen(&probs), &labels, classes, s);
    assert_loss_close(loss.to_vec_f32().unwrap()[0], want_loss, "plain");
    assert_norm_close(
        &dprobs.to_vec_f32().unwrap(),
        &want_grad,
        F32_BOUND,
        &format!("dprobs (seed {})", rng.seed),
    );
    let want_count = logits
        .chunks(classes)
        .zip(&labels)
        .filter(|(row, label)| first_argmax(&widen(row)) == **label as usize)
        .count() as u32;
    assert_eq!(count.unwrap().to_vec_u32().unwrap(), [want_count]);
});

test_device!(bad_operands_are_typed_errors, |device: &Device| {
    let mut rng = Rng::fresh();
    let (rows, classes) = (5, 4);
    let logits = matrix(
        &random_logits(&mut rng, rows, classes, 3.0),
        classes,
        device,
    );
    let labels = labels_tensor(&random_labels(&mut rng, rows, classes), device);
    let is_shape_mismatch =
        |r: aether::Result<(Tensor, Tensor)>| matches!(r, Err(AetherError::ShapeMismatch { .. }));

    let too_long = labels_tensor(&[0; 6], device);
    assert!(is_shape_mismatch(softmax_cross_entropy(
        &logits, &too_long, 0.0
    )));
    assert!(is_shape_mismatch(cross_entropy(&logits, &too_long, 0.0)));
    assert!(matches!(
        correct_count(&logits, &too_long),
        Err(AetherError::ShapeMismatch { .. })
    ));
    let column = Tensor::from_u32(vec![rows, 1], vec![0; rows], device).unwrap();
    assert!(is_shape_mismatch(softmax_cross_entropy(
        &logits, &column, 0.0
    )));

    let float_labels = Tensor::from_f32(vec![rows], vec![1.0; rows], device).unwrap();
    for err in [
        softmax_cross_entropy(&logits, &float_labels, 0.0).unwrap_err(),
        cross_entropy(&logits, &float_labels, 0.0).unwrap_err(),
        correct_count(&logits, &float_labels).unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(
            matches!(err, AetherError::InvalidShape { .. }) && text.contains("U32"),
            "{text}"
        );
    }

    let flat = Tensor::from_f32(vec![rows * classes], vec![0.5; rows * classes], device).unwrap();
    assert!(matches!(
        softmax(&flat),
        Err(AetherError::InvalidShape { .. })
    ));
    assert!(softmax_cross_entropy(&flat, &labels, 0.0).is_err());
    let index_logits =
        Tensor::from_u32(vec![rows, classes], vec![1; rows * classes], device).unwrap();
    assert!(matches!(
        softmax(&index_logits),
        Err(AetherError::InvalidShape { .. })
    ));

    let narrower = matrix(
        &random_logits(&mut rng, rows, classes - 1, 3.0),
        classes - 1,
        device,
    );
    let err = softmax_backward(&logits, &narrower).unwrap_err();
    assert!(matches!(err, AetherError::ShapeMismatch { .. }), "{err}");

    for smoothing in [-0.1, 1.5, f32::NAN] {
        let err = softmax_cross_entropy(&logits, &labels, smoothing).unwrap_err();
        assert!(err.to_string().contains("label_smoothing"), "{err}");
        assert!(cross_entropy(&logits, &labels, smoothing).is_err());
    }

    if device.gpu_context().is_some() {
        let host_labels = labels.to(&Device::Cpu).unwrap();
        let err = softmax_cross_entropy(&logits, &host_labels, 0.0).unwrap_err();
        assert!(matches!(err, AetherError::DeviceMismatch { .. }), "{err}");
        let host_dprobs = logits.to(&Device::Cpu).unwrap();
        let err = softmax_backward(&logits, &host_dprobs).unwrap_err();
        assert!(matches!(err, AetherError::DeviceMismatch { .. }), "{err}");
    }
});

/// Central differences of `loss` at `x`, one coordinate at a time, step `step(x_i)`.
fn finite_differences(
    x: &[f64],
    loss: impl Fn(&[f64]) -> f64,
    step: impl Fn(f64) -> f64,
) -> Vec<f64> {
    let mut probe = x.to_vec();
    (0..x.len())
        .map(|i| {
            let h = step(x[i]);
            probe[i] = x[i] + h;
            let up = loss(&probe);
            probe[i] = x[i] - h;
            let down = loss(&probe);
            probe[i] = x[i];
            (up - down) / (2.0 * h)
        })
        .collect()
}

#[test]
fn softmax_cross_entropy_gradient_matches_finite_differences() {
    let mut rng = Rng::fresh();
    for classes in CLASS_COUNTS {
        for smoothing in SMOOTHINGS {
            let rows = 7;
            let logits = random_logits(&mut rng, rows, classes, 3.0);
            let labels = random_labels(&mut rng, rows, classes);
            let (_, dlogits) = softmax_cross_entropy(
                &matrix(&logits, classes, &Device::Cpu),
                &labels_tensor(&labels, &Device::Cpu),
                smoothing,
            )
            .unwrap();
            let s = f64::from(smoothing);
            let numeric = finite_differences(
                &widen(&logits),
                |x| reference_softmax_cross_entropy(x, &labels, classes, s).0,
                |_| 1e-5,
            );
            assert_norm_close(
                &dlogits.to_vec_f32().unwrap(),
                &numeric,
                FD_BOUND,
                &format!("K={classes} s={smoothing} (seed {})", rng.seed),
            );
        }
    }
}

#[test]
fn softmax_backward_matches_finite_differences() {
    let mut rng = Rng::fresh();
    for classes in CLASS_COUNTS {
        let rows = 7;
        let logits = random_logits(&mut rng, rows, classes, 3.0);
        let upstream = widen(&rng.vec(rows * classes));
        let probs = narrow(&reference_softmax(&widen(&logits), classes));
        let dx = softmax_backward(
            &matrix(&probs, classes, &Device::Cpu),
            &matrix(&narrow(&upstream), classes, &Device::Cpu),
        )
        .unwrap();
        // loss = sum(softmax(x) * g)
        let numeric = finite_differences(
            &widen(&logits),
            |x| {
                reference_softmax(x, classes)
                    .iter()
                    .zip(&upstream)
                    .map(|(p, g)| p * g)
                    .sum()
            },
            |_| 1e-5,
        );
        assert_norm_close(
            &dx.to_vec_f32().unwrap(),
            &numeric,
            FD_BOUND,
            &format!("K={classes} (seed {})", rng.seed),
        );
    }
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    let mut rng = Rng::fresh();
    for classes in CLASS_COUNTS {
        for smoothing in SMOOTHINGS {
            let rows = 7;
            // Probabilities well inside the clip range, so the loss is smooth there.
            let logits = random_logits(&mut rng, rows, classes, 1.0);
            let probs = narrow(&reference_softmax(&widen(&logits), classes));
            let labels = random_labels(&mut rng, rows, classes);
            let (_, dprobs) = cross_entropy(
                &matrix(&probs, classes, &Device::Cpu),
                &labels_tensor(&labels, &Device::Cpu),
                smoothing,
            )
            .unwrap();
            let s = f64::from(smoothing);
            let numeric = finite_differences(
                &widen(&probs),
                |p| reference_cross_entropy(p, &labels, classes, s).0,
                |p| 1e-5 * p,
            );
            assert_norm_close(
                &dprobs.to_vec_f32().unwrap(),
                &numeric,
                FD_BOUND,
                &format!("K={classes} s={smoothing} (seed {})", rng.seed),
            );
        }
    }
}
