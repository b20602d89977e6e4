//! SGD (momentum, Nesterov, weight decay, parameter groups' multipliers)
//! against torch.optim.SGD step by step (numbers from
//! benches/sgd_reference.py, embedded so the test needs no torch) and against
//! an f64 reference on fresh random data with odd sizes, penalties and a loss
//! scale, on every device; bad hyperparameters; checkpoint and resume.

mod common;

use aether::gpu::DevicePreference;
use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, ReLU};
use aether::optim::{LossScale, LossScaler, Optimizer, Param, Sgd};
use aether::{AetherError, Device, Loss, Metric, Model, Padding, Tensor};
use common::{Rng, TempDir};

// Printed by `python3 benches/sgd_reference.py` (torch 2, float64).
const INIT: [&[f64]; 3] = [
    &[
        0.9673863649368286,
        0.6711342334747314,
        0.5168637633323669,
        0.3077144920825958,
        -0.09105002135038376,
    ],
    &[-0.2626803517341614, 1.8645352125167847, -0.6918936967849731],
    &[
        1.0249295234680176,
        0.6846888661384583,
        -0.7950971126556396,
        -1.61714506149292,
    ],
];
const GRADS_0: [&[f64]; 3] = [
    &[
        2.123649835586548,
        0.01677825301885605,
        0.7926217317581177,
        -1.1026723384857178,
        -0.8646219372749329,
    ],
    &[-2.008662223815918, 0.5090142488479614, 0.9614207148551941],
    &[
        0.7588948607444763,
        -0.50052410364151,
        -0.45969146490097046,
        0.1785692572593689,
    ],
];
const GRADS_1: [&[f64]; 3] = [
    &[
        -0.5299199819564819,
        -1.2542089223861694,
        0.8473296165466309,
        -0.6399151682853699,
        0.6473782062530518,
    ],
    &[-1.9435118436813354, 0.12122655659914017, 0.9740431308746338],
    &[
        -1.0239284038543701,
        -0.36825475096702576,
        -0.03207133710384369,
        0.6581790447235107,
    ],
];
const GRADS_2: [&[f64]; 3] = [
    &[
        -0.09983919560909271,
        0.30241698026657104,
        -1.2694191932678223,
        -0.8921035528182983,
        0.80730140209198,
    ],
    &[
        -0.3581618666648865,
        -0.7699035406112671,
        0.007723166141659021,
    ],
    &[
        -0.18659256398677826,
        1.4611481428146362,
        0.155416801571846,
        -0.11334273964166641,
    ],
];
const GRADS_3: [&[f64]; 3] = [
    &[
        0.2594994306564331,
        -0.44254085421562195,
        -0.9248363971710205,
        -0.42366042733192444,
        2.0107851028442383,
    ],
    &[
        -0.5907611846923828,
        -0.7326575517654419,
        -0.36099621653556824,
    ],
    &[
        -0.05571566894650459,
        0.32082101702690125,
        -0.48572397232055664,
        3.4062602519989014,
    ],
];
// NESTEROV: lr 0.1, weight_decay 0.005, {'momentum': 0.9, 'nesterov': True}
const WANT_NESTEROV: [&[f64]; 3] = [
    &[
        0.2537308953651701,
        1.0930702958459317,
        0.41849350418945724,
        1.2981113905115202,
        -0.560290696902377,
    ],
    &[6.494922258709402, 2.217416800998321, -3.300246822950245],
    &[
        1.1274360290703178,
        0.5593741607403754,
        -0.5456499265190958,
        -2.533092296950519,
    ],
];
// MOMENTUM: lr 0.1, weight_decay 0.01, {'momentum': 0.8, 'nesterov': False}
const WANT_MOMENTUM: [&[f64]; 3] = [
    &[
        0.4554165460626318,
        0.9561303669013392,
        0.3937061123551253,
        0.9885761743154272,
        -0.33980983089933225,
    ],
    &[4.4709683156458135, 1.9379104333794674, -2.5983619364902917],
    &[
        1.0899005195289848,
        0.6272089733600617,
        -0.6309734130144119,
        -2.1506787252128126,
    ],
];
// PLAIN: lr 0.1, weight_decay 0.01, {'momentum': 0.0, 'nesterov': False}
const WANT_PLAIN: [&[f64]; 3] = [
    &[
        0.7887041542030885,
        0.8059937287725533,
        0.5705098196913797,
        0.6117730274552653,
        -0.35081963082985934,
    ],
    &[1.685553309108535, 2.185398094242901, -1.306046514643473],
    &[
        1.0756637010723353,
        0.593369835615158,
        -0.7128901153802871,
        -2.0301116429269315,
    ],
];

/// A configuration made afresh for each use (an optimizer is not `Clone`).
type MakeSgd = fn() -> Sgd;

/// Norm-relative distance per tensor between f32 results and f64 references.
fn norm_rel(got: &[f32], want: &[f64]) -> f64 {
    let (mut diff, mut norm) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        diff += (f64::from(g) - w).powi(2);
        norm += w * w;
    }
    (diff / norm).sqrt()
}

fn tensors(values: &[&[f64]], device: &Device) -> Vec<Tensor> {
    values
        .iter()
        .map(|v| {
            let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            Tensor::from_f32(vec![v.len()], v, device).unwrap()
        })
        .collect()
}

/// The parameter groups of the reference: parameter 1 at 4x the learning
/// rate, parameter 2 without weight decay.
fn grouped<'a>(values: &'a mut [Tensor], grads: &'a [Tensor]) -> Vec<Param<'a>> {
    values
        .iter_mut()
        .zip(grads)
        .enumerate()
        .map(|(k, (value, grad))| {
            let p = Param::new("p", value, grad);
            match k {
                1 => Param { lr_scale: 4.0, ..p },
                2 => p.no_decay(),
                _ => p,
            }
        })
        .collect()
}

// Four steps of each configuration against PyTorch's, within 1e-6
// norm-relative per tensor (f32 against float64; measured below 1e-7).
test_device!(sgd_matches_pytorch_step_by_step, |device: &Device| {
    let grads = [GRADS_0, GRADS_1, GRADS_2, GRADS_3];
    for (name, sgd, want) in [
        (
            "nesterov",
            Sgd::new(0.1)
                .momentum(0.9)
                .nesterov(true)
                .weight_decay(5e-3),
            WANT_NESTEROV,
        ),
        (
            "momentum",
            Sgd::new(0.1).momentum(0.8).weight_decay(1e-2),
            WANT_MOMENTUM,
        ),
        ("plain", Sgd::new(0.1).weight_decay(1e-2), WANT_PLAIN),
    ] {
        let mut sgd = sgd;
        let mut values = tensors(&INIT, device);
        for step in &grads {
            let g = tensors(step, device);
            sgd.step_scaled(&mut grouped(&mut values, &g), None, None)
                .unwrap();
        }
        for (k, (got, want)) in values.iter().zip(want).enumerate() {
            let err = norm_rel(&got.to_vec_f32().unwrap(), want);
            assert!(err < 1e-6, "{name}: parameter {k} off by {err:e}");
        }
        assert_eq!(sgd.state().unwrap().unwrap().steps, 4);
    }
});

/// (len, l1, l2, decay_scale, lr_scale): odd sizes, penalties, a parameter
/// without decay and one at twice the learning rate.
const LAYOUT: [(usize, f32, f32, f32, f32); 3] = [
    (301, 1e-3, 0.0, 1.0, 1.0),
    (7, 0.0, 5e-3, 1.0, 2.0),
    (33, 0.0, 0.0, 0.0, 1.0),
];

/// PyTorch's rule in f64, with the layer penalties added to the gradient as
/// aether's update adds them.
fn reference_sgd(
    params: &mut [Vec<f64>],
    grads: &[Vec<Vec<f64>>],
    (lr, momentum, wd, nesterov): (f64, f64, f64, bool),
) {
    let mut b: Vec<Vec<f64>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    for grads in grads {
        for (k, p) in params.iter_mut().enumerate() {
            let (_, l1, l2, decay, lr_scale) = LAYOUT[k];
            for i in 0..p.len() {
                let sign = if p[i] > 0.0 {
                    1.0
                } else if p[i] < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                let mut g = grads[k][i]
                    + f64::from(l1) * sign
                    + 2.0 * f64::from(l2) * p[i]
                    + wd * f64::from(decay) * p[i];
                if momentum != 0.0 {
                    b[k][i] = momentum * b[k][i] + g;
                    g = if nesterov {
                        g + momentum * b[k][i]
                    } else {
                        b[k][i]
                    };
                }
                p[i] -= lr * f64::from(lr_scale) * g;
            }
        }
    }
}

// Five steps on fresh random data, the gradients of a loss scaled by 2^10
// (the step divides it out), within 1e-5 norm-relative per tensor of the
// f64 reference; every parameter moves. CPU and GPU alike.
test_device!(
    sgd_matches_the_f64_reference_on_random_data,
    |device: &Device| {
        for (lr, momentum, wd, nesterov) in
            [(0.05f32, 0.9f32, 1e-2f32, true), (0.1, 0.5, 0.0, false)]
        {
            let mut rng = Rng::fresh();
            let init: Vec<Vec<f32>> = LAYOUT.iter().map(|&(n, ..)| rng.vec(n)).collect();
            let grads: Vec<Vec<Vec<f32>>> = (0..5)
                .map(|_| LAYOUT.iter().map(|&(n, ..)| rng.vec(n)).collect())
                .collect();
            let mut scaler = LossScaler::new(LossScale::Static(1024.0), false, device)
                .unwrap()
                .unwrap();
            let mut sgd = Sgd::new(lr)
                .momentum(momentum)
                .nesterov(nesterov)
                .weight_decay(wd);
            let mut values: Vec<Tensor> = init
                .iter()
                .map(|v| Tensor::from_f32(vec![v.len()], v.clone(), device).unwrap())
                .collect();
            for step in &grads {
                let g: Vec<Tensor> = step
                    .iter()
                    .map(|g| {
                        let scaled = g.iter().map(|x| x * 1024.0).collect();
                        Tensor::from_f32(vec![g.len()], scaled, device).unwrap()
                    })
                    .collect();
                let mut params: Vec<Param> = values
                    .iter_mut()
                    .zip(&g)
                    .zip(LAYOUT)
                    .map(|((value, grad), (_, l1, l2, decay, lr_scale))| Param {
                        decay_scale: decay,
                        lr_scale,
                        ..Param::new("p", value, grad).penalties(l1, l2)
                    })
                    .collect();
                sgd.step_scaled(&mut params, None, Some(&mut scaler))
                    .unwrap();
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
            let hyper = (f64::from(lr), f64::from(momentum), f64::from(wd), nesterov);
            reference_sgd(&mut want, &grads64, hyper);
            for (k, (got, want)) in values.iter().zip(&want).enumerate() {
                let got = got.to_vec_f32().unwrap();
                let err = norm_rel(&got, want);
                assert!(err <= 1e-5, "param {k}: error {err:e} (seed {})", rng.seed);
                assert!(
                    got.iter().zip(&init[k]).all(|(a, b)| a != b),
                    "param {k} did not move"
                );
            }
        }
    }
);

// Out-of-range hyperparameters are typed errors naming the value, before
// anything changes: from a step and from a model's finalize.
test_device!(
    bad_hyperparameters_are_errors_naming_the_value,
    |device: &Device| {
        let cases: [(MakeSgd, &str); 7] = [
            (|| Sgd::new(-0.1), "SGD learning_rate = -0.1"),
            (|| Sgd::new(f32::NAN), "SGD learning_rate = NaN"),
            (|| Sgd::new(0.1).momentum(1.0), "SGD momentum = 1"),
            (|| Sgd::new(0.1).momentum(-0.5), "SGD momentum = -0.5"),
            (
                || Sgd::new(0.1).nesterov(true),
                "SGD momentum (with nesterov) = 0",
            ),
            (
                || Sgd::new(0.1).weight_decay(-1e-4),
                "SGD weight_decay = -0.0001",
            ),
            (
                || Sgd::new(0.1).weight_decay(f32::INFINITY),
                "SGD weight_decay = inf",
            ),
        ];
        for (make, text) in cases {
            let mut sgd = make();
            let mut values = tensors(&INIT, device);
            let before: Vec<Vec<f32>> = values.iter().map(|t| t.to_vec_f32().unwrap()).collect();
            let g = tensors(&GRADS_0, device);
            let err = sgd
                .step_scaled(&mut grouped(&mut values, &g), None, None)
                .unwrap_err();
            assert!(
                matches!(err, AetherError::InvalidHyperparameter { .. }),
                "{err}"
            );
            assert!(err.to_string().contains(text), "{text}: {err}");
            let after: Vec<Vec<f32>> = values.iter().map(|t| t.to_vec_f32().unwrap()).collect();
            assert_eq!(after, before, "{text}: a refused step changes nothing");
            let mut model = tiny_model(device, make());
            let err = model.finalize(&[4, 4, 2]).unwrap_err();
            assert!(err.to_string().contains(text), "{text} at finalize: {err}");
        }
    }
);

/// Switching momentum on after steps without it is an error, not a read past
/// a buffer that was never made.
#[test]
fn momentum_switched_on_midway_is_an_error() {
    let mut sgd = Sgd::new(0.1);
    let mut values = tensors(&INIT, &Device::Cpu);
    let g = tensors(&GRADS_0, &Device::Cpu);
    sgd.step_scaled(&mut grouped(&mut values, &g), None, None)
        .unwrap();
    sgd.momentum = 0.9;
    let err = sgd
        .step_scaled(&mut grouped(&mut values, &g), None, None)
        .unwrap_err();
    assert!(err.to_string().contains("momentum"), "{err}");
}

fn tiny_model(device: &Device, sgd: Sgd) -> Model {
    let mut model = Model::new().seed(5);
    model.add(Conv2d::new(4, (3, 3), Padding::Same).bias(false));
    model.add(BatchNorm::new(0.9, 1e-5));
    model.add(ReLU::default());
    model.add(Flatten::default());
    model.add(Dense::new(3));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.1,
        },
        sgd,
        Metric::CategoricalAccuracy,
    );
    model.to(device).unwrap();
    model
}

// Three steps, a checkpoint, `Model::resume` and three more are six steps
// straight, bit for bit, with the momentum buffer (`optimizer.momentum.{k}`
// in the file) carried over; plain SGD, which keeps none, likewise.
test_device!(sgd_state_survives_a_checkpoint, |device: &Device| {
    let dir = TempDir::new(match device {
        Device::Cpu => "sgd-resume-cpu",
        Device::Gpu(_) => "sgd-resume-gpu",
    });
    let mut rng = Rng::fresh();
    let x = rng.vec(6 * 4 * 4 * 2);
    let y: Vec<u32> = (0..6).map(|i| i % 3).collect();
    let configs: [MakeSgd; 2] = [
        || {
            Sgd::new(0.05)
                .momentum(0.9)
                .nesterov(true)
                .weight_decay(5e-4)
        },
        || Sgd::new(0.05),
    ];
    for make in configs {
        let train = |model: &mut Model, steps| {
            for _ in 0..steps {
                model.train_batch(&x, &y).unwrap();
            }
        };
        let mut straight = tiny_model(device, make());
        straight.finalize(&[4, 4, 2]).unwrap();
        train(&mut straight, 6);
        let mut first = tiny_model(device, make());
        first.finalize(&[4, 4, 2]).unwrap();
        train(&mut first, 3);
        let path = dir.0.join("sgd.aether");
        first.save(&path).unwrap();
        let file = std::fs::read(&path).unwrap();
        let names = safetensors::SafeTensors::deserialize(&file)
            .unwrap()
            .names()
            .len();
        let momentum = make().momentum > 0.0;
        let has_buffer = safetensors::SafeTensors::deserialize(&file)
            .unwrap()
            .tensor("optimizer.momentum.0")
            .is_ok();
        assert_eq!(has_buffer, momentum, "{names} tensors");
        let mut resumed = Model::resume(&path, device).unwrap();
        match resumed.optimizer() {
            Some(Optimizer::Sgd(s)) => assert_eq!(
                (s.learning_rate, s.momentum, s.nesterov, s.weight_decay),
                (
                    make().learning_rate,
                    make().momentum,
                    make().nesterov,
                    make().weight_decay
                )
            ),
            _ => panic!("resumed as another optimizer"),
        }
        train(&mut resumed, 3);
        let bits = |m: &Model| -> Vec<(String, Vec<u32>)> {
            m.tensors()
                .unwrap()
                .into_iter()
                .map(|(n, t)| (n, common::f32_bits(&t)))
                .collect()
        };
        assert!(
            bits(&resumed) == bits(&straight),
            "momentum {momentum}: resumed differs"
        );
    }
});

/// On the GPU a step over all parameters is one finiteness check and one
/// fused update; a model's loss scaler adds its one-invocation update.
#[test]
fn a_step_is_one_fused_dispatch_after_its_check() {
    if common::gpu().is_none() {
        return;
    }
    // A device of this test's own: the shared one counts the dispatches of
    // the tests running beside this one too.
    let device =
        Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap();
    let ctx = device.gpu_context().unwrap().clone();
    let mut sgd = Sgd::new(0.1).momentum(0.9).nesterov(true);
    let mut values = tensors(&INIT, &device);
    let g = tensors(&GRADS_0, &device);
    let mut scaler = LossScaler::new(LossScale::Static(1.0), false, &device)
        .unwrap()
        .unwrap();
    for (scaled, want) in [(false, 2), (true, 3)] {
        let before = ctx.dispatch_count();
        let scaler = scaled.then_some(&mut scaler);
        sgd.step_scaled(&mut grouped(&mut values, &g), None, scaler)
            .unwrap();
        assert_eq!(ctx.dispatch_count() - before, want, "scaled {scaled}");
    }
}
