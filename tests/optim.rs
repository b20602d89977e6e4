//! Adam / AdamW and the regularization loss against an f64 reference written
//! here, on every device. Bound: 1e-5 norm-relative after three steps.

mod common;

use aether::optim::{Adam, Param, regularization_loss};
use aether::{AetherError, Device, Tensor};
use common::Rng;

const BOUND: f64 = 1e-5;

/// (len, l1, l2, decays) of each parameter: odd sizes, one without decay (a BatchNorm).
const LAYOUT: [(usize, f32, f32, bool); 3] = [
    (301, 1e-3, 0.0, true),
    (7, 0.0, 5e-3, true),
    (33, 0.0, 0.0, false),
];

/// Parameter 1's new value after the first step, in [`run`]'s replacement case.
const REPLACED: usize = 1;

/// `replacement`, when given, becomes parameter [`REPLACED`] after the first step.
fn reference_adam(
    params: &mut [Vec<f64>],
    grads: &[Vec<Vec<f64>>],
    lr: f64,
    wd: f64,
    replacement: Option<&[f32]>,
) {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-7f64);
    let mut m: Vec<Vec<f64>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut v = m.clone();
    for (step, grads) in grads.iter().enumerate() {
        let t = (step + 1) as i32;
        let lr_t = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        for (k, p) in params.iter_mut().enumerate() {
            let (_, l1, l2, decays) = LAYOUT[k];
            for i in 0..p.len() {
                let sign = if p[i] > 0.0 {
                    1.0
                } else if p[i] < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                let g = grads[k][i] + f64::from(l1) * sign + 2.0 * f64::from(l2) * p[i];
                m[k][i] = b1 * m[k][i] + (1.0 - b1) * g;
                v[k][i] = b2 * v[k][i] + (1.0 - b2) * g * g;
                if decays {
                    p[i] -= lr * wd * p[i];
                }
                p[i] -= lr_t * m[k][i] / (v[k][i].sqrt() + eps);
            }
        }
        if let (0, Some(new)) = (step, replacement) {
            params[REPLACED] = new.iter().map(|&x| f64::from(x)).collect();
        }
    }
}

/// Three steps against the reference. With `replace`, parameter [`REPLACED`]
/// is swapped for a new tensor after the first step, as loading a checkpoint
/// does: on the GPU, where the optimizer has packed the parameters, the new
/// tensor must be copied into its segment, and the others must be unchanged.
fn run(device: &Device, weight_decay: f32, replace: bool) {
    let mut rng = Rng::fresh();
    let lr = 1e-2f32;
    let init: Vec<Vec<f32>> = LAYOUT.iter().map(|&(n, ..)| rng.vec(n)).collect();
    let grads: Vec<Vec<Vec<f32>>> = (0..3)
        .map(|_| LAYOUT.iter().map(|&(n, ..)| rng.vec(n)).collect())
        .collect();
    let replacement = replace.then(|| rng.vec(LAYOUT[REPLACED].0));
    let mut values: Vec<Tensor> = init
        .iter()
        .map(|v| Tensor::from_f32(vec![v.len()], v.clone(), device).unwrap())
        .collect();
    let mut adam = Adam::adamw(lr, weight_decay);
    for (step, step_grads) in grads.iter().enumerate() {
        if let (1, Some(new)) = (step, &replacement) {
            values[REPLACED] = Tensor::from_f32(vec![new.len()], new.clone(), device).unwrap();
        }
        let grad_tensors: Vec<Tensor> = step_grads
            .iter()
            .map(|g| Tensor::from_f32(vec![g.len()], g.clone(), device).unwrap())
            .collect();
        let mut params: Vec<Param> = values
            .iter_mut()
            .zip(&grad_tensors)
            .zip(LAYOUT)
            .map(|((value, grad), (_, l1, l2, decays))| Param {
                decay_scale: if decays { 1.0 } else { 0.0 },
                ..Param::new("p", value, grad).penalties(l1, l2)
            })
            .collect();
        adam.step(&mut params).unwrap();
    }
    let mut want: Vec<Vec<f64>> = init
        .iter()
        .map(|v| v.iter().map(|&x| f64::from(x)).collect())
        .collect();
    let grads64: Vec<Vec<Vec<f64>>> = grads
        .iter()
        .map(|s| {
            s.iter()
                .map(|g| g.iter().map(|&x| f64::from(x)).collect())
                .collect()
        })
        .collect();
    reference_adam(
        &mut want,
        &grads64,
        f64::from(lr),
        f64::from(weight_decay),
        replacement.as_deref(),
    );
    for (k, (got, want)) in values.iter().zip(&want).enumerate() {
        let got = got.to_vec_f32().unwrap();
        let (mut diff, mut norm) = (0.0, 0.0);
        for (g, w) in got.iter().zip(want) {
            diff += (f64::from(*g) - w).powi(2);
            norm += w * w;
        }
        let err = (diff / norm).sqrt();
        assert!(
            err <= BOUND,
            "param {k} (wd {weight_decay}): error {err:e} (seed {})",
            rng.seed
        );
        let moved = got.iter().zip(&init[k]).any(|(a, b)| a != b);
        assert!(moved, "param {k} did not change");
    }
    assert_eq!(adam.steps(), 3);
}

test_device!(adam_matches_reference, |device: &Device| run(
    device, 0.0, false
));
test_device!(
    adamw_matches_reference_and_skips_excluded_params,
    |device: &Device| run(device, 0.05, false)
);
test_device!(
    a_replaced_parameter_is_copied_into_its_packed_segment,
    |device: &Device| run(device, 0.05, true)
);

test_device!(
    regularization_loss_is_one_deterministic_reduction,
    |device: &Device| {
        let mut rng = Rng::fresh();
        // Over several workgroups (256 elements each), ending mid-workgroup.
        let a = rng.vec(1000);
        let b = rng.vec(77);
        let ta = Tensor::from_f32(vec![1000], a.clone(), device).unwrap();
        let tb = Tensor::from_f32(vec![7, 11], b.clone(), device).unwrap();
        let terms = [(&ta, 1e-3f32, 2e-3f32), (&tb, 0.0, 0.5)];
        let want: f64 = a
            .iter()
            .map(|&p| 1e-3 * f64::from(p).abs() + 2e-3 * f64::from(p).powi(2))
            .sum::<f64>()
            + b.iter().map(|&p| 0.5 * f64::from(p).powi(2)).sum::<f64>();
        let got = regularization_loss(&terms).unwrap().to_vec_f32().unwrap();
        assert_eq!(got.len(), 1);
        assert!(
            ((f64::from(got[0]) - want) / want).abs() <= BOUND,
            "{} vs {want} (seed {})",
            got[0],
            rng.seed
        );
        let again = regularization_loss(&terms).unwrap().to_vec_f32().unwrap();
        assert_eq!(
            got[0].to_bits(),
            again[0].to_bits(),
            "two runs must agree bit for bit"
        );
    }
);

test_device!(changed_parameter_sizes_are_an_error, |device: &Device| {
    let mut adam = Adam::new(1e-3);
    let g = Tensor::from_f32(vec![3], vec![0.1, -0.2, 0.3], device).unwrap();
    let mut v = Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0], device).unwrap();
    adam.step(&mut [Param::new("p", &mut v, &g)]).unwrap();
    let g2 = Tensor::from_f32(vec![2], vec![0.1, -0.2], device).unwrap();
    let mut v2 = Tensor::from_f32(vec![2], vec![1.0, 2.0], device).unwrap();
    let err = adam.step(&mut [Param::new("p", &mut v2, &g2)]).unwrap_err();
    assert!(
        err.to_string().contains("[3]") && err.to_string().contains("[2]"),
        "{err}"
    );
    let mut bad = Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0], device).unwrap();
    assert!(
        Adam::new(1e-3)
            .step(&mut [Param::new("p", &mut bad, &g2)])
            .is_err()
    );
});

/// A random tensor of each [`LAYOUT`] size on `device`.
fn random_layout(rng: &mut Rng, device: &Device) -> Vec<Tensor> {
    LAYOUT
        .iter()
        .map(|&(n, ..)| Tensor::from_f32(vec![n], rng.vec(n), device).unwrap())
        .collect()
}

/// Unregularised, decaying parameters `values` with gradients `grads`.
fn plain_params<'a>(values: &'a mut [Tensor], grads: &'a [Tensor]) -> Vec<Param<'a>> {
    values
        .iter_mut()
        .zip(grads)
        .map(|(value, grad)| Param::new("p", value, grad))
        .collect()
}

/// Parameters on two devices are an error naming both, whichever comes first,
/// and leave every parameter as it was.
#[test]
fn parameters_on_two_devices_are_an_error() {
    let Some(gpu) = common::gpu() else {
        return;
    };
    let mut rng = Rng::fresh();
    for order in [[&gpu, &Device::Cpu], [&Device::Cpu, &gpu]] {
        let grads: Vec<Tensor> = order
            .iter()
            .map(|d| Tensor::from_f32(vec![4], rng.vec(4), d).unwrap())
            .collect();
        let start: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(4)).collect();
        let mut values: Vec<Tensor> = order
            .iter()
            .zip(&start)
            .map(|(d, v)| Tensor::from_f32(vec![4], v.clone(), d).unwrap())
            .collect();
        let err = Adam::new(1e-3)
            .step(&mut plain_params(&mut values, &grads))
            .unwrap_err();
        assert!(matches!(err, AetherError::DeviceMismatch { .. }), "{err}");
        for (value, start) in values.iter().zip(&start) {
            assert_eq!(&value.to_vec_f32().unwrap(), start);
        }
    }
}

/// The whole step is one fused kernel after one finiteness check (a dispatch
/// cannot wait for its own workgroups), on a private context so other tests'
/// dispatches do not count.
#[test]
fn a_step_is_one_fused_dispatch_after_its_check() {
    if common::gpu().is_none() {
        return;
    }
    let device = Device::with_preference(
        aether::gpu::DevicePreference::Gpu,
        &common::test_gpu_options(),
    )
    .unwrap();
    let ctx = device.gpu_context().unwrap().clone();
    let mut rng = Rng::fresh();
    let grads = random_layout(&mut rng, &device);
    let mut values = random_layout(&mut rng, &device);
    let mut adam = Adam::new(1e-3);
    let before = ctx.dispatch_count();
    adam.step(&mut plain_params(&mut values, &grads)).unwrap();
    assert_eq!(
        ctx.dispatch_count() - before,
        2,
        "one finiteness check and one fused kernel for all parameters"
    );
}

/// On an adapter with f16, the step's f16 mirror of each parameter (what the
/// conv layers take as their weight operand) has exactly the bits `cast_f16`
/// gives the updated parameter.
#[test]
fn the_f16_mirror_matches_cast_f16_of_the_updated_parameters() {
    let Some(device) = common::gpu() else {
        return;
    };
    if !device.gpu_context().unwrap().caps().shader_f16 {
        return;
    }
    let mut rng = Rng::fresh();
    let mut values = random_layout(&mut rng, &device);
    let mut adam = Adam::new(1e-2);
    for _ in 0..2 {
        let grads = random_layout(&mut rng, &device);
        adam.step(&mut plain_params(&mut values, &grads)).unwrap();
    }
    let shadows = adam
        .param_shadows()
        .expect("an f16 mirror on an f16 adapter");
    assert_eq!(shadows.len(), values.len());
    for (k, (shadow, value)) in shadows.iter().zip(&values).enumerate() {
        assert_eq!(shadow.dims(), value.dims());
        let want = aether::conv::cast_f16(value, false)
            .unwrap()
            .to_vec_f16()
            .unwrap();
        let got = shadow.to_vec_f16().unwrap();
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "param {k}: mirror differs from cast_f16 (seed {})",
            rng.seed
        );
    }
}
