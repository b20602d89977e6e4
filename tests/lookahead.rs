//! Lookahead of the weights (airbench's LookaheadState): a model keeping one
//! against the same model whose average is kept by hand in f32 (torch.lerp's
//! formula) and written back with `set_tensors`, on every device.

mod common;

use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, ReLU};
use aether::optim::{Lookahead, Sgd};
use aether::{AetherError, Device, Loss, Metric, Model, Padding};
use common::{Rng, TempDir};

fn model(device: &Device) -> Model {
    let mut model = Model::new().seed(21);
    model.add(Conv2d::new(5, (3, 3), Padding::Same).bias(false));
    model.add(BatchNorm::new(0.9, 1e-5));
    model.add(ReLU::default());
    model.add(Flatten::default());
    model.add(Dense::new(3));
    // Plain SGD keeps no state, so writing the weights by hand between
    // steps loses nothing.
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.1,
        },
        Sgd::new(0.1).weight_decay(1e-3),
        Metric::CategoricalAccuracy,
    );
    model.to(device).unwrap();
    model.finalize(&[5, 5, 2]).unwrap();
    model
}

/// The trained parameters (running statistics left out).
fn params(model: &Model) -> Vec<(String, Vec<f32>)> {
    model
        .tensors()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| !n.contains("running"))
        .map(|(n, t)| (n, t.to_vec_f32().unwrap()))
        .collect()
}

fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

// Seven steps with an update every third step at decay 0.6 against the
// hand-kept average, within 1e-6 norm-relative per tensor (the GPU may fuse
// the lerp's multiply-add); the lookahead moves the weights (it is not the
// plain run), and a bad setting is a typed error.
test_device!(lookahead_matches_a_hand_kept_average, |device: &Device| {
    let mut rng = Rng::fresh();
    let x = rng.vec(6 * 5 * 5 * 2);
    let y = vec![0, 1, 2, 2, 1, 0];
    let setting = Lookahead {
        every: 3,
        decay: 0.6,
    };
    let mut kept = model(device);
    kept.set_lookahead(Some(setting)).unwrap();
    let mut by_hand = model(device);
    let mut plain = model(device);
    let mut average = params(&by_hand);
    for step in 1..=7u32 {
        kept.train_batch(&x, &y).unwrap();
        plain.train_batch(&x, &y).unwrap();
        by_hand.train_batch(&x, &y).unwrap();
        if step % setting.every == 0 {
            let now = params(&by_hand);
            for ((_, e), (_, w)) in average.iter_mut().zip(&now) {
                for (e, &w) in e.iter_mut().zip(w) {
                    *e = lerp(*e, w, 1.0 - setting.decay);
                }
            }
            by_hand.set_tensors(&average).unwrap();
        }
    }
    kept.check_steps().unwrap();
    let (got, want, unpulled) = (params(&kept), params(&by_hand), params(&plain));
    for (((name, g), (_, w)), (_, p)) in got.iter().zip(&want).zip(&unpulled) {
        let (mut diff, mut norm, mut apart) = (0.0f64, 0.0f64, 0.0f64);
        for ((&g, &w), &p) in g.iter().zip(w).zip(p) {
            diff += (f64::from(g) - f64::from(w)).powi(2);
            norm += f64::from(w).powi(2);
            apart += (f64::from(g) - f64::from(p)).powi(2);
        }
        let err = (diff / norm).sqrt();
        assert!(err < 1e-6, "{name}: off by {err:e} (seed {})", rng.seed);
        assert!(
            (apart / norm).sqrt() > 1e-4,
            "{name}: the lookahead changed nothing"
        );
    }
    for bad in [
        Lookahead {
            every: 0,
            decay: 0.5,
        },
        Lookahead {
            every: 5,
            decay: 1.5,
        },
        Lookahead {
            every: 5,
            decay: f32::NAN,
        },
    ] {
        let err = kept.set_lookahead(Some(bad)).err().expect("refused");
        assert!(
            matches!(err, AetherError::InvalidHyperparameter { .. }),
            "{bad:?}: {err}"
        );
    }
});

// Three steps, a checkpoint, `Model::resume` (the lookahead set again: it
// is a training setting, not saved) and four more are seven steps
// straight, bit for bit: the file carries the average
// (`optimizer.lookahead.{k}`), which the resumed steps continue from.
test_device!(the_average_survives_a_checkpoint, |device: &Device| {
    let dir = TempDir::new(match device {
        Device::Cpu => "lookahead-cpu",
        Device::Gpu(_) => "lookahead-gpu",
    });
    let mut rng = Rng::fresh();
    let x = rng.vec(6 * 5 * 5 * 2);
    let y = vec![2, 1, 0, 0, 1, 2];
    let setting = Some(Lookahead {
        every: 2,
        decay: 0.7,
    });
    let bits = |m: &Model| -> Vec<Vec<u32>> {
        m.tensors()
            .unwrap()
            .into_iter()
            .map(|(_, t)| common::f32_bits(&t))
            .collect()
    };
    let mut straight = model(device);
    straight.set_lookahead(setting).unwrap();
    for _ in 0..7 {
        straight.train_batch(&x, &y).unwrap();
    }
    let mut first = model(device);
    first.set_lookahead(setting).unwrap();
    // Between two updates, where the average and the weights differ.
    for _ in 0..3 {
        first.train_batch(&x, &y).unwrap();
    }
    let path = dir.0.join("lookahead.aether");
    first.save(&path).unwrap();
    let file = std::fs::read(&path).unwrap();
    let names = safetensors::SafeTensors::deserialize(&file)
        .unwrap()
        .names()
        .len();
    assert!(
        safetensors::SafeTensors::deserialize(&file)
            .unwrap()
            .tensor("optimizer.lookahead.0")
            .is_ok(),
        "the average is saved ({names} tensors)"
    );
    let mut resumed = Model::resume(&path, device).unwrap();
    resumed.set_lookahead(setting).unwrap();
    for _ in 0..4 {
        resumed.train_batch(&x, &y).unwrap();
    }
    assert!(bits(&resumed) == bits(&straight), "resumed differs");
});
