//! Parameter groups (learning-rate and weight-decay multipliers by layer
//! kind or index, in the optimizer's segment table) and frozen layers, on
//! every device: each parameter's update against `-lr * lr_scale * (g +
//! wd * decay_scale * w)` computed from the step's own gradient; a frozen
//! front of the network runs no backward.

mod common;

use std::sync::{Arc, Mutex};

use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, Layer, LayerSpec, Mode, ReLU};
use aether::optim::{ParamGroup, Sgd};
use aether::{AetherError, Device, Loss, Metric, Model, Padding, Result, Tensor};
use common::Rng;

const LR: f32 = 0.05;
const WD: f32 = 0.01;

fn model(device: &Device) -> Model {
    let mut model = Model::new().seed(9);
    model.add(Conv2d::new(6, (3, 3), Padding::Same));
    model.add(BatchNorm::new(0.9, 1e-5));
    model.add(ReLU::default());
    model.add(Flatten::default());
    model.add(Dense::new(3));
    configured(model, device)
}

fn configured(mut model: Model, device: &Device) -> Model {
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Sgd::new(LR).weight_decay(WD),
        Metric::CategoricalAccuracy,
    );
    model.to(device).unwrap();
    model.finalize(&[5, 5, 2]).unwrap();
    model
}

fn values(model: &Model) -> Vec<(String, Vec<f32>)> {
    model
        .tensors()
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec_f32().unwrap()))
        .collect()
}

/// One step's change of every parameter against plain SGD's with the
/// multipliers `scales(name) = (lr_scale, decay_scale)`, within 1e-5
/// norm-relative per tensor plus the rounding of storing the new value in
/// f32 (one epsilon of each weight: a small gradient's update on a weight
/// near 1, BatchNorm's gamma, is otherwise below the bound's resolution).
fn check_step(model: &mut Model, x: &[f32], y: &[u32], scales: impl Fn(&str) -> (f32, f32)) {
    let grads = model.gradients(x, y).unwrap();
    let before = values(model);
    model.train_batch(x, y).unwrap();
    model.check_steps().unwrap();
    let after = values(model);
    for (name, g) in &grads.tensors {
        let (lr_scale, decay) = scales(name);
        let w0 = &before.iter().find(|(n, _)| n == name).unwrap().1;
        let w1 = &after.iter().find(|(n, _)| n == name).unwrap().1;
        let (mut diff, mut norm, mut rounding) = (0.0f64, 0.0f64, 0.0f64);
        for ((&g, &a), &b) in g.iter().zip(w0).zip(w1) {
            let want =
                -f64::from(LR * lr_scale) * (f64::from(g) + f64::from(WD * decay) * f64::from(a));
            diff += (f64::from(b) - f64::from(a) - want).powi(2);
            norm += want * want;
            rounding += (f64::from(f32::EPSILON) * f64::from(b)).powi(2);
        }
        let err = (diff / norm.max(1e-30)).sqrt();
        let bound = 1e-5 + (rounding / norm.max(1e-30)).sqrt();
        assert!(
            err < bound,
            "{name}: update off by {err:e} (bound {bound:e})"
        );
    }
}

test_device!(
    groups_set_each_parameters_lr_and_decay,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let x = rng.vec(4 * 5 * 5 * 2);
        let y = vec![0, 2, 1, 2];
        let mut model = model(device);
        // Defaults: every parameter at the base rate, BatchNorm's undecayed.
        check_step(&mut model, &x, &y, |name| {
            (
                1.0,
                if name.starts_with("layers.1.") {
                    0.0
                } else {
                    1.0
                },
            )
        });
        // airbench's BatchNorm biases, and the dense layer named by index; the
        // segment table is uploaded again since the multipliers changed.
        model
            .set_param_groups(vec![
                ParamGroup::kind("BatchNorm", Some("beta"))
                    .lr_scale(64.0)
                    .decay_scale(1.0 / 64.0),
                ParamGroup::layer(4, None).lr_scale(0.5).decay_scale(0.0),
                ParamGroup::kind("Conv2d", Some("bias")).lr_scale(2.0),
            ])
            .unwrap();
        check_step(&mut model, &x, &y, |name| match name {
            "layers.1.beta" => (64.0, 1.0 / 64.0),
            "layers.1.gamma" => (1.0, 0.0),
            "layers.0.bias" => (2.0, 1.0),
            n if n.starts_with("layers.4.") => (0.5, 0.0),
            _ => (1.0, 1.0),
        });
    }
);

test_device!(a_frozen_layer_keeps_its_parameters, |device: &Device| {
    let mut rng = Rng::fresh();
    let x = rng.vec(4 * 5 * 5 * 2);
    let y = vec![1, 0, 2, 1];
    let mut model = model(device);
    model.train_batch(&x, &y).unwrap();
    model.set_trainable(0, false).unwrap();
    assert!(!model.is_trainable(0) && model.is_trainable(1));
    // A group over a kind passes the frozen layer over.
    model
        .set_param_groups(vec![ParamGroup::kind("Conv2d", None).lr_scale(3.0)])
        .unwrap();
    let before = values(&model);
    for _ in 0..2 {
        model.train_batch(&x, &y).unwrap();
    }
    model.check_steps().unwrap();
    let after = values(&model);
    for ((name, a), (_, b)) in before.iter().zip(&after) {
        let frozen = name.starts_with("layers.0.");
        let trained = name.contains("kernel") || name.contains("bias") || name.contains("beta");
        if frozen {
            assert_eq!(a, b, "{name} is frozen");
        } else if trained {
            assert_ne!(a, b, "{name} trains");
        }
    }
    // Unfrozen, it trains again.
    model.set_trainable(0, true).unwrap();
    model.train_batch(&x, &y).unwrap();
    assert_ne!(values(&model)[0], after[0]);
});

#[test]
fn a_group_naming_a_frozen_layer_is_an_error_naming_it() {
    let mut model = model(&Device::Cpu);
    model.set_trainable(4, false).unwrap();
    let err = model
        .set_param_groups(vec![
            ParamGroup::kind("BatchNorm", None).lr_scale(2.0),
            ParamGroup::layer(4, Some("bias")).lr_scale(2.0),
        ])
        .err()
        .expect("refused");
    assert!(
        matches!(&err, AetherError::FrozenParameter { group: 1, param } if param.starts_with("layers.4.bias")),
        "{err}"
    );
    // The other order: the groups first, then the freeze.
    let mut model = self::model(&Device::Cpu);
    model
        .set_param_groups(vec![ParamGroup::layer(1, None).lr_scale(2.0)])
        .unwrap();
    let err = model.set_trainable(1, false).err().expect("refused");
    assert!(
        matches!(&err, AetherError::FrozenParameter { group: 0, param } if param.starts_with("layers.1.gamma")),
        "{err}"
    );
    assert!(model.is_trainable(1), "the refused freeze changed nothing");
    assert!(model.set_trainable(9, false).is_err(), "no layer 9");
    for bad in [f32::NAN, -1.0, f32::INFINITY] {
        let err = model
            .set_param_groups(vec![ParamGroup::kind("Dense", None).lr_scale(bad)])
            .err()
            .expect("refused");
        assert!(
            matches!(err, AetherError::InvalidHyperparameter { .. }),
            "{err}"
        );
        let err = model
            .set_param_groups(vec![ParamGroup::kind("Dense", None).decay_scale(bad)])
            .err()
            .expect("refused");
        assert!(err.to_string().contains("decay_scale"), "{err}");
    }
}

// AdamW's first step under groups, as PyTorch's AdamW takes a group's lr:
// `p -= lr * lr_scale * wd * decay_scale * p`, then
// `p -= lr_t * lr_scale * m / (sqrt(v) + eps)` with `m = 0.1 g`,
// `v = 0.001 g^2` and `lr_t = lr * sqrt(0.001) / 0.1`; within 1e-5
// norm-relative per tensor.
test_device!(
    adamw_groups_scale_the_decay_with_the_rate,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let x = rng.vec(4 * 5 * 5 * 2);
        let y = vec![2, 0, 1, 1];
        let mut model = model(device);
        model.configure(
            Loss::SoftmaxCrossEntropy {
                label_smoothing: 0.0,
            },
            aether::optim::Adam::adamw(LR, WD),
            Metric::CategoricalAccuracy,
        );
        model
            .set_param_groups(vec![
                ParamGroup::kind("BatchNorm", Some("beta"))
                    .lr_scale(4.0)
                    .decay_scale(0.5),
                ParamGroup::kind("Dense", Some("kernel")).lr_scale(0.25),
            ])
            .unwrap();
        let grads = model.gradients(&x, &y).unwrap();
        let before = values(&model);
        model.train_batch(&x, &y).unwrap();
        model.check_steps().unwrap();
        let after = values(&model);
        let (lr, wd) = (f64::from(LR), f64::from(WD));
        let lr_t = lr * (1.0f64 - 0.999).sqrt() / (1.0 - 0.9);
        for (name, g) in &grads.tensors {
            let (s, d) = match name.as_str() {
                "layers.1.beta" => (4.0, 0.5),
                "layers.1.gamma" => (1.0, 0.0),
                "layers.4.kernel" => (0.25, 1.0),
                _ => (1.0, 1.0),
            };
            let w0 = &before.iter().find(|(n, _)| n == name).unwrap().1;
            let w1 = &after.iter().find(|(n, _)| n == name).unwrap().1;
            let (mut diff, mut norm, mut rounding) = (0.0f64, 0.0f64, 0.0f64);
            for ((&g, &a), &b) in g.iter().zip(w0).zip(w1) {
                let (g, a) = (f64::from(g), f64::from(a));
                let (m, v) = (0.1 * g, 0.001 * g * g);
                let decayed = a - lr * s * wd * d * a;
                let want = decayed - lr_t * s * m / (v.sqrt() + 1e-7) - a;
                diff += (f64::from(b) - a - want).powi(2);
                norm += want * want;
                rounding += (f64::from(f32::EPSILON) * f64::from(b)).powi(2);
            }
            // As check_step: 1e-5 plus the f32 rounding of the stored weight.
            let err = (diff / norm.max(1e-30)).sqrt();
            let bound = 1e-5 + (rounding / norm.max(1e-30)).sqrt();
            assert!(
                err < bound,
                "{name}: update off by {err:e} (bound {bound:e})"
            );
        }
    }
);

/// A custom layer passing its input through, which records the `need_dx` of
/// every backward it is asked for.
struct Probe(Arc<Mutex<Vec<bool>>>);

impl Layer for Probe {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Custom {
            name: "Probe".into(),
            config: serde_json::Value::Null,
        }
    }
    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }
    fn forward(&mut self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        self.0.lock().unwrap().push(need_dx);
        Ok(need_dx.then(|| dy.clone()))
    }
}

/// [`model`] with a [`Probe`] at `at` (0: before the conv, 1: after it).
fn probed(device: &Device, at: usize) -> (Model, Arc<Mutex<Vec<bool>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut model = Model::new().seed(9);
    if at == 0 {
        model.add(Probe(calls.clone()));
    }
    model.add(Conv2d::new(6, (3, 3), Padding::Same));
    if at == 1 {
        model.add(Probe(calls.clone()));
    }
    model.add(BatchNorm::new(0.9, 1e-5));
    model.add(ReLU::default());
    model.add(Flatten::default());
    model.add(Dense::new(3));
    (configured(model, device), calls)
}

test_device!(a_frozen_front_runs_no_backward, |device: &Device| {
    let mut rng = Rng::fresh();
    let x = rng.vec(4 * 5 * 5 * 2);
    let y = vec![2, 0, 1, 1];
    let taken = |calls: &Arc<Mutex<Vec<bool>>>| std::mem::take(&mut *calls.lock().unwrap());
    // Probe, conv, BatchNorm, ...: the probe (which may train, as any custom
    // layer) is first, so it is asked for no input gradient.
    let (mut model, calls) = probed(device, 0);
    model.train_batch(&x, &y).unwrap();
    assert_eq!(taken(&calls), [false]);
    // The conv frozen, the probe before it still trains: the conv passes
    // the gradient through.
    model.set_trainable(1, false).unwrap();
    model.train_batch(&x, &y).unwrap();
    assert_eq!(taken(&calls), [false]);
    // Both frozen: neither runs a backward, and BatchNorm asks for no input
    // gradient; the conv keeps its weights, the rest train.
    model.set_trainable(0, false).unwrap();
    let before = values(&model);
    let grads = model.gradients(&x, &y).unwrap();
    assert!(taken(&calls).is_empty());
    assert!(
        grads
            .tensors
            .iter()
            .all(|(n, _)| !n.starts_with("layers.1."))
    );
    assert!(
        grads
            .tensors
            .iter()
            .any(|(n, _)| n.starts_with("layers.2."))
    );
    model.train_batch(&x, &y).unwrap();
    model.check_steps().unwrap();
    assert!(taken(&calls).is_empty());
    for ((name, a), (_, b)) in before.iter().zip(&values(&model)) {
        if name.starts_with("layers.1.") {
            assert_eq!(a, b, "{name} is frozen");
        } else if name.contains("kernel") || name.contains("beta") {
            assert_ne!(a, b, "{name} trains");
        }
    }
    // Conv, probe, ...: the frozen probe between the trained conv and the
    // rest passes the gradient through.
    let (mut model, calls) = probed(device, 1);
    model.set_trainable(1, false).unwrap();
    model.train_batch(&x, &y).unwrap();
    assert_eq!(taken(&calls), [true]);
});

test_device!(
    freezing_trains_the_rest_as_a_zero_learning_rate,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let x = rng.vec(4 * 5 * 5 * 2);
        let y = vec![1, 2, 0, 1];
        // The conv's backward skipped against the conv's backward run with
        // its updates at zero: the layers after it take the same steps.
        let mut frozen = model(device);
        frozen.set_trainable(0, false).unwrap();
        let mut still = model(device);
        still
            .set_param_groups(vec![ParamGroup::layer(0, None).lr_scale(0.0)])
            .unwrap();
        for _ in 0..3 {
            frozen.train_batch(&x, &y).unwrap();
            still.train_batch(&x, &y).unwrap();
        }
        let (a, b) = (values(&frozen), values(&still));
        assert_eq!(a, b);
        assert!(
            a.iter().zip(&values(&model(device))).any(|(a, b)| a != b),
            "the steps trained"
        );
    }
);

test_device!(freezing_keeps_the_optimizer_state, |device: &Device| {
    let mut rng = Rng::fresh();
    let x = rng.vec(4 * 5 * 5 * 2);
    let y = vec![0, 1, 2, 2];
    let with_momentum = || {
        let mut model = model(device);
        model.configure(
            Loss::SoftmaxCrossEntropy {
                label_smoothing: 0.0,
            },
            Sgd::new(LR).momentum(0.9).weight_decay(WD),
            Metric::CategoricalAccuracy,
        );
        model
    };
    let (mut frozen, mut still) = (with_momentum(), with_momentum());
    for model in [&mut frozen, &mut still] {
        for _ in 0..2 {
            model.train_batch(&x, &y).unwrap();
        }
    }
    let momentum = |model: &Model| {
        let state = model.optimizer().unwrap().state().unwrap().unwrap();
        state.buffers[0].1.clone()
    };
    let parked = momentum(&frozen);
    // The conv frozen against its updates at zero: the other layers keep
    // their momentum through the freeze, so they take the same steps.
    frozen.set_trainable(0, false).unwrap();
    still
        .set_param_groups(vec![ParamGroup::layer(0, None).lr_scale(0.0)])
        .unwrap();
    for model in [&mut frozen, &mut still] {
        for _ in 0..2 {
            model.train_batch(&x, &y).unwrap();
        }
    }
    assert_eq!(values(&frozen), values(&still));
    // Thawed, the conv's momentum is the one it had at the freeze, moved by
    // this step's gradient: 0.9 * b + g + wd * w.
    frozen.set_trainable(0, true).unwrap();
    let grads = frozen.gradients(&x, &y).unwrap();
    let weights = values(&frozen);
    frozen.train_batch(&x, &y).unwrap();
    let after = momentum(&frozen);
    for (k, name) in ["layers.0.kernel", "layers.0.bias"].iter().enumerate() {
        let g = &grads.tensors.iter().find(|(n, _)| n == name).unwrap().1;
        let w = &weights.iter().find(|(n, _)| n == name).unwrap().1;
        let (mut diff, mut norm) = (0.0f64, 0.0f64);
        for (((&b, &g), &w), &got) in parked[k].iter().zip(g).zip(w).zip(&after[k]) {
            let want = 0.9 * f64::from(b) + f64::from(g) + f64::from(WD) * f64::from(w);
            diff += (f64::from(got) - want).powi(2);
            norm += want * want;
        }
        let err = (diff / norm).sqrt();
        assert!(err < 1e-5, "{name}: momentum off by {err:e}");
    }
});
