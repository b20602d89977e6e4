//! Batch normalization on every device, checked against an f64 reference written
//! here straight from the definition. Bounds: 1e-5 norm-relative (||got - want|| /
//! ||want||) for y, dx, dgamma and dbeta; 1e-5 relative per channel for the
//! statistics. Inputs carry an offset (x = 3 + u, u uniform in [-1, 1)) so that a
//! wrong mean or a cancelling variance formula shows.

mod common;

use aether::conv::cast_f16;
use aether::ops::activation::{
    Activation, Smooth, activation_as, activation_backward_as, relu_backward,
};
use aether::ops::batchnorm::{
    BatchNormStats, CHUNK_ROWS, FusedGrad, NormOutput, RunningStats, batch_norm_backward,
    batch_norm_backward_as, batch_norm_inference, batch_norm_inference_as,
    batch_norm_relu_backward, batch_norm_relu_inference, batch_norm_relu_train, batch_norm_train,
    batch_norm_train_as, batch_norm_train_running, update_running_stats,
};
use aether::ops::relu;
use aether::{AetherError, DType, Device, Tensor};
use common::Rng;
use half::f16;

const EPS: f32 = 1e-3;
const BOUND: f64 = 1e-5;
/// Images, a channel count that is a multiple of nothing, dense data, a batch
/// whose 1088 values per channel span several partial-sum chunks (the last one
/// partly filled), and channel counts that divide by 4 (the kernels then move 4
/// channels per invocation), one of them spanning chunks too, and one (40 = 10
/// lanes of 4) spanning two channel tiles of the partial sums, the second
/// partly filled.
const SHAPES: [&[usize]; 7] = [
    &[5, 3, 7, 6],
    &[1, 2, 3, 33],
    &[7, 13],
    &[4, 16, 17, 5],
    &[3, 5, 7, 12],
    &[2, 19, 17, 8],
    &[3, 9, 11, 40],
];

fn channels_of(dims: &[usize]) -> usize {
    dims[dims.len() - 1]
}

fn offset_data(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| 3.0 + rng.uniform()).collect()
}

/// Per-channel (mean, biased variance), two passes in f64.
fn reference_stats(x: &[f64], channels: usize) -> (Vec<f64>, Vec<f64>) {
    let count = (x.len() / channels) as f64;
    let mut mean = vec![0.0; channels];
    for (i, v) in x.iter().enumerate() {
        mean[i % channels] += v / count;
    }
    let mut var = vec![0.0; channels];
    for (i, v) in x.iter().enumerate() {
        var[i % channels] += (v - mean[i % channels]).powi(2) / count;
    }
    (mean, var)
}

/// y = (x - mean) / sqrt(var + eps) * gamma + beta with the batch's own statistics.
fn reference_forward(x: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let channels = gamma.len();
    let (mean, var) = reference_stats(x, channels);
    x.iter()
        .enumerate()
        .map(|(i, v)| {
            let c = i % channels;
            (v - mean[c]) / (var[c] + eps).sqrt() * gamma[c] + beta[c]
        })
        .collect()
}

/// (dx, dgamma, dbeta) from the textbook formula, in f64, for the statistics
/// `(mean, inv_std)` the backward pass is given. Using the statistics the
/// forward pass actually returned (checked against `reference_stats` by
/// `train_matches_reference`) keeps this test about the backward pass: with an
/// offset on dy, dgamma = sum(dy * xhat) nearly cancels, and recomputing the
/// statistics in f64 would measure the f32 rounding of the mean, amplified by
/// sum(dy) / |dgamma|, instead.
fn reference_backward(
    dy: &[f64],
    x: &[f64],
    gamma: &[f64],
    mean: &[f64],
    inv_std: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let channels = gamma.len();
    let count = (x.len() / channels) as f64;
    let xhat: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, v)| (v - mean[i % channels]) * inv_std[i % channels])
        .collect();
    let mut dgamma = vec![0.0; channels];
    let mut dbeta = vec![0.0; channels];
    for i in 0..x.len() {
        dgamma[i % channels] += dy[i] * xhat[i];
        dbeta[i % channels] += dy[i];
    }
    let dx = (0..x.len())
        .map(|i| {
            let c = i % channels;
            gamma[c] * inv_std[c] / count * (count * dy[i] - dbeta[c] - xhat[i] * dgamma[c])
        })
        .collect();
    (dx, dgamma, dbeta)
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn norm_relative(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, w)| (f64::from(g) - w).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    (diff / norm).sqrt()
}

fn max_relative(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, w)| (f64::from(g) - w).abs() / w.abs())
        .fold(0.0, f64::max)
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

/// Random x (with offset), gamma around 1 and beta on `device`.
/// The bits of an f16 tensor.
fn halves(t: &Tensor) -> Vec<u16> {
    assert_eq!(t.dtype(), DType::F16);
    t.to_vec_f16()
        .unwrap()
        .into_iter()
        .map(f16::to_bits)
        .collect()
}

fn random_inputs(rng: &mut Rng, dims: &[usize], device: &Device) -> [(Tensor, Vec<f32>); 3] {
    let channels = channels_of(dims);
    let x = offset_data(rng, dims.iter().product());
    let gamma: Vec<f32> = (0..channels).map(|_| 1.0 + 0.5 * rng.uniform()).collect();
    let beta = rng.vec(channels);
    [
        (
            Tensor::from_f32(dims.to_vec(), x.clone(), device).unwrap(),
            x,
        ),
        (
            Tensor::from_f32(vec![channels], gamma.clone(), device).unwrap(),
            gamma,
        ),
        (
            Tensor::from_f32(vec![channels], beta.clone(), device).unwrap(),
            beta,
        ),
    ]
}

test_device!(train_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    let last_count: usize = SHAPES[3][..3].iter().product();
    assert!(
        last_count > 2 * CHUNK_ROWS && !last_count.is_multiple_of(CHUNK_ROWS),
        "the last shape must span several chunks, the last one partly filled"
    );
    for dims in SHAPES {
        let [(x, xs), (gamma, gs), (beta, bs)] = random_inputs(&mut rng, dims, device);
        let (y, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
        assert_eq!(y.dims(), dims);
        let channels = channels_of(dims);
        let (mean, var) = reference_stats(&wide(&xs), channels);
        let inv_std: Vec<f64> = var
            .iter()
            .map(|v| 1.0 / (v + f64::from(EPS)).sqrt())
            .collect();
        let want_y = reference_forward(&wide(&xs), &wide(&gs), &wide(&bs), f64::from(EPS));
        let errors = [
            norm_relative(&values(&y), &want_y),
            max_relative(&values(&stats.mean), &mean),
            max_relative(&values(&stats.inv_std), &inv_std),
        ];
        for (what, err) in ["y", "mean", "inv_std"].iter().zip(errors) {
            assert!(
                err <= BOUND,
                "{what} of {dims:?}: error {err:e} > {BOUND:e} (seed {})",
                rng.seed
            );
        }
    }
});

test_device!(inference_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    for dims in SHAPES {
        let channels = channels_of(dims);
        let [(x, xs), (gamma, gs), (beta, bs)] = random_inputs(&mut rng, dims, device);
        let rm: Vec<f32> = (0..channels).map(|_| 3.0 + 0.5 * rng.uniform()).collect();
        let rv: Vec<f32> = (0..channels).map(|_| 1.0 + 0.5 * rng.uniform()).collect();
        let running_mean = Tensor::from_f32(vec![channels], rm.clone(), device).unwrap();
        let running_var = Tensor::from_f32(vec![channels], rv.clone(), device).unwrap();
        let y = batch_norm_inference(&x, &gamma, &beta, &running_mean, &running_var, EPS).unwrap();
        let want: Vec<f64> = xs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let c = i % channels;
                (f64::from(v) - f64::from(rm[c])) / (f64::from(rv[c]) + f64::from(EPS)).sqrt()
                    * f64::from(gs[c])
                    + f64::from(bs[c])
            })
            .collect();
        let err = norm_relative(&values(&y), &want);
        assert!(
            err <= BOUND,
            "inference y of {dims:?}: error {err:e} > {BOUND:e} (seed {})",
            rng.seed
        );
    }
});

test_device!(backward_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    for dims in SHAPES {
        let [(x, xs), (gamma, gs), (beta, _)] = random_inputs(&mut rng, dims, device);
        // An offset on dy too, so sum(dy) is far from zero and its term matters.
        let dys: Vec<f32> = (0..xs.len()).map(|_| 0.5 + rng.uniform()).collect();
        let dy = Tensor::from_f32(dims.to_vec(), dys.clone(), device).unwrap();
        let (_, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
        let (dx, dgamma, dbeta) = batch_norm_backward(&dy, &x, &gamma, &stats).unwrap();
        assert_eq!(dx.dims(), dims);
        let (mean, inv_std) = (wide(&values(&stats.mean)), wide(&values(&stats.inv_std)));
        let (want_dx, want_dgamma, want_dbeta) =
            reference_backward(&wide(&dys), &wide(&xs), &wide(&gs), &mean, &inv_std);
        let errors = [
            norm_relative(&values(&dx), &want_dx),
            norm_relative(&values(&dgamma), &want_dgamma),
            norm_relative(&values(&dbeta), &want_dbeta),
        ];
        for (what, err) in ["dx", "dgamma", "dbeta"].iter().zip(errors) {
            assert!(
                err <= BOUND,
                "{what} of {dims:?}: error {err:e} > {BOUND:e} (seed {})",
                rng.seed
            );
        }
    }
});

/// Central differences of loss = sum(forward(x, gamma, beta) * g), all in f64,
/// against the crate's CPU backward with dy = g. Bound: 1e-5 norm-relative
/// (f32 rounding of the backward plus O(h^2) truncation, h = 1e-4).
#[test]
fn backward_matches_finite_differences_on_cpu() {
    let mut rng = Rng::fresh();
    let device = Device::Cpu;
    for dims in [&[3usize, 2, 2, 3][..], &[6, 4]] {
        let [(x, xs), (gamma, gs), (beta, bs)] = random_inputs(&mut rng, dims, &device);
        let g = rng.vec(xs.len());
        let dy = Tensor::from_f32(dims.to_vec(), g.clone(), &device).unwrap();
        let (_, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
        let (dx, dgamma, dbeta) = batch_norm_backward(&dy, &x, &gamma, &stats).unwrap();

        let (x64, gamma64, beta64, g64) = (wide(&xs), wide(&gs), wide(&bs), wide(&g));
        let loss = |x: &[f64], gamma: &[f64], beta: &[f64]| -> f64 {
            reference_forward(x, gamma, beta, f64::from(EPS))
                .iter()
                .zip(&g64)
                .map(|(y, g)| y * g)
                .sum()
        };
        let h = 1e-4;
        let numeric = |which: usize, len: usize| -> Vec<f64> {
            (0..len)
                .map(|i| {
                    let mut args = [x64.clone(), gamma64.clone(), beta64.clone()];
                    args[which][i] += h;
                    let up = loss(&args[0], &args[1], &args[2]);
                    args[which][i] -= 2.0 * h;
                    let down = loss(&args[0], &args[1], &args[2]);
                    (up - down) / (2.0 * h)
                })
                .collect()
        };
        let checks = [
            ("dx", values(&dx), numeric(0, xs.len())),
            ("dgamma", values(&dgamma), numeric(1, gs.len())),
            ("dbeta", values(&dbeta), numeric(2, bs.len())),
        ];
        for (what, got, want) in checks {
            let err = norm_relative(&got, &want);
            assert!(
                err <= BOUND,
                "{what} of {dims:?} vs finite differences: error {err:e} > {BOUND:e} (seed {})",
                rng.seed
            );
        }
    }
}

test_device!(two_runs_are_bit_identical, |device: &Device| {
    let mut rng = Rng::fresh();
    for dims in [&[4usize, 16, 17, 5][..], &[1, 2, 3, 33]] {
        let [(x, xs), (gamma, _), (beta, _)] = random_inputs(&mut rng, dims, device);
        let dy = Tensor::from_f32(dims.to_vec(), rng.vec(xs.len()), device).unwrap();
        let run = || {
            let (y, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
            let (dx, dgamma, dbeta) = batch_norm_backward(&dy, &x, &gamma, &stats).unwrap();
            [y, stats.mean, stats.inv_std, dx, dgamma, dbeta]
                .map(|t| values(&t).into_iter().map(f32::to_bits).collect::<Vec<_>>())
        };
        let first = run();
        let second = run();
        let names = ["y", "mean", "inv_std", "dx", "dgamma", "dbeta"];
        for ((name, a), b) in names.iter().zip(&first).zip(&second) {
            assert!(
                a == b,
                "{name} of {dims:?} differs between runs (seed {})",
                rng.seed
            );
        }
    }
});

test_device!(
    fused_relu_is_bit_identical_to_the_two_ops,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let bits = |t: &Tensor| -> Vec<u32> { values(t).into_iter().map(f32::to_bits).collect() };
        // The last shape's 8 channels take the 4-value kernels.
        let shapes = [&[4usize, 16, 17, 5][..], &[7, 13], &[2, 19, 17, 8]];
        for (case, dims) in shapes.into_iter().enumerate() {
            let [(_, mut xs), (gamma, _), (beta, _)] = random_inputs(&mut rng, dims, device);
            if case >= 1 {
                // A NaN makes its channel's statistics NaN: it must reach y and be
                // gated out of the gradient exactly as the separate ops do.
                xs[4] = f32::NAN;
            }
            let x = Tensor::from_f32(dims.to_vec(), xs.clone(), device).unwrap();
            let dy = Tensor::from_f32(dims.to_vec(), rng.vec(xs.len()), device).unwrap();
            let ctx = format!("{dims:?} (seed {})", rng.seed);

            let (fused_y, fused_stats) = batch_norm_relu_train(&x, &gamma, &beta, EPS).unwrap();
            let (pre, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
            let y = relu(&pre).unwrap();
            assert_eq!(bits(&fused_y), bits(&y), "y of {ctx}");
            let zeroed = bits(&y).iter().filter(|&&b| b == 0).count();
            assert!(zeroed > xs.len() / 10, "ReLU had little to do in {ctx}");
            assert_eq!(bits(&fused_stats.mean), bits(&stats.mean), "mean of {ctx}");

            let fused = batch_norm_relu_backward(&dy, &x, &gamma, &beta, &fused_stats).unwrap();
            let gated = relu_backward(&pre, &dy).unwrap();
            let separate = batch_norm_backward(&gated, &x, &gamma, &stats).unwrap();
            for (name, a, b) in [
                ("dx", &fused.0, &separate.0),
                ("dgamma", &fused.1, &separate.1),
                ("dbeta", &fused.2, &separate.2),
            ] {
                assert_eq!(bits(a), bits(b), "{name} of {ctx}");
            }

            let channels = channels_of(dims);
            let running_mean = Tensor::from_f32(vec![channels], rng.vec(channels), device).unwrap();
            let var: Vec<f32> = (0..channels).map(|_| 1.5 + rng.uniform()).collect();
            let running_var = Tensor::from_f32(vec![channels], var, device).unwrap();
            let args = (&x, &gamma, &beta, &running_mean, &running_var, EPS);
            let fused = batch_norm_relu_inference(args.0, args.1, args.2, args.3, args.4, args.5);
            let plain = batch_norm_inference(args.0, args.1, args.2, args.3, args.4, args.5);
            let separate = relu(&plain.unwrap()).unwrap();
            assert_eq!(
                bits(&fused.unwrap()),
                bits(&separate),
                "inference y of {ctx}"
            );
        }
    }
);

test_device!(
    fused_gelu_silu_and_leaky_relu_compute_what_the_two_ops_compute,
    |device: &Device| {
        // The fused GELU, SiLU and leaky ReLU run their layer's formulas on
        // the normalized value (the forward) and on that value recomputed
        // from x (the backward's two passes). On the CPU that is the same
        // code, bit for bit; a GPU compiler may contract a product and a sum
        // into one fused multiply-add in one kernel and not in another, so
        // there the bound is 1e-6 norm-relative: a wrong slope, a missing
        // beta or a gradient taken at the activation's output is off by 1e-2
        // or more.
        let mut rng = Rng::fresh();
        let exact = device.gpu_context().is_none();
        let check = |got: &Tensor, want: &Tensor, what: &str| {
            let (got, want) = (values(got), values(want));
            if exact {
                let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
                assert_eq!(bits(&got), bits(&want), "{what}");
            } else {
                let err = norm_relative(&got, &wide(&want));
                assert!(err <= 1e-6, "{what}: {err:e}");
            }
        };
        // One value a lane, four a lane, and four spanning two channel tiles.
        let shapes = [&[7usize, 13][..], &[2, 19, 17, 8], &[3, 9, 11, 40]];
        let activations = [
            Activation::Smooth(Smooth::Gelu),
            Activation::Smooth(Smooth::Silu),
            Activation::LeakyRelu(0.1 + rng.uniform().abs()),
        ];
        for kind in activations {
            let activation = Some(kind);
            for dims in shapes {
                let [(x, _), (gamma, _), (beta, _)] = random_inputs(&mut rng, dims, device);
                let len = x.numel();
                let dy = Tensor::from_f32(dims.to_vec(), rng.vec(len), device).unwrap();
                let ctx = format!("{kind:?} {dims:?} (seed {})", rng.seed);

                let out = NormOutput::f32(activation);
                let (y, stats) = batch_norm_train_as(&x, &gamma, &beta, EPS, out).unwrap();
                let (pre, _) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
                let want_y = activation_as(&pre, kind, DType::F32).unwrap();
                check(&y, &want_y, &format!("y of {ctx}"));

                let through = Some(FusedGrad {
                    activation: kind,
                    beta: &beta,
                });
                let fused =
                    batch_norm_backward_as(&dy, &x, &gamma, &stats, through, DType::F32).unwrap();
                let slope_taken = activation_backward_as(&pre, &dy, kind, DType::F32).unwrap();
                let separate = batch_norm_backward(&slope_taken, &x, &gamma, &stats).unwrap();
                check(&fused.0, &separate.0, &format!("dx of {ctx}"));
                check(&fused.1, &separate.1, &format!("dgamma of {ctx}"));
                check(&fused.2, &separate.2, &format!("dbeta of {ctx}"));
                // Taking a smooth slope at the output instead of the input
                // shows.
                if let Activation::Smooth(_) = kind {
                    let at_output = activation_backward_as(&y, &dy, kind, DType::F32).unwrap();
                    let wrong = batch_norm_backward(&at_output, &x, &gamma, &stats).unwrap();
                    let err = norm_relative(&values(&wrong.0), &wide(&values(&separate.0)));
                    assert!(
                        err > 1e-3,
                        "the slope's argument does not show in {ctx}: {err:e}"
                    );
                }

                if dims[dims.len() - 1] % 4 != 0 {
                    continue;
                }
                // Stored as f16 for a conv after: the rounded fused values.
                let half = NormOutput {
                    activation,
                    dtype: DType::F16,
                };
                let (y16, _) = batch_norm_train_as(&x, &gamma, &beta, EPS, half).unwrap();
                let want = activation_as(&pre, kind, DType::F16).unwrap();
                let (got16, want16) = (halves(&y16), halves(&want));
                if exact {
                    assert_eq!(got16, want16, "f16 y of {ctx}");
                } else {
                    let apart = got16.iter().zip(&want16).filter(|(a, b)| a != b).count();
                    assert!(apart * 100 <= got16.len(), "f16 y of {ctx}: {apart} apart");
                }
                let dx16 =
                    batch_norm_backward_as(&dy, &x, &gamma, &stats, through, DType::F16).unwrap();
                let want = cast_f16(&fused.0, true).unwrap();
                assert_eq!(halves(&dx16.0), halves(&want), "f16 dx of {ctx}");
                let running_mean =
                    Tensor::from_f32(vec![dims[3]], rng.vec(dims[3]), device).unwrap();
                let var: Vec<f32> = (0..dims[3]).map(|_| 1.5 + rng.uniform()).collect();
                let running_var = Tensor::from_f32(vec![dims[3]], var, device).unwrap();
                let (rm, rv) = (&running_mean, &running_var);
                let fused = batch_norm_inference_as(&x, &gamma, &beta, rm, rv, EPS, out).unwrap();
                let plain = batch_norm_inference(&x, &gamma, &beta, rm, rv, EPS).unwrap();
                let want = activation_as(&plain, kind, DType::F32).unwrap();
                check(&fused, &want, &format!("inference y of {ctx}"));
            }
        }
    }
);

test_device!(running_stats_match_hand_calculation, |device: &Device| {
    // Batch: mean [3, 0.5], biased variance [4, 0.25], 5 values per channel.
    let eps = 1e-3f64;
    let inv_std: Vec<f32> = [4.0f64, 0.25]
        .iter()
        .map(|v| (1.0 / (v + eps).sqrt()) as f32)
        .collect();
    let vector = |v: Vec<f32>| Tensor::from_f32(vec![2], v, device).unwrap();
    let stats = BatchNormStats {
        mean: vector(vec![3.0, 0.5]),
        inv_std: vector(inv_std),
    };
    let (mean, var) = update_running_stats(
        &vector(vec![1.0, -2.0]),
        &vector(vec![0.5, 2.0]),
        &stats,
        5,
        0.9,
        eps as f32,
    )
    .unwrap();
    // mean: 0.9 * 1 + 0.1 * 3 = 1.2;  0.9 * -2 + 0.1 * 0.5 = -1.75
    // var:  0.9 * 0.5 + 0.1 * 4 * 5/4 = 0.95;  0.9 * 2 + 0.1 * 0.25 * 5/4 = 1.83125
    let mean_err = max_relative(&values(&mean), &[1.2, -1.75]);
    let var_err = max_relative(&values(&var), &[0.95, 1.83125]);
    assert!(mean_err <= BOUND, "running mean error {mean_err:e}");
    assert!(var_err <= BOUND, "running var error {var_err:e}");
});

test_device!(
    train_with_running_stats_is_bit_identical_to_the_two_calls,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let bits = |t: &Tensor| -> Vec<u32> { values(t).into_iter().map(f32::to_bits).collect() };
        for (relu, dims) in [(false, &[4usize, 16, 17, 5][..]), (true, &[3, 5, 7, 12])] {
            let [(x, _), (gamma, _), (beta, _)] = random_inputs(&mut rng, dims, device);
            let channels = channels_of(dims);
            let rm = Tensor::from_f32(vec![channels], rng.vec(channels), device).unwrap();
            let var: Vec<f32> = (0..channels).map(|_| 1.0 + rng.uniform()).collect();
            let rv = Tensor::from_f32(vec![channels], var, device).unwrap();
            let running = RunningStats {
                mean: &rm,
                var: &rv,
                momentum: 0.9,
            };
            let (y, stats, (mean, var)) = batch_norm_train_running(
                &x,
                &gamma,
                &beta,
                EPS,
                NormOutput::f32(relu.then_some(Activation::Relu)),
                running,
            )
            .unwrap();
            let train = if relu {
                batch_norm_relu_train
            } else {
                batch_norm_train
            };
            let (want_y, want_stats) = train(&x, &gamma, &beta, EPS).unwrap();
            let count = x.numel() / channels;
            let (want_mean, want_var) =
                update_running_stats(&rm, &rv, &want_stats, count, 0.9, EPS).unwrap();
            let ctx = format!("{dims:?}, relu {relu} (seed {})", rng.seed);
            assert_eq!(bits(&y), bits(&want_y), "y of {ctx}");
            assert_eq!(
                bits(&stats.inv_std),
                bits(&want_stats.inv_std),
                "inv_std of {ctx}"
            );
            assert_eq!(bits(&mean), bits(&want_mean), "running mean of {ctx}");
            assert_eq!(bits(&var), bits(&want_var), "running var of {ctx}");
            assert_ne!(bits(&mean), bits(&rm), "the running mean must move ({ctx})");
        }
    }
);

test_device!(
    running_stats_from_a_batch_use_unbiased_variance,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let dims = [5usize, 3, 7, 6];
        let channels = 6;
        let count = 5 * 3 * 7;
        let [(x, xs), (gamma, _), (beta, _)] = random_inputs(&mut rng, &dims, device);
        let (_, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
        let rm: Vec<f32> = (0..channels).map(|_| 2.0 + rng.uniform()).collect();
        let rv: Vec<f32> = (0..channels).map(|_| 1.0 + 0.5 * rng.uniform()).collect();
        let momentum = 0.8f32;
        let (new_mean, new_var) = update_running_stats(
            &Tensor::from_f32(vec![channels], rm.clone(), device).unwrap(),
            &Tensor::from_f32(vec![channels], rv.clone(), device).unwrap(),
            &stats,
            count,
            momentum,
            EPS,
        )
        .unwrap();
        let (mean, var) = reference_stats(&wide(&xs), channels);
        let m = f64::from(momentum);
        let n = count as f64;
        let want_mean: Vec<f64> = (0..channels)
            .map(|c| m * f64::from(rm[c]) + (1.0 - m) * mean[c])
            .collect();
        let want_var: Vec<f64> = (0..channels)
            .map(|c| m * f64::from(rv[c]) + (1.0 - m) * var[c] * n / (n - 1.0))
            .collect();
        let mean_err = max_relative(&values(&new_mean), &want_mean);
        let var_err = max_relative(&values(&new_var), &want_var);
        assert!(
            mean_err <= BOUND && var_err <= BOUND,
            "running mean error {mean_err:e}, var error {var_err:e} (seed {})",
            rng.seed
        );
    }
);

test_device!(bad_operands_are_typed_errors, |device: &Device| {
    let mut rng = Rng::fresh();
    let [(x, xs), (gamma, _), (beta, _)] = random_inputs(&mut rng, &[2, 3, 3, 4], device);
    let f32s = |dims: Vec<usize>| {
        let len = dims.iter().product();
        Tensor::from_f32(dims, offset_data(&mut Rng::fresh(), len), device).unwrap()
    };
    let shape_mismatch = |r: Result<(), AetherError>, expected: &[usize], actual: &[usize]| match r
    {
        Err(AetherError::ShapeMismatch {
            expected: e,
            actual: a,
            ..
        }) => assert!(e == expected && a == actual, "{e:?} / {a:?}"),
        Err(other) => panic!("expected ShapeMismatch, got {other}"),
        Ok(_) => panic!("expected ShapeMismatch, got a result"),
    };
    let invalid = |r: Result<(), AetherError>, needle: &str| match r {
        Err(e @ AetherError::InvalidShape { .. }) => {
            assert!(e.to_string().contains(needle), "{e}")
        }
        Err(other) => panic!("expected InvalidShape, got {other}"),
        Ok(_) => panic!("expected InvalidShape, got a result"),
    };

    // gamma of the wrong length, or [1, C] instead of [C].
    shape_mismatch(
        batch_norm_train(&x, &f32s(vec![5]), &beta, EPS).map(|_| ()),
        &[4],
        &[5],
    );
    shape_mismatch(
        batch_norm_train(&x, &f32s(vec![1, 4]), &beta, EPS).map(|_| ()),
        &[4],
        &[1, 4],
    );
    shape_mismatch(
        batch_norm_inference(&x, &gamma, &beta, &f32s(vec![3]), &f32s(vec![4]), EPS).map(|_| ()),
        &[4],
        &[3],
    );
    let (_, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
    shape_mismatch(
        batch_norm_backward(&f32s(vec![2, 3, 4, 3]), &x, &gamma, &stats).map(|_| ()),
        &[2, 3, 3, 4],
        &[2, 3, 4, 3],
    );
    shape_mismatch(
        batch_norm_backward(&x, &x, &f32s(vec![3]), &stats).map(|_| ()),
        &[4],
        &[3],
    );
    shape_mismatch(
        update_running_stats(&f32s(vec![4]), &f32s(vec![5]), &stats, 18, 0.9, EPS).map(|_| ()),
        &[4],
        &[5],
    );

    // Wrong dtypes: u32 input, f16 gamma.
    let x_u32 = Tensor::from_u32(vec![2, 3, 3, 4], vec![1; 72], device).unwrap();
    invalid(
        batch_norm_train(&x_u32, &gamma, &beta, EPS).map(|_| ()),
        "U32",
    );
    let halves: Vec<half::f16> = (0..4).map(|i| half::f16::from_f32(i as f32)).collect();
    let gamma_f16 = Tensor::from_f16(vec![4], halves, device).unwrap();
    invalid(
        batch_norm_train(&x, &gamma_f16, &beta, EPS).map(|_| ()),
        "F16",
    );
    invalid(
        batch_norm_backward(&x, &x, &gamma_f16, &stats).map(|_| ()),
        "F16",
    );

    // No batch axis, and too few values for an unbiased variance.
    let flat = Tensor::from_f32(vec![xs.len()], xs.clone(), device).unwrap();
    invalid(
        batch_norm_train(&flat, &gamma, &beta, EPS).map(|_| ()),
        "rank",
    );
    invalid(
        update_running_stats(&f32s(vec![4]), &f32s(vec![4]), &stats, 1, 0.9, EPS).map(|_| ()),
        "at least 2",
    );
});

test_device!(
    operands_on_different_devices_are_rejected,
    |device: &Device| {
        let other = match device {
            Device::Cpu => match common::gpu() {
                Some(gpu) => gpu,
                None => return,
            },
            Device::Gpu(_) => Device::Cpu,
        };
        let mut rng = Rng::fresh();
        let dims = [3usize, 5];
        let [(x, _), (gamma, _), (beta, _)] = random_inputs(&mut rng, &dims, device);
        let [(x_other, _), (gamma_other, _), (beta_other, _)] =
            random_inputs(&mut rng, &dims, &other);
        let mismatch = |r: Result<(), AetherError>, what: &str| match r {
            Err(AetherError::DeviceMismatch { op, .. }) => {
                assert!(what.starts_with(op), "{what}: op {op}")
            }
            Err(e) => panic!("{what}: expected DeviceMismatch, got {e}"),
            Ok(()) => panic!("{what}: expected DeviceMismatch, got a result"),
        };
        mismatch(
            batch_norm_train(&x, &gamma_other, &beta, EPS).map(|_| ()),
            "batch_norm_train (gamma)",
        );
        mismatch(
            batch_norm_train(&x, &gamma, &beta_other, EPS).map(|_| ()),
            "batch_norm_train (beta)",
        );
        mismatch(
            batch_norm_inference(&x_other, &gamma, &beta, &gamma, &gamma, EPS).map(|_| ()),
            "batch_norm_inference",
        );
        let (_, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
        let (_, stats_other) = batch_norm_train(&x_other, &gamma_other, &beta_other, EPS).unwrap();
        mismatch(
            batch_norm_backward(&x, &x, &gamma, &stats_other).map(|_| ()),
            "batch_norm_backward",
        );
        mismatch(
            update_running_stats(&gamma, &gamma_other, &stats, 3, 0.9, EPS).map(|_| ()),
            "update_running_stats (running_var)",
        );
        mismatch(
            update_running_stats(&gamma, &beta, &stats_other, 3, 0.9, EPS).map(|_| ()),
            "update_running_stats (stats)",
        );
    }
);

/// Equal element for element, or a panic naming the first difference (not
/// the whole vectors).
fn same<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "length of {what}");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: element {i} is {:?}, want {:?}", got[i], want[i]);
    }
}

test_device!(
    f16_outputs_and_dx_are_the_f32_ones_rounded,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let rounded = |t: &Tensor| -> Vec<u16> {
            values(t)
                .into_iter()
                .map(|v| f16::from_f32(aether::conv::clip_f16_range(v)).to_bits())
                .collect()
        };
        // IEEE arithmetic leaves a NaN's sign and payload open, and two
        // kernels (or one compiled twice) may differ there: every NaN is one.
        let bits = |t: &Tensor| -> Vec<u32> {
            values(t)
                .into_iter()
                .map(|v| {
                    if v.is_nan() {
                        f32::NAN.to_bits()
                    } else {
                        v.to_bits()
                    }
                })
                .collect()
        };
        // 8 channels spanning chunks (two f16 lanes per word, odd row count),
        // 12 channels in one chunk.
        for dims in [&[2usize, 19, 17, 8][..], &[3, 5, 7, 12]] {
            let [(_, mut xs), (_, mut gs), (_, mut bs)] = random_inputs(&mut rng, dims, device);
            let channels = channels_of(dims);
            // Channel 0 overflows f16 (to inf), channel 1 lands in its subnormals
            // and below (positive values that round to +0, whose gradient
            // still passes ReLU), channel 2 carries a NaN to y.
            (gs[0], gs[1], bs[1]) = (1e6, 3e-8, 0.0);
            xs[2] = f32::NAN;
            let x = Tensor::from_f32(dims.to_vec(), xs.clone(), device).unwrap();
            let gamma = Tensor::from_f32(vec![channels], gs, device).unwrap();
            let beta = Tensor::from_f32(vec![channels], bs, device).unwrap();
            let dy = Tensor::from_f32(dims.to_vec(), rng.vec(xs.len()), device).unwrap();
            let rm = Tensor::from_f32(vec![channels], rng.vec(channels), device).unwrap();
            let var: Vec<f32> = (0..channels).map(|_| 1.0 + rng.uniform()).collect();
            let rv = Tensor::from_f32(vec![channels], var, device).unwrap();
            for relu in [false, true] {
                let ctx = format!("{dims:?}, relu {relu} (seed {})", rng.seed);
                let half_out = NormOutput {
                    activation: relu.then_some(Activation::Relu),
                    dtype: DType::F16,
                };
                let running = RunningStats {
                    mean: &rm,
                    var: &rv,
                    momentum: 0.9,
                };
                let (y16, stats, _) =
                    batch_norm_train_running(&x, &gamma, &beta, EPS, half_out, running).unwrap();
                let running = RunningStats {
                    momentum: 0.9,
                    ..running
                };
                let (y32, stats32, _) = batch_norm_train_running(
                    &x,
                    &gamma,
                    &beta,
                    EPS,
                    NormOutput::f32(relu.then_some(Activation::Relu)),
                    running,
                )
                .unwrap();
                same(
                    &halves(&y16),
                    &rounded(&y32),
                    &format!("training y of {ctx}"),
                );
                assert_eq!(
                    bits(&stats.inv_std),
                    bits(&stats32.inv_std),
                    "inv_std of {ctx}"
                );
                let y16_wide = values(&y16);
                let flushed = y16_wide
                    .iter()
                    .zip(values(&y32))
                    .filter(|&(&h, f)| h == 0.0 && f > 0.0)
                    .count();
                assert!(flushed > 0, "no positive y rounded to +0 in {ctx}");
                // Past f16's range the output saturates (issue 37), never inf.
                let saturated = y16_wide.iter().filter(|v| v.abs() == 65504.0).count();
                assert!(saturated > 0, "no y saturated in {ctx}");
                assert!(y16_wide.iter().all(|v| !v.is_infinite()), "{ctx}");

                let inferred =
                    batch_norm_inference_as(&x, &gamma, &beta, &rm, &rv, EPS, half_out).unwrap();
                let want = batch_norm_inference_as(
                    &x,
                    &gamma,
                    &beta,
                    &rm,
                    &rv,
                    EPS,
                    NormOutput::f32(relu.then_some(Activation::Relu)),
                )
                .unwrap();
                same(
                    &halves(&inferred),
                    &rounded(&want),
                    &format!("inference y of {ctx}"),
                );

                // ReLU's gradient is taken at the f32 normalized value, as
                // the separate ReLU takes it at its input, whatever the
                // stored output rounded to (positive values flushed to +0
                // pass).
                let gated = if relu {
                    let (pre, _) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
                    relu_backward(&pre, &dy).unwrap()
                } else {
                    dy.clone()
                };
                let want = batch_norm_backward(&gated, &x, &gamma, &stats).unwrap();
                let gate = relu.then_some(FusedGrad {
                    activation: Activation::Relu,
                    beta: &beta,
                });
                let backward = |dx| batch_norm_backward_as(&dy, &x, &gamma, &stats, gate, dx);
                let got = backward(DType::F32).unwrap();
                for (name, a, b) in [
                    ("dx", &got.0, &want.0),
                    ("dgamma", &got.1, &want.1),
                    ("dbeta", &got.2, &want.2),
                ] {
                    same(&bits(a), &bits(b), &format!("{name} of {ctx}"));
                }
                // dx as f16: clipped and rounded as the conv's gradient cast.
                let got = backward(DType::F16).unwrap();
                let want_dx = cast_f16(&want.0, true).unwrap();
                same(
                    &halves(&got.0),
                    &halves(&want_dx),
                    &format!("f16 dx of {ctx}"),
                );
                let clipped = values(&want.0).iter().filter(|v| v.abs() > 65504.0).count();
                assert!(clipped > 0, "no dx beyond f16's range in {ctx}");
                same(
                    &bits(&got.1),
                    &bits(&want.1),
                    &format!("dgamma with f16 dx, {ctx}"),
                );
            }
        }
        // The GPU kernels pack f16 four channels at a time: 6 channels is a
        // typed error there, and works on the CPU.
        let dims = [2usize, 3, 5, 6];
        let [(x, _), (gamma, _), (beta, _)] = random_inputs(&mut rng, &dims, device);
        let out = NormOutput {
            activation: Some(Activation::Relu),
            dtype: DType::F16,
        };
        let result = batch_norm_inference_as(&x, &gamma, &beta, &beta, &gamma, EPS, out);
        match (device.gpu_context(), result) {
            (None, Ok(y)) => assert_eq!(y.dtype(), DType::F16),
            (Some(_), Err(AetherError::InvalidShape { op, reason, .. })) => {
                assert_eq!(op, "batch_norm_inference");
                assert!(reason.contains("divides by 4"), "{reason}");
            }
            (_, other) => panic!("f16 output with 6 channels on {}: {other:?}", device.name()),
        }
    }
);

// An epsilon or momentum out of range (NaN included) is refused by every op
// that takes one: a zero epsilon on a constant channel gave NaN outputs, a
// momentum of 2 extrapolated the running statistics, both without an error.
test_device!(
    hyperparameters_out_of_range_are_refused,
    |device: &Device| {
        let vector = |v: Vec<f32>| Tensor::from_f32(vec![2], v, device).unwrap();
        let x = Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 1.0, 3.0], device).unwrap();
        let (gamma, beta) = (vector(vec![1.0, 0.5]), vector(vec![0.0, 0.25]));
        let (mean, var) = (vector(vec![0.0, 1.0]), vector(vec![1.0, 2.0]));
        let refused = |result: Result<(), AetherError>, name: &str, what: &str| match result {
            Err(AetherError::InvalidHyperparameter { name: got, .. }) => {
                assert_eq!(got, name, "{what}")
            }
            other => panic!("{what}: expected InvalidHyperparameter {name}, got {other:?}"),
        };
        for eps in [0.0, -1e-3, f32::NAN, f32::INFINITY] {
            let what = format!("eps {eps}");
            let epsilon = "BatchNorm epsilon";
            refused(
                batch_norm_train(&x, &gamma, &beta, eps).map(drop),
                epsilon,
                &what,
            );
            let inference = batch_norm_inference(&x, &gamma, &beta, &mean, &var, eps);
            refused(inference.map(drop), epsilon, &what);
        }
        let (_, stats) = batch_norm_train(&x, &gamma, &beta, EPS).unwrap();
        for momentum in [f32::NAN, 2.0, -0.5] {
            let what = format!("momentum {momentum}");
            let update = update_running_stats(&mean, &var, &stats, 2, momentum, EPS);
            refused(update.map(drop), "BatchNorm momentum", &what);
            let running = RunningStats {
                mean: &mean,
                var: &var,
                momentum,
            };
            let out = NormOutput::f32(None);
            let trained = batch_norm_train_running(&x, &gamma, &beta, EPS, out, running);
            refused(trained.map(drop), "BatchNorm momentum", &what);
        }
    }
);
