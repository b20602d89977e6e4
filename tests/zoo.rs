//! The zoo's building blocks for airbench94: identity-initialised convs, the
//! whitening kernel computed from data, and the network's size and shapes.

mod common;

use aether::Model;
use aether::conv::Padding;
use aether::nn::Conv2d;
use aether::zoo::{airbench94_net, whiten_first_conv, whitening_kernel};
use common::Rng;

#[test]
fn dirac_convs_start_as_the_identity_on_their_leading_filters() {
    let mut model = Model::new();
    model.add(Conv2d::new(5, (3, 3), Padding::Same).dirac(true));
    model.finalize(&[4, 4, 3]).unwrap();
    let kernel = model.tensors().unwrap()[0].1.to_vec_f32().unwrap();
    let at = |r: usize, s: usize, i: usize, o: usize| kernel[((r * 3 + s) * 3 + i) * 5 + o];
    for o in 0..3 {
        for (r, s, i) in
            (0..3).flat_map(|r| (0..3).flat_map(move |s| (0..3).map(move |i| (r, s, i))))
        {
            let want = if (r, s, i) == (1, 1, o) { 1.0 } else { 0.0 };
            assert_eq!(at(r, s, i, o), want, "filter {o} at ({r}, {s}, {i})");
        }
    }
    // The filters past the input's channels keep their He initialisation.
    let rest: Vec<f32> = (3..5)
        .flat_map(|o| (0..27).map(move |k| (k, o)))
        .map(|(k, o)| kernel[k * 5 + o])
        .collect();
    assert!(rest.iter().filter(|v| **v != 0.0).count() > 50, "{rest:?}");
    // Identity filters pass their channel through.
    let mut rng = Rng::fresh();
    let x = rng.vec(4 * 4 * 3);
    let y = model.predict(&x, 1, true).unwrap();
    let bias = model.tensors().unwrap()[1].1.to_vec_f32().unwrap();
    for p in 0..16 {
        for c in 0..3 {
            assert_eq!(y[p * 5 + c], x[p * 3 + c] + bias[c]);
        }
    }
}

#[test]
fn the_whitening_kernel_decorrelates_patches() {
    let mut rng = Rng::fresh();
    let (n, side) = (6usize, 12usize);
    // Correlated channels and neighbours: a smooth field plus channel mixes.
    let mut images = vec![0.0f32; n * side * side * 3];
    for img in 0..n {
        let field: Vec<f32> = rng.vec(side * side + side + 1);
        for y in 0..side {
            for x in 0..side {
                let base = field[y * side + x]
                    + 0.5 * field[y * side + x + 1]
                    + 0.3 * field[(y + 1) * side + x];
                for c in 0..3 {
                    let noise = rng.uniform();
                    images[((img * side + y) * side + x) * 3 + c] =
                        4.0 * (base * (1.0 + c as f32) + noise);
                }
            }
        }
    }
    let kernel = whitening_kernel(&images, side, 3, (2, 2)).unwrap();
    assert_eq!(kernel.len(), 12 * 24);
    // The first 12 filters' responses over every patch: covariance ~ identity
    // (the noise keeps every eigenvalue far above the 5e-4 floor, so each
    // lambda / (lambda + 5e-4) is 1 within 1e-3), the last 12 their negatives.
    let mut cov = vec![0.0f64; 144];
    let mut count = 0.0;
    for img in images.chunks_exact(side * side * 3) {
        for y in 0..side - 1 {
            for x in 0..side - 1 {
                let patch: Vec<f64> = (0..12)
                    .map(|k| {
                        let (r, s, c) = (k / 6, (k / 3) % 2, k % 3);
                        f64::from(img[((y + r) * side + x + s) * 3 + c])
                    })
                    .collect();
                let out: Vec<f64> = (0..12)
                    .map(|f| {
                        (0..12)
                            .map(|k| patch[k] * f64::from(kernel[k * 24 + f]))
                            .sum()
                    })
                    .collect();
                for a in 0..12 {
                    for b in 0..12 {
                        cov[a * 12 + b] += out[a] * out[b];
                    }
                }
                count += 1.0;
            }
        }
    }
    for a in 0..12 {
        for b in 0..12 {
            let want = if a == b { 1.0 } else { 0.0 };
            let got = cov[a * 12 + b] / count;
            assert!(
                (got - want).abs() < 1e-2,
                "cov[{a}][{b}] = {got} (seed {})",
                rng.seed
            );
        }
    }
    for k in 0..12 {
        for f in 0..12 {
            assert_eq!(kernel[k * 24 + f + 12], -kernel[k * 24 + f]);
        }
    }
    assert!(whitening_kernel(&images[1..], side, 3, (2, 2)).is_err());
    assert!(whitening_kernel(&images, side, 3, (13, 2)).is_err());
}

#[test]
fn airbench94_has_its_published_size_and_trains_a_step() {
    let mut model = airbench94_net(0);
    model.configure(
        aether::Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.2,
        },
        aether::optim::Adam::new(1e-3),
        aether::Metric::CategoricalAccuracy,
    );
    model.finalize(&[32, 32, 3]).unwrap();
    // Every PyTorch parameter (the whitening conv's included) but the
    // BatchNorms' frozen weights, which aether does not store.
    let params: usize = model
        .tensors()
        .unwrap()
        .iter()
        .filter(|(n, _)| !n.contains("running"))
        .map(|(_, t)| t.numel())
        .sum();
    assert_eq!(params, 1_971_640);
    let mut rng = Rng::fresh();
    let x = rng.vec(4 * 32 * 32 * 3);
    whiten_first_conv(&mut model, &x).unwrap();
    let y = [1u32, 4, 9, 0];
    let first = model.gradients(&x, &y).unwrap().loss;
    assert!(first.is_finite() && first > 0.0);
    model.train_batch(&x, &y).unwrap();
}
