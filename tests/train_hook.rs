//! `TrainOptions::on_batch` and `on_epoch`: the hook sees every batch on the
//! model's device with its epoch, step and dataset rows; what it leaves there
//! is what the step trains on (the same model as the batches given by hand to
//! `train_tensors`); the learning rate it sets is the one the step uses; an
//! EMA of the weights it keeps on the device is the EMA of the weights; an
//! augmentation it records stays in the step's one submission; and a wrong
//! tensor or an error from it ends `train` with a typed error.

mod common;

use std::sync::Mutex;

use aether::conv::Padding;
use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, ReLU};
use aether::ops::augment::reflect_translate_alternating_flip;
use aether::{AetherError, BatchContext, Device, EpochStats, Model, Tensor, TrainOptions};
use common::Rng;

/// Per-sample shape: odd and unequal sides.
const SAMPLE: [usize; 3] = [7, 5, 2];
const N: usize = 12;
const BATCH: usize = 4;

/// A small conv net: conv first, so a GPU with f16 uploads its batches as f16.
fn net(device: &Device, seed: u64) -> Model {
    let mut model = Model::new().seed(seed);
    model
        .add(Conv2d::new(4, (3, 3), Padding::Same))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(ReLU::default())
        .add(Flatten::default())
        .add(Dense::new(3));
    common::ready_model(model, device, &SAMPLE)
}

fn data(rng: &mut Rng) -> (Vec<f32>, Vec<u32>) {
    let per: usize = SAMPLE.iter().product();
    (rng.vec(N * per), (0..N as u32).map(|i| i % 3).collect())
}

fn options<'a>(epochs: usize) -> TrainOptions<'a> {
    TrainOptions {
        epochs,
        batch_size: BATCH,
        progress: false,
        ..TrainOptions::default()
    }
}

/// What one hook call saw.
#[derive(Clone, Debug)]
struct Seen {
    epoch: usize,
    step: u64,
    batch: usize,
    batches: usize,
    rows: Vec<usize>,
    inputs: Vec<f32>,
    labels: Vec<u32>,
}

fn seen(b: &BatchContext) -> Seen {
    Seen {
        epoch: b.epoch,
        step: b.step,
        batch: b.batch,
        batches: b.batches,
        rows: b.rows.to_vec(),
        inputs: b.inputs.to_vec_f32().unwrap(),
        labels: b.labels.to_vec_u32().unwrap(),
    }
}

test_device!(
    the_hook_sees_each_batch_with_its_epoch_step_and_rows,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let (x, y) = data(&mut rng);
        let mut model = net(device, 1);
        let calls = Mutex::new(Vec::new());
        let hook = |b: &mut BatchContext| {
            calls.lock().unwrap().push(seen(b));
            Ok(())
        };
        let epochs = Mutex::new(Vec::new());
        let on_epoch = |e: usize, stats: &EpochStats| {
            epochs
                .lock()
                .unwrap()
                .push((e, stats.steps, stats.train_seconds <= stats.seconds));
            Ok(())
        };
        let history = model
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&hook),
                    on_epoch: Some(&on_epoch),
                    ..options(3)
                },
            )
            .unwrap();
        assert_eq!(history.epochs.len(), 3);
        assert_eq!(
            *epochs.lock().unwrap(),
            vec![(0, 3, true), (1, 3, true), (2, 3, true)]
        );
        let calls = calls.into_inner().unwrap();
        assert_eq!(calls.len(), 9);
        let per: usize = SAMPLE.iter().product();
        // The batch as the model uploads it: rounded to f16 where its first layer would.
        let f16 = model.input_dtype() == aether::DType::F16;
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(
                (call.epoch, call.step, call.batch, call.batches),
                (i / 3, i as u64, i % 3, 3)
            );
            let want: Vec<f32> = call
                .rows
                .iter()
                .flat_map(|&r| &x[r * per..(r + 1) * per])
                .map(|&v| {
                    if f16 {
                        half::f16::from_f32(v).to_f32()
                    } else {
                        v
                    }
                })
                .collect();
            assert_eq!(
                call.inputs, want,
                "call {i}: the inputs are the rows' images"
            );
            let labels: Vec<u32> = call.rows.iter().map(|&r| y[r]).collect();
            assert_eq!(call.labels, labels);
        }
        for epoch in calls.chunks(3) {
            let mut rows: Vec<usize> = epoch.iter().flat_map(|c| c.rows.clone()).collect();
            rows.sort_unstable();
            assert_eq!(
                rows,
                (0..N).collect::<Vec<_>>(),
                "each epoch visits every row once"
            );
        }
        assert_ne!(calls[0].rows, calls[3].rows, "epochs shuffle anew");
    }
);

// The steps a hook augments train exactly as the same augmented batches
// given to `train_tensors` by hand: the hook's tensor is what the step takes.
test_device!(
    an_augmenting_hook_trains_as_its_batches_given_by_hand,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let (x, y) = data(&mut rng);
        let seed = rng.next_u64();
        let augment = |b: &mut BatchContext| {
            b.inputs = reflect_translate_alternating_flip(
                &b.inputs,
                2,
                b.rows,
                seed,
                b.step as u32,
                b.epoch,
            )?;
            Ok(())
        };
        let rows = Mutex::new(Vec::new());
        let record = |b: &mut BatchContext| {
            rows.lock().unwrap().push(b.rows.to_vec());
            augment(b)
        };
        let mut hooked = net(device, 2);
        let history = hooked
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&record),
                    ..options(2)
                },
            )
            .unwrap();

        let mut by_hand = net(device, 2);
        let dtype = by_hand.input_dtype();
        let mut losses = Vec::new();
        for (step, chunk) in rows.into_inner().unwrap().iter().enumerate() {
            let dims = [vec![chunk.len()], SAMPLE.to_vec()].concat();
            let xb = Tensor::from_f32_rows(dims, &x, chunk, dtype, device).unwrap();
            let xb = reflect_translate_alternating_flip(&xb, 2, chunk, seed, step as u32, step / 3)
                .unwrap();
            let labels: Vec<u32> = chunk.iter().map(|&r| y[r]).collect();
            let yb = Tensor::from_u32(vec![chunk.len()], labels, device).unwrap();
            let (loss, _) = by_hand.train_tensors(&xb, &yb).unwrap();
            losses.push(loss.to_vec_f32().unwrap()[0]);
        }
        let epoch_mean = |k: usize| {
            losses[3 * k..3 * k + 3]
                .iter()
                .map(|&l| f64::from(l))
                .sum::<f64>()
                / 3.0
        };
        for k in 0..2 {
            assert_eq!(history.epochs[k].loss, epoch_mean(k) as f32, "epoch {k}");
        }
        let probe = rng.vec(2 * SAMPLE.iter().product::<usize>());
        let bits = |m: &mut Model| -> Vec<u32> {
            m.predict(&probe, 2, true)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&mut hooked), bits(&mut by_hand));
        // And the augmentation changed the training: without it the model differs.
        let mut plain = net(device, 2);
        plain.train(&x, &y, &options(2)).unwrap();
        assert_ne!(bits(&mut plain), bits(&mut hooked));
    }
);

test_device!(
    the_learning_rate_the_hook_sets_is_the_steps,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let (x, y) = data(&mut rng);
        let weights = |m: &Model| -> Vec<(String, Vec<f32>)> {
            m.tensors()
                .unwrap()
                .into_iter()
                .filter(|(name, _)| name.ends_with("kernel") || name.ends_with("bias"))
                .map(|(name, t)| (name, t.to_vec_f32().unwrap()))
                .collect()
        };
        // Learning rate 0 from the first step: no parameter moves.
        let mut model = net(device, 3);
        let before = weights(&model);
        let configured = Mutex::new(Vec::new());
        let freeze = |b: &mut BatchContext| {
            configured
                .lock()
                .unwrap()
                .push(b.optimizer().learning_rate());
            b.optimizer().set_learning_rate(0.0);
            Ok(())
        };
        model
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&freeze),
                    ..options(2)
                },
            )
            .unwrap();
        assert_eq!(weights(&model), before);
        assert_eq!(
            configured.into_inner().unwrap(),
            [vec![1e-3], vec![0.0; 5]].concat()
        );

        // A schedule (1e-2 halved each step) equals steps taken by hand at those rates.
        let schedule = |step: u64| 1e-2 * 0.5f32.powi(step as i32);
        let decay = |b: &mut BatchContext| {
            let lr = schedule(b.step);
            b.optimizer().set_learning_rate(lr);
            Ok(())
        };
        let mut hooked = net(device, 4);
        let rows = Mutex::new(Vec::new());
        let both = |b: &mut BatchContext| {
            rows.lock().unwrap().push(b.rows.to_vec());
            decay(b)
        };
        hooked
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&both),
                    ..options(1)
                },
            )
            .unwrap();
        let mut by_hand = net(device, 4);
        let per: usize = SAMPLE.iter().product();
        for (step, chunk) in rows.into_inner().unwrap().iter().enumerate() {
            let xb: Vec<f32> = chunk
                .iter()
                .flat_map(|&r| x[r * per..(r + 1) * per].to_vec())
                .collect();
            let yb: Vec<u32> = chunk.iter().map(|&r| y[r]).collect();
            by_hand
                .optimizer_mut()
                .unwrap()
                .set_learning_rate(schedule(step as u64));
            by_hand.train_batch(&xb, &yb).unwrap();
        }
        assert_eq!(weights(&hooked), weights(&by_hand));
    }
);

test_device!(
    hook_errors_and_wrong_tensors_end_training_with_typed_errors,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let (x, y) = data(&mut rng);
        let stop = |b: &mut BatchContext| {
            if b.step == 2 {
                return Err(AetherError::Model("stop at step 2".into()));
            }
            Ok(())
        };
        let mut model = net(device, 5);
        let err = model
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&stop),
                    ..options(2)
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("stop at step 2"), "{err}");

        let shrink = |b: &mut BatchContext| {
            b.inputs = b.inputs.reshape(vec![BATCH, 5, 7, 2])?;
            Ok(())
        };
        let err = model
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&shrink),
                    ..options(1)
                },
            )
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("on_batch hook left inputs of shape [4, 5, 7, 2]")
                && text.contains("[4, 7, 5, 2]"),
            "{text}"
        );
        let float_labels = |b: &mut BatchContext| {
            b.labels = Tensor::from_f32(vec![BATCH], vec![0.0; BATCH], &b.labels.device())?;
            Ok(())
        };
        let err = model
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&float_labels),
                    ..options(1)
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("labels of dtype F32"), "{err}");
        if !matches!(device, Device::Cpu) {
            let to_host = |b: &mut BatchContext| {
                b.inputs = b.inputs.to(&Device::Cpu)?;
                Ok(())
            };
            let err = model
                .train(
                    &x,
                    &y,
                    &TrainOptions {
                        on_batch: Some(&to_host),
                        ..options(1)
                    },
                )
                .unwrap_err();
            assert!(err.to_string().contains("inputs of device cpu"), "{err}");
        }
        let early_stop = |e: usize, _: &EpochStats| {
            if e == 1 {
                Err(AetherError::Model("enough".into()))
            } else {
                Ok(())
            }
        };
        let err = model
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_epoch: Some(&early_stop),
                    ..options(5)
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("enough"), "{err}");
    }
);

/// An augmentation recorded by the hook joins the step's one submission: the
/// flags it uploads go up before its kernel, so nothing is submitted early.
#[test]
fn a_hook_augmenting_on_the_gpu_keeps_one_submission_per_step() {
    let Some(_) = common::gpu() else { return };
    let device = Device::with_preference(
        aether::gpu::DevicePreference::Gpu,
        &common::test_gpu_options(),
    )
    .unwrap();
    let ctx = device.gpu_context().unwrap().clone();
    let mut rng = Rng::fresh();
    let per: usize = SAMPLE.iter().product();
    let x = rng.vec(4 * N * per);
    let y: Vec<u32> = (0..4 * N as u32).map(|i| i % 3).collect();
    let mut model = net(&device, 6);
    let counts = Mutex::new(Vec::new());
    let hook = |b: &mut BatchContext| {
        counts.lock().unwrap().push(ctx.submission_count());
        b.inputs =
            reflect_translate_alternating_flip(&b.inputs, 2, b.rows, 1, b.step as u32, b.epoch)?;
        Ok(())
    };
    let options = TrainOptions {
        on_batch: Some(&hook),
        log_every: 1000,
        ..options(1)
    };
    model.train(&x, &y, &options).unwrap();
    let counts = counts.into_inner().unwrap();
    // From the second step on (the first may follow a wait, and the optimizer
    // uploads its state then), each step is one submission.
    let per_step: Vec<usize> = counts.windows(2).skip(1).map(|w| w[1] - w[0]).collect();
    assert!(
        per_step.iter().all(|&d| d == 1),
        "submissions per step: {per_step:?}"
    );
}

// An exponential moving average of the weights kept on the device by the
// hook (`BatchContext::tensors`, `ops::arith`), as airbench's lookahead EMA
// would be: it equals the same average of the weights read back before each
// step, and is not the final weights.
test_device!(
    a_hook_keeps_an_ema_of_the_weights_on_the_device,
    |device: &Device| {
        use aether::ops::arith::{add, scale};
        const DECAY: f32 = 0.8;
        let mut rng = Rng::fresh();
        let (x, y) = data(&mut rng);
        let mut model = net(device, 7);
        let ema: Mutex<Vec<(String, Tensor)>> = Mutex::new(Vec::new());
        let seen: Mutex<Vec<Vec<Vec<f32>>>> = Mutex::new(Vec::new());
        let hook = |b: &mut BatchContext| {
            let kernels: Vec<(String, Tensor)> = b
                .tensors()
                .into_iter()
                .filter(|(name, _)| name.ends_with("kernel"))
                .collect();
            let mut ema = ema.lock().unwrap();
            if ema.is_empty() {
                // A copy: on a GPU the parameter is a view the optimizer updates.
                for (name, w) in &kernels {
                    ema.push((name.clone(), scale(w, 1.0)?));
                }
            } else {
                for ((_, e), (_, w)) in ema.iter_mut().zip(&kernels) {
                    *e = add(&scale(e, DECAY)?, &scale(w, 1.0 - DECAY)?)?;
                }
            }
            let host = kernels
                .iter()
                .map(|(_, w)| w.to_vec_f32())
                .collect::<Result<Vec<_>, _>>()?;
            seen.lock().unwrap().push(host);
            Ok(())
        };
        model
            .train(
                &x,
                &y,
                &TrainOptions {
                    on_batch: Some(&hook),
                    ..options(2)
                },
            )
            .unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 6);
        let ema = ema.into_inner().unwrap();
        let finals = model.tensors().unwrap();
        for (k, (name, e)) in ema.iter().enumerate() {
            let mut want = seen[0][k].clone();
            for step in &seen[1..] {
                for (w, &v) in want.iter_mut().zip(&step[k]) {
                    *w = *w * DECAY + v * (1.0 - DECAY);
                }
            }
            let got = e.to_vec_f32().unwrap();
            let scale_of = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= 1e-6 * scale_of, "{name}: EMA off by {err}");
            let last = finals
                .iter()
                .find(|(n, _)| n == name)
                .unwrap()
                .1
                .to_vec_f32()
                .unwrap();
            assert_ne!(got, last, "{name}: the average is not the last weights");
        }
    }
);
