//! Activation backward passes and leaky ReLU against references written here
//! (bit-exact: each result is one correctly rounded f32 product or a copy), and
//! finite-difference gradient checks on the CPU path.

mod common;

use aether::ops::activation::{
    Activation, Smooth, activation_as, activation_backward_as, leaky_relu, leaky_relu_backward,
    relu_backward,
};
use aether::{AetherError, DType, Device, Tensor};
use common::Rng;

/// Odd: the last workgroup of 256 is partly empty.
const LEN: usize = 3 * 257 * 5 + 7;

/// Random data with the edge cases placed in: exact zeros of both signs and a NaN.
fn activation_inputs(rng: &mut Rng) -> Vec<f32> {
    let mut data = rng.vec(LEN);
    data[3] = 0.0;
    data[10] = -0.0;
    data[LEN - 1] = f32::NAN;
    data
}

/// Leaky ReLU from its definition, in f64 (a product of two f32s is exact in
/// f64, so one rounding gives the correctly rounded f32 result).
fn reference_leaky(x: f32, alpha: f32) -> f32 {
    let x = f64::from(x);
    (if x > 0.0 { x } else { f64::from(alpha) * x }) as f32
}

fn assert_bits_eq(got: &[f32], want: &[f32], inputs: &[f32], seed: u64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "at {i}: x={} got {g} want {w} (seed {seed})",
            inputs[i]
        );
    }
}

fn alpha_from(rng: &mut Rng) -> f32 {
    0.01 + 0.29 * (rng.uniform() + 1.0) / 2.0
}

test_device!(relu_backward_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    let xs = activation_inputs(&mut rng);
    let dys = rng.vec(LEN);
    let x = Tensor::from_f32(vec![LEN], xs.clone(), device).unwrap();
    let dy = Tensor::from_f32(vec![LEN], dys.clone(), device).unwrap();
    let got = relu_backward(&x, &dy).unwrap().to_vec_f32().unwrap();
    let want: Vec<f32> = xs
        .iter()
        .zip(&dys)
        .map(|(&v, &d)| if f64::from(v) > 0.0 { d } else { 0.0 })
        .collect();
    assert_bits_eq(&got, &want, &xs, rng.seed);
});

test_device!(leaky_relu_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    let alpha = alpha_from(&mut rng);
    let xs = activation_inputs(&mut rng);
    let x = Tensor::from_f32(vec![LEN], xs.clone(), device).unwrap();
    let got = leaky_relu(&x, alpha).unwrap().to_vec_f32().unwrap();
    let want: Vec<f32> = xs.iter().map(|&v| reference_leaky(v, alpha)).collect();
    assert_bits_eq(&got, &want, &xs, rng.seed);
    assert!(
        got[LEN - 1].is_nan(),
        "NaN passes through (seed {})",
        rng.seed
    );
});

test_device!(leaky_relu_backward_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    let alpha = alpha_from(&mut rng);
    let xs = activation_inputs(&mut rng);
    let dys = rng.vec(LEN);
    let x = Tensor::from_f32(vec![LEN], xs.clone(), device).unwrap();
    let dy = Tensor::from_f32(vec![LEN], dys.clone(), device).unwrap();
    let got = leaky_relu_backward(&x, &dy, alpha)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let want: Vec<f32> = xs
        .iter()
        .zip(&dys)
        .map(|(&v, &d)| {
            let d = f64::from(d);
            (if f64::from(v) > 0.0 {
                d
            } else {
                f64::from(alpha) * d
            }) as f32
        })
        .collect();
    assert_bits_eq(&got, &want, &xs, rng.seed);
});

/// Central differences of `sum(forward(x) * g)` in f64, one element at a time,
/// against `backward(x, g)`. Inputs keep |x| >= 0.1 and the step is 2^-4, so no
/// difference straddles the kink at 0; the only error is the f32 rounding of
/// `alpha * x` (<= 2^-24 relative, divided by the step), well below the bound.
fn check_gradient(
    name: &str,
    forward: impl Fn(&Tensor) -> Tensor,
    backward: impl Fn(&Tensor, &Tensor) -> Tensor,
) {
    const BOUND: f64 = 1e-5;
    let mut rng = Rng::fresh();
    let len = 101;
    let xs: Vec<f32> = rng
        .vec(len)
        .into_iter()
        .map(|u| u.signum() * (0.1 + 0.9 * u.abs()))
        .collect();
    let g = rng.vec(len);
    let loss = |xs: &[f32]| -> f64 {
        let x = Tensor::from_f32(vec![len], xs.to_vec(), &Device::Cpu).unwrap();
        let y = forward(&x).to_vec_f32().unwrap();
        y.iter()
            .zip(&g)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    };
    let step = 0.0625f32;
    let numeric: Vec<f64> = (0..len)
        .map(|i| {
            let (mut plus, mut minus) = (xs.clone(), xs.clone());
            plus[i] += step;
            minus[i] -= step;
            (loss(&plus) - loss(&minus)) / (f64::from(plus[i]) - f64::from(minus[i]))
        })
        .collect();
    let x = Tensor::from_f32(vec![len], xs.clone(), &Device::Cpu).unwrap();
    let dy = Tensor::from_f32(vec![len], g.clone(), &Device::Cpu).unwrap();
    let analytic = backward(&x, &dy).to_vec_f32().unwrap();
    let diff: f64 = numeric
        .iter()
        .zip(&analytic)
        .map(|(&n, &a)| (n - f64::from(a)).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = numeric.iter().map(|n| n * n).sum::<f64>().sqrt();
    assert!(norm > 0.0);
    assert!(
        diff / norm <= BOUND,
        "{name}: relative gradient error {} > {BOUND} (seed {})",
        diff / norm,
        rng.seed
    );
    assert!(xs.iter().any(|&v| v < 0.0) && xs.iter().any(|&v| v > 0.0));
}

#[test]
fn leaky_relu_backward_matches_finite_differences() {
    let alpha = alpha_from(&mut Rng::fresh());
    check_gradient(
        "leaky_relu",
        |x| leaky_relu(x, alpha).unwrap(),
        |x, dy| leaky_relu_backward(x, dy, alpha).unwrap(),
    );
}

#[test]
fn relu_backward_matches_finite_differences() {
    check_gradient(
        "relu",
        |x| aether::ops::relu(x).unwrap(),
        |x, dy| relu_backward(x, dy).unwrap(),
    );
}

test_device!(invalid_operands_are_typed_errors, |device: &Device| {
    let mut rng = Rng::fresh();
    let x = Tensor::from_f32(vec![3, 5, 7], rng.vec(105), device).unwrap();
    let other_shape = Tensor::from_f32(vec![3, 35], rng.vec(105), device).unwrap();
    let labels = Tensor::from_u32(vec![3, 5, 7], vec![2; 105], device).unwrap();
    for result in [
        relu_backward(&x, &other_shape),
        leaky_relu_backward(&x, &other_shape, 0.1),
    ] {
        match result {
            Err(AetherError::ShapeMismatch {
                expected, actual, ..
            }) => {
                assert_eq!((expected, actual), (vec![3, 5, 7], vec![3, 35]));
            }
            other => panic!("expected ShapeMismatch, got {other:?}"),
        }
    }
    for result in [
        relu_backward(&labels, &x),
        relu_backward(&x, &labels),
        leaky_relu(&labels, 0.1),
        leaky_relu_backward(&x, &labels, 0.1),
    ] {
        match result {
            Err(AetherError::InvalidShape { reason, .. }) => {
                assert!(reason.contains("F32"), "{reason}")
            }
            other => panic!("expected InvalidShape for U32, got {other:?}"),
        }
    }
    for alpha in [f32::NAN, f32::INFINITY] {
        assert!(matches!(
            leaky_relu(&x, alpha),
            Err(AetherError::InvalidShape { .. })
        ));
        assert!(matches!(
            leaky_relu_backward(&x, &x, alpha),
            Err(AetherError::InvalidShape { .. })
        ));
    }
    if device.gpu_context().is_some() {
        let host = Tensor::from_f32(vec![3, 5, 7], rng.vec(105), &Device::Cpu).unwrap();
        assert!(matches!(
            relu_backward(&x, &host),
            Err(AetherError::DeviceMismatch { .. })
        ));
        assert!(matches!(
            leaky_relu_backward(&host, &x, 0.1),
            Err(AetherError::DeviceMismatch { .. })
        ));
    }
});

/// ReLU, leaky ReLU at a random slope, GELU and SiLU.
fn every_activation(rng: &mut Rng) -> [Activation; 4] {
    [
        Activation::Relu,
        Activation::LeakyRelu(alpha_from(rng)),
        Activation::Smooth(Smooth::Gelu),
        Activation::Smooth(Smooth::Silu),
    ]
}

test_device!(
    an_f16_input_gradient_is_the_f32_one_cast_as_a_conv_casts_it,
    |device: &Device| {
        // For the conv before an activation: each activation's f16-storing
        // backward against the f32 one cast with the conv's clip, bit for
        // bit (NaNs included). dy carries values past f16's range, into its
        // subnormals and NaNs; LEN ends a group of eight mid-way.
        let mut rng = Rng::fresh();
        let x = activation_inputs(&mut rng);
        let mut dys: Vec<f32> = rng
            .vec(LEN)
            .iter()
            .enumerate()
            .map(|(i, v)| v * [1.0, 2e5, 1e-6][i % 3])
            .collect();
        // NaN gradients where x is positive too, which every activation passes.
        for i in (5..LEN).step_by(101) {
            dys[i] = f32::NAN;
        }
        let xt = Tensor::from_f32(vec![LEN], x, device).unwrap();
        let dy = Tensor::from_f32(vec![LEN], dys, device).unwrap();
        let halves = |t: &Tensor| -> Vec<u16> {
            assert_eq!(t.dtype(), DType::F16);
            t.to_vec_f16()
                .unwrap()
                .iter()
                .map(|h| h.to_bits())
                .collect()
        };
        for activation in every_activation(&mut rng) {
            let what = format!("{activation:?} (seed {})", rng.seed);
            let f32_dx = activation_backward_as(&xt, &dy, activation, DType::F32).unwrap();
            let f16_dx = activation_backward_as(&xt, &dy, activation, DType::F16).unwrap();
            let want = aether::conv::cast_f16(&f32_dx, true).unwrap();
            assert_eq!(halves(&f16_dx), halves(&want), "{what}");
            let wide = f16_dx.to_vec_f32().unwrap();
            assert!(
                wide.iter().any(|v| v.abs() == 65504.0),
                "nothing saturated: {what}"
            );
            assert!(wide.iter().any(|v| v.is_nan()), "no NaN kept: {what}");
        }
    }
);

test_device!(
    an_f16_output_is_the_f32_one_rounded_as_a_conv_rounds_its_input,
    |device: &Device| {
        // For a conv after an activation: each activation's f16-storing
        // forward against the f32 one clipped and rounded, bit for bit (NaN
        // and signed zeros included); x reaches past f16's range.
        let mut rng = Rng::fresh();
        let mut xs = activation_inputs(&mut rng);
        for i in (7..LEN).step_by(13) {
            xs[i] *= 1e5;
        }
        let x = Tensor::from_f32(vec![LEN], xs, device).unwrap();
        for activation in every_activation(&mut rng) {
            let what = format!("{activation:?} (seed {})", rng.seed);
            let y32 = activation_as(&x, activation, DType::F32).unwrap();
            let y16 = activation_as(&x, activation, DType::F16).unwrap();
            assert_eq!(y16.dtype(), DType::F16, "{what}");
            let want = aether::conv::cast_f16(&y32, true).unwrap();
            let bits = |t: &Tensor| -> Vec<u16> {
                t.to_vec_f16()
                    .unwrap()
                    .iter()
                    .map(|h| h.to_bits())
                    .collect()
            };
            assert_eq!(bits(&y16), bits(&want), "{what}");
            let wide = y16.to_vec_f32().unwrap();
            assert!(
                wide.iter().any(|v| v.abs() == 65504.0),
                "nothing saturated: {what}"
            );
        }
    }
);
