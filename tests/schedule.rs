//! Learning-rate schedules: values against PyTorch's OneCycleLR and
//! airbench's triangle (numbers printed by torch 2 / numpy, embedded), the
//! warmup formulas, and a model whose steps take their rate from one.

mod common;

use aether::nn::{Conv2d, Dense, Flatten, ReLU};
use aether::optim::{Constant, Decay, PiecewiseLinear, Schedule, Sgd, WarmupDecay};
use aether::{Device, Loss, Metric, Model, Padding};
use common::Rng;

fn close(got: f32, want: f64, what: &str) {
    assert!(
        (f64::from(got) - want).abs() <= 1e-6 * want.abs().max(1e-3),
        "{what}: {got} vs {want}"
    );
}

#[test]
fn one_cycle_matches_pytorch() {
    // torch.optim.lr_scheduler.OneCycleLR(max_lr=0.4, total_steps=20,
    // pct_start=0.25, anneal_strategy="linear", cycle_momentum=False).
    let torch = [
        0.016, 0.112, 0.208, 0.304, 0.4, 0.37333344, 0.34666688, 0.32000032, 0.29333376, 0.2666672,
        0.24000064, 0.21333408, 0.18666752, 0.16000096, 0.1333344, 0.10666784, 0.08000128,
        0.05333472, 0.02666816, 1.6e-6,
    ];
    let schedule = PiecewiseLinear::one_cycle(0.4, 20, 0.25);
    for (step, &want) in torch.iter().enumerate() {
        close(schedule.lr(step as u64), want, &format!("step {step}"));
    }
}

#[test]
fn triangle_matches_airbench() {
    // airbench's triangle(97, start=0.2, end=0.07, peak=0.23) at these steps.
    let airbench = [
        (0, 0.2),
        (1, 0.2363636363636364),
        (11, 0.6),
        (22, 1.0),
        (23, 0.9876),
        (24, 0.9752),
        (60, 0.5288),
        (96, 0.0824),
        (97, 0.07),
    ];
    let schedule = PiecewiseLinear::triangle(0.5, 97, 0.2, 0.23, 0.07);
    for (step, want) in airbench {
        close(schedule.lr(step), 0.5 * want, &format!("step {step}"));
    }
    assert_eq!(schedule.lr(500), 0.5 * 0.07, "the last rate after the end");
}

#[test]
fn warmup_then_linear_or_cosine_decay() {
    for decay in [Decay::Linear, Decay::Cosine] {
        let s = WarmupDecay {
            peak: 0.1,
            warmup: 4,
            total: 14,
            end: 0.01,
            decay,
        };
        close(s.lr(0), 0.0, "step 0");
        close(s.lr(1), 0.025, "step 1");
        close(s.lr(4), 0.1, "peak");
        let half = match decay {
            Decay::Linear => 0.01 + 0.09 * 0.5,
            Decay::Cosine => 0.01 + 0.09 * 0.5 * (1.0 + (std::f64::consts::PI * 0.5).cos()),
        };
        close(s.lr(9), half, "halfway down");
        let late = 0.8f64;
        let fall = match decay {
            Decay::Linear => 1.0 - late,
            Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * late).cos()),
        };
        close(s.lr(12), 0.01 + 0.09 * fall, "step 12");
        close(s.lr(14), 0.01, "end");
        close(s.lr(99), 0.01, "after the end");
    }
    assert_eq!(Constant(0.3).lr(7), 0.3);
    assert_eq!(PiecewiseLinear::new(&[]).lr(3), 0.0);
}

fn model(device: &Device) -> Model {
    let mut model = Model::new().seed(4);
    model.add(Conv2d::new(4, (3, 3), Padding::Same));
    model.add(ReLU::default());
    model.add(Flatten::default());
    model.add(Dense::new(3));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Sgd::new(0.05).momentum(0.9).weight_decay(1e-3),
        Metric::CategoricalAccuracy,
    );
    model.to(device).unwrap();
    model.finalize(&[4, 4, 1]).unwrap();
    model
}

fn bits(model: &Model) -> Vec<Vec<u32>> {
    model
        .tensors()
        .unwrap()
        .into_iter()
        .map(|(_, t)| common::f32_bits(&t))
        .collect()
}

// A model's steps take the schedule's rate, by its step count: a constant
// schedule at the optimizer's own rate changes nothing; a warmup's first
// step (rate 0) leaves every parameter as it was; and a schedule that
// stops at step 3 is the same as setting the rate by hand from then on.
test_device!(a_model_steps_at_the_schedules_rate, |device: &Device| {
    let mut rng = Rng::fresh();
    let x = rng.vec(5 * 16);
    let y = vec![0, 1, 2, 1, 0];
    let mut plain = model(device);
    let mut constant = model(device);
    constant.set_schedule(Some(Box::new(Constant(0.05))));
    for _ in 0..3 {
        plain.train_batch(&x, &y).unwrap();
        constant.train_batch(&x, &y).unwrap();
    }
    assert_eq!(bits(&plain), bits(&constant));

    let mut warm = model(device);
    let before = bits(&warm);
    warm.set_schedule(Some(Box::new(WarmupDecay {
        peak: 0.05,
        warmup: 2,
        total: 10,
        end: 0.0,
        decay: Decay::Cosine,
    })));
    warm.train_batch(&x, &y).unwrap();
    assert_eq!(bits(&warm), before, "rate 0 at step 0");
    warm.train_batch(&x, &y).unwrap();
    assert_ne!(bits(&warm), before, "rate 0.025 at step 1");

    let points = [(0, 0.02), (3, 0.08)];
    let mut scheduled = model(device);
    scheduled.set_schedule(Some(Box::new(PiecewiseLinear::new(&points))));
    let mut by_hand = model(device);
    for step in 0..5u64 {
        let lr = PiecewiseLinear::new(&points).lr(step);
        let sgd = Sgd::new(lr).momentum(0.9).weight_decay(1e-3);
        // The same optimizer (its momentum) with the rate set by hand.
        if step == 0 {
            by_hand.configure(
                Loss::SoftmaxCrossEntropy {
                    label_smoothing: 0.0,
                },
                sgd,
                Metric::CategoricalAccuracy,
            );
        } else {
            by_hand.optimizer_mut().unwrap().set_learning_rate(lr);
        }
        by_hand.train_batch(&x, &y).unwrap();
        scheduled.train_batch(&x, &y).unwrap();
    }
    assert_eq!(bits(&scheduled), bits(&by_hand));
});
