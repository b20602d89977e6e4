//! Issue 37's hostile-user cases: each a typed error before anything moves,
//! never a model that builds and cannot run, a failed call that changes the
//! model, or an allocation a crafted file controls.

mod common;

use std::path::Path;

use aether::conv::Padding;
use aether::model::{Loss, Metric};
use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, MaxPool2d, ReLU};
use aether::optim::Adam;
use aether::{AetherError, Device, Model, TrainOptions};
use common::{TempDir, gpu, ready_model};

/// Deterministic values in [-1, 1) (SplitMix64), asymmetric, never all zero.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The JSON architecture in a model file's header.
fn architecture(bytes: &[u8]) -> String {
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    header["__metadata__"]["aether_architecture"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `bytes` (a model file) with its architecture replaced by `arch`.
fn with_architecture(bytes: &[u8], arch: String) -> Vec<u8> {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let meta = std::collections::HashMap::from([("aether_architecture".to_owned(), arch)]);
    safetensors::serialize(file.tensors(), Some(meta)).unwrap()
}

fn model_file_reason(result: aether::Result<Model>) -> String {
    match result {
        Err(AetherError::ModelFile { reason, .. }) => reason,
        Err(other) => panic!("expected a ModelFile error, got {other:?}"),
        Ok(_) => panic!("expected a ModelFile error, the file loaded"),
    }
}

fn pool_model(padding: Padding) -> Model {
    let mut model = Model::new().seed(5);
    model.add(MaxPool2d::new((2, 2), (1, 1), padding));
    model.add(Flatten::default());
    model.add(Dense::new(3));
    model
}

const WIDE: Padding = Padding::Explicit {
    top: 3,
    bottom: 3,
    left: 3,
    right: 3,
};

/// Issue 37 item 4: a pool whose padding is wider than its window used to
/// pass `finalize` (and load) and fail only in `predict`.
#[test]
fn a_pool_whose_windows_cover_only_padding_is_refused_at_finalize_and_at_load() {
    let mut model = pool_model(WIDE);
    let err = ready_model_result(&mut model, &[4, 4, 2]).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("layer 0") && message.contains("padding only"),
        "{message}"
    );

    let dir = TempDir::new("pool");
    let good = ready_model(pool_model(Padding::Valid), &Device::Cpu, &[4, 4, 2]);
    let path = dir.0.join("pool.aether");
    good.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let arch = architecture(&bytes);
    let wide = arch.replacen(
        "\"padding\":\"Valid\"",
        "\"padding\":{\"Explicit\":{\"top\":3,\"bottom\":3,\"left\":3,\"right\":3}}",
        1,
    );
    assert_ne!(wide, arch, "the architecture names the pool's padding");
    let reason = model_file_reason(Model::from_bytes(
        "wide.aether",
        &with_architecture(&bytes, wide),
        &Device::Cpu,
    ));
    assert!(reason.contains("padding only"), "{reason}");
}

fn ready_model_result(model: &mut Model, input: &[usize]) -> aether::Result<()> {
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    model.finalize(input)
}

/// Issue 37 item 7: a 1x1 conv padded by 16383 on a 1x1 input asks for a
/// 32767 x 32767 activation (4.3 GB per sample). `predict` refuses it with
/// `TooLarge` naming the layer before allocating, on the CPU and the GPU.
#[test]
fn an_activation_past_the_tensor_limit_is_too_large_naming_the_layer() {
    let pad = 16383;
    let build = || {
        let mut model = Model::new().seed(2);
        model.add(Conv2d::new(
            1,
            (1, 1),
            Padding::Explicit {
                top: pad,
                bottom: pad,
                left: pad,
                right: pad,
            },
        ));
        model.add(Flatten::default());
        model
    };
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for device in devices {
        let mut model = build();
        model.to(&device).unwrap();
        model.finalize(&[1, 1, 1]).unwrap();
        let start = std::time::Instant::now();
        match model.predict(&[0.75], 1, true) {
            Err(AetherError::TooLarge { what, bytes, limit }) => {
                assert!(what.contains("layer 0 (Conv2d"), "{what}");
                assert_eq!(bytes, 32767 * 32767 * 4);
                assert!(limit < bytes);
            }
            other => panic!("expected TooLarge on {}, got {other:?}", device.name()),
        }
        assert!(start.elapsed().as_secs() < 5, "refused before any work");
    }
    // The CPU limit is the model's to set: a small one splits a batch as a
    // GPU buffer would, with the same predictions.
    let mut small = Model::new().seed(4).cpu_tensor_limit(3 * 16 * 4);
    small.add(Dense::new(16));
    let mut small = ready_model(small, &Device::Cpu, &[5]);
    let mut whole = ready_model(
        {
            let mut m = Model::new().seed(4);
            m.add(Dense::new(16));
            m
        },
        &Device::Cpu,
        &[5],
    );
    let x = values(7 * 5, 9);
    assert_eq!(
        small.predict(&x, 7, true).unwrap(),
        whole.predict(&x, 7, true).unwrap()
    );
    let err = small
        .train_batch(&x[..20], &[0, 1, 2, 3])
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, AetherError::TooLarge { .. }), "{err}");
}

fn bn_model(device: &Device) -> Model {
    let mut model = Model::new().seed(7);
    model.add(Conv2d::new(4, (3, 3), Padding::Same));
    model.add(BatchNorm::new(0.9, 1e-3));
    model.add(ReLU::default());
    model.add(Flatten::default());
    model.add(Dense::new(3));
    model.to(device).unwrap();
    model
}

/// The model's whole saved state: weights and BatchNorm statistics.
/// Every tensor (name and bytes, in name order) and metadata entry of the
/// file `save` writes, so two states compare whatever order the header has.
fn state_bits(model: &Model, dir: &Path) -> Vec<(String, Vec<u8>)> {
    let path = dir.join("state.aether");
    model.save(&path).unwrap();
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut state: Vec<(String, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    for (key, value) in meta.metadata().clone().unwrap_or_default() {
        state.push((key, value.into_bytes()));
    }
    state.sort();
    state
}

/// `a == b` for two [`state_bits`], or a panic naming the entries that differ.
fn same_state(a: &[(String, Vec<u8>)], b: &[(String, Vec<u8>)], what: &str) {
    let differ: Vec<String> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x != y)
        .map(|(x, y)| {
            if x.0 == y.0 && x.0.starts_with("aether_") {
                format!(
                    "{}: {} vs {}",
                    x.0,
                    String::from_utf8_lossy(&x.1),
                    String::from_utf8_lossy(&y.1)
                )
            } else {
                format!("{} / {}", x.0, y.0)
            }
        })
        .collect();
    assert!(
        differ.is_empty() && a.len() == b.len(),
        "{what}: {differ:?}"
    );
}

/// Issue 37 item 5: `train` with no `configure`, or with a NaN learning rate
/// configured after `finalize`, errors before the forward pass, so BatchNorm's
/// running statistics stay as they were.
#[test]
fn a_train_that_fails_its_checks_leaves_the_batchnorm_statistics_unchanged() {
    let dir = TempDir::new("train-checks");
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    let x = values(4 * 4 * 4 * 2, 13);
    let y = [2u32, 0, 1, 1];
    let options = TrainOptions {
        epochs: 1,
        batch_size: 4,
        progress: false,
        ..TrainOptions::default()
    };
    for device in devices {
        let mut model = bn_model(&device);
        model.finalize(&[4, 4, 2]).unwrap();
        let before = state_bits(&model, &dir.0);
        let err = model.train(&x, &y, &options).unwrap_err();
        assert!(err.to_string().contains("configure"), "{err}");
        same_state(&state_bits(&model, &dir.0), &before, &device.name());

        let mut model = ready_model(bn_model(&device), &device, &[4, 4, 2]);
        let before = state_bits(&model, &dir.0);
        model.configure(
            Loss::SoftmaxCrossEntropy {
                label_smoothing: 0.0,
            },
            Adam::new(f32::NAN),
            Metric::CategoricalAccuracy,
        );
        for result in [
            model.train(&x, &y, &options).map(|_| ()),
            model.train_batch(&x, &y).map(|_| ()),
        ] {
            assert!(
                matches!(
                    result,
                    Err(AetherError::InvalidHyperparameter {
                        name: "Adam learning_rate",
                        ..
                    })
                ),
                "{result:?}"
            );
        }
        same_state(&state_bits(&model, &dir.0), &before, &device.name());
    }
}

/// Issue 37 (minor): a model file whose header holds a key twice (last wins
/// in the parsers) is refused, naming the key.
#[test]
fn a_model_file_with_a_duplicate_header_key_is_refused() {
    let dir = TempDir::new("duplicate");
    let model = ready_model(pool_model(Padding::Valid), &Device::Cpu, &[4, 4, 2]);
    let path = dir.0.join("good.aether");
    model.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + len]).unwrap();
    let data = &bytes[8 + len..];
    let rebuilt = |header: String| {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    };
    // The untouched header loads through the same path.
    Model::from_bytes("same.aether", &rebuilt(header.to_owned()), &Device::Cpu).unwrap();
    let twice = header.replacen(
        "\"__metadata__\":{",
        "\"__metadata__\":{\"aether_architecture\":\"{}\",",
        1,
    );
    assert_ne!(twice, header);
    let reason = model_file_reason(Model::from_bytes(
        "twice.aether",
        &rebuilt(twice),
        &Device::Cpu,
    ));
    assert!(
        reason.contains("\"aether_architecture\" appears twice"),
        "{reason}"
    );
}

/// The parameters of `adam`'s test: two tensors, one with a NaN gradient.
fn adam_case(device: &Device, bad: f32) -> (Vec<aether::Tensor>, Vec<aether::Tensor>) {
    let params = vec![
        aether::Tensor::from_f32(vec![37], values(37, 1), device).unwrap(),
        aether::Tensor::from_f32(vec![5], values(5, 2), device).unwrap(),
    ];
    let mut g = values(5, 4);
    g[3] = bad;
    let grads = vec![
        aether::Tensor::from_f32(vec![37], values(37, 3), device).unwrap(),
        aether::Tensor::from_f32(vec![5], g, device).unwrap(),
    ];
    (params, grads)
}

/// Issue 37 item 6: an Adam step with one non-finite gradient changes no
/// parameter, nor does any step after it until the gate is reopened, which
/// takes the skipped steps back; a finite step then updates as a first step.
#[test]
fn a_non_finite_gradient_skips_the_adam_step_and_every_later_one() {
    use aether::optim::Param;
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for device in devices {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (mut params, bad_grads) = adam_case(&device, bad);
            let (_, mut good_grads) = adam_case(&device, 0.5);
            good_grads.reverse();
            let (_, good) = adam_case(&device, 0.5);
            let before: Vec<Vec<f32>> = params.iter().map(|p| p.to_vec_f32().unwrap()).collect();
            let mut adam = Adam::new(1e-2);
            for grads in [&bad_grads, &good] {
                let [a, b] = &mut params[..] else {
                    unreachable!()
                };
                adam.step(&mut [Param::new("p", a, &grads[0]), Param::new("p", b, &grads[1])])
                    .unwrap();
            }
            let after: Vec<Vec<f32>> = params.iter().map(|p| p.to_vec_f32().unwrap()).collect();
            assert_eq!(after, before, "{bad} on {}", device.name());
            assert_eq!(adam.skipped_step().unwrap(), Some(1));
            assert_eq!(adam.reopen().unwrap(), 2);
            assert_eq!((adam.steps(), adam.skipped_step().unwrap()), (0, None));
            // A finite step now moves every parameter, as a fresh optimizer's first.
            // Copies: on the GPU the parameters are views the step updates in place.
            let mut fresh_params: Vec<aether::Tensor> = params
                .iter()
                .map(|p| {
                    aether::Tensor::from_f32(p.dims().to_vec(), p.to_vec_f32().unwrap(), &device)
                        .unwrap()
                })
                .collect();
            let mut fresh = Adam::new(1e-2);
            for (opt, ps) in [(&mut adam, &mut params), (&mut fresh, &mut fresh_params)] {
                let [a, b] = &mut ps[..] else { unreachable!() };
                opt.step(&mut [Param::new("p", a, &good[0]), Param::new("p", b, &good[1])])
                    .unwrap();
            }
            let moved: Vec<Vec<f32>> = params.iter().map(|p| p.to_vec_f32().unwrap()).collect();
            let expected: Vec<Vec<f32>> = fresh_params
                .iter()
                .map(|p| p.to_vec_f32().unwrap())
                .collect();
            assert_eq!(moved, expected, "{bad} on {}", device.name());
            assert!(moved[1].iter().zip(&before[1]).all(|(a, b)| a != b));
        }
    }
}

fn dense_bn_model(device: &Device) -> Model {
    let mut model = Model::new().seed(11);
    model.add(Flatten::default());
    model.add(Dense::new(6));
    model.add(BatchNorm::new(0.9, 1e-3));
    model.add(ReLU::default());
    model.add(Dense::new(3));
    ready_model(model, device, &[2, 2, 2])
}

/// Issue 37 item 6: a step on device data holding a NaN changes nothing, nor
/// do the steps after it (BatchNorm's running statistics included); the
/// check names it and takes them back, and training goes on exactly as if
/// they had never been taken.
#[test]
fn a_nan_step_changes_nothing_and_training_resumes_from_before_it() {
    let dir = TempDir::new("nan-step");
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    let good = values(4 * 8, 21);
    let other = values(4 * 8, 22);
    let mut poisoned = values(4 * 8, 23);
    poisoned[13] = f32::NAN;
    let y = [0u32, 2, 1, 2];
    for device in devices {
        let mut model = dense_bn_model(&device);
        let mut twin = dense_bn_model(&device);
        let batch = |x: &[f32], model: &Model| {
            let indices: Vec<usize> = (0..4).collect();
            let dims = vec![4, 2, 2, 2];
            (
                aether::Tensor::from_f32_rows(dims, x, &indices, model.input_dtype(), &device)
                    .unwrap(),
                aether::Tensor::from_u32(vec![4], y.to_vec(), &device).unwrap(),
            )
        };
        let (gx, gy) = batch(&good, &model);
        let (ox, oy) = batch(&other, &model);
        let (px, py) = batch(&poisoned, &model);
        model.train_tensors(&gx, &gy).unwrap();
        twin.train_tensors(&gx, &gy).unwrap();
        let after_one = state_bits(&model, &dir.0);
        model.train_tensors(&px, &py).unwrap();
        model.train_tensors(&ox, &oy).unwrap();
        same_state(&state_bits(&model, &dir.0), &after_one, &device.name());
        match model.check_steps() {
            Err(AetherError::NonFiniteStep { step: 2, later: 1 }) => {}
            other => panic!(
                "expected NonFiniteStep at step 2 on {}, got {other:?}",
                device.name()
            ),
        }
        model.check_steps().unwrap();
        model.train_tensors(&ox, &oy).unwrap();
        twin.train_tensors(&ox, &oy).unwrap();
        same_state(
            &state_bits(&model, &dir.0),
            &state_bits(&twin, &dir.0),
            &device.name(),
        );
        // Host data with a NaN is refused before any step, naming the sample.
        let err = model.train_batch(&poisoned, &y).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("sample 1"), "{err}");
        let err = model.predict(&poisoned, 4, false).unwrap_err();
        assert!(err.to_string().contains("not finite"), "{err}");
        assert!(model.evaluate(&poisoned, &y, 4).is_err());
    }
}

/// Issue 37 item 6: `train` that diverges (a learning rate of 1e38 drives
/// the weights past f32) stops with `NonFiniteLoss` naming the first bad step,
/// and the model keeps the state from before it: the same as a model trained
/// on the batches before that step. Logged every step it is caught at once;
/// every 20 steps, at the epoch's end, and the steps after it are taken back.
#[test]
fn train_stops_at_a_non_finite_loss_with_the_state_from_before_that_step() {
    let dir = TempDir::new("nan-train");
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    let x = values(64 * 8, 31);
    let y: Vec<u32> = (0..64).map(|i| (i * 7 % 3) as u32).collect();
    let diverging = |device: &Device| {
        let mut model = Model::new().seed(12);
        model.add(Flatten::default());
        model.add(Dense::new(6));
        model.add(BatchNorm::new(0.9, 1e-3));
        model.add(ReLU::default());
        model.add(Dense::new(3));
        model.configure(
            Loss::SoftmaxCrossEntropy {
                label_smoothing: 0.0,
            },
            Adam::new(1e38),
            Metric::CategoricalAccuracy,
        );
        model.to(device).unwrap();
        model.finalize(&[2, 2, 2]).unwrap();
        model
    };
    for device in devices {
        for log_every in [1, 20] {
            let options = TrainOptions {
                epochs: 1,
                batch_size: 4,
                shuffle: false,
                progress: false,
                log_every,
                ..TrainOptions::default()
            };
            let mut model = diverging(&device);
            let step = match model.train(&x, &y, &options) {
                Err(AetherError::NonFiniteLoss { step, epoch: 0, .. }) => step as usize,
                other => panic!("expected NonFiniteLoss on {}, got {other:?}", device.name()),
            };
            assert!((2..16).contains(&step), "step {step}");
            let mut before = diverging(&device);
            let samples = (step - 1) * 4;
            before
                .train(&x[..samples * 8], &y[..samples], &options)
                .unwrap();
            // `before` finished an epoch, `model` stopped inside one: their
            // epoch counts differ, everything else is the same.
            let without_epochs = |model: &Model| -> Vec<(String, Vec<u8>)> {
                let mut state = state_bits(model, &dir.0);
                for (key, value) in &mut state {
                    if key == "aether_training" {
                        let mut json: serde_json::Value = serde_json::from_slice(value).unwrap();
                        json["epochs_done"] = 0.into();
                        *value = json.to_string().into_bytes();
                    }
                }
                state
            };
            same_state(
                &without_epochs(&model),
                &without_epochs(&before),
                &format!("{} log_every {log_every}", device.name()),
            );
        }
    }
}

/// Issue 37 item 6: a model file holding a non-finite value, or a negative
/// running variance, is a `ModelFile` error naming the tensor.
#[test]
fn a_model_file_with_invalid_statistics_is_refused() {
    let dir = TempDir::new("bad-stats");
    let model = dense_bn_model(&Device::Cpu);
    let path = dir.0.join("model.aether");
    model.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (key, value, needle) in [
        ("layers.2.running_var", -0.5f32, "negative variance"),
        ("layers.2.running_var", f32::NAN, "not a finite value"),
        ("layers.2.running_mean", f32::INFINITY, "not a finite value"),
        ("layers.1.kernel", f32::NAN, "not a finite value"),
    ] {
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = file
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().to_vec(), view.data().to_vec()))
            .collect();
        let target = tensors.iter_mut().find(|(name, ..)| name == key).unwrap();
        target.2[4..8].copy_from_slice(&value.to_le_bytes());
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(name, shape, data)| {
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    shape.clone(),
                    data,
                )
                .unwrap();
                (name.clone(), view)
            })
            .collect();
        let meta = std::collections::HashMap::from([(
            "aether_architecture".to_owned(),
            architecture(&bytes),
        )]);
        let crafted = safetensors::serialize(views, Some(meta)).unwrap();
        let reason = model_file_reason(Model::from_bytes("stats.aether", &crafted, &Device::Cpu));
        assert!(reason.contains(key) && reason.contains(needle), "{reason}");
    }
}

/// Issue 37 item 2: lavapipe ends an invocation's loops after 65535
/// iterations in all, and `global_avg_pool` returned 0.125 for planes of
/// 2^20 ones (each of its 16 lanes looping 65536 times). Planes that long now
/// take several dispatches: the GPU gives the CPU's bits (the same order of
/// additions) and the mean, at and past that size.
#[test]
fn global_avg_pool_is_right_on_planes_past_65535_iterations_a_lane() {
    use aether::ops::pool::global_avg_pool;
    let Some(device) = gpu() else { return };
    for dims in [
        [1usize, 1024, 1024, 1],
        [1, 65535, 16, 1],
        [2, 1023, 1024, 2],
    ] {
        let len: usize = dims.iter().product();
        // Random values around 1 (asymmetric), and a plane of ones.
        let data: Vec<f32> = values(len, 41).iter().map(|v| 1.0 + 0.5 * v).collect();
        for data in [data, vec![1.0; len]] {
            let mean = |data: &[f32]| {
                let cpu =
                    aether::Tensor::from_f32(dims.to_vec(), data.to_vec(), &Device::Cpu).unwrap();
                let gpu = aether::Tensor::from_f32(dims.to_vec(), data.to_vec(), &device).unwrap();
                (
                    global_avg_pool(&cpu).unwrap().to_vec_f32().unwrap(),
                    global_avg_pool(&gpu).unwrap().to_vec_f32().unwrap(),
                )
            };
            let (cpu, gpu) = mean(&data);
            assert_eq!(gpu, cpu, "{dims:?}");
            let [n, h, w, c] = dims;
            for (pair, &value) in cpu.iter().enumerate() {
                let (image, channel) = (pair / c, pair % c);
                let sum: f64 = (0..h * w)
                    .map(|i| f64::from(data[(image * h * w + i) * c + channel]))
                    .sum();
                let expected = sum / (h * w) as f64;
                assert!(
                    (f64::from(value) - expected).abs() < 1e-4,
                    "{dims:?} plane {pair}: {value} vs {expected}"
                );
            }
            assert_eq!(cpu.len(), n * c);
        }
    }
}

/// Issue 37 item 2, the other data-sized loops: the regularization loss's
/// ordered sum runs in dispatches (right past 65535 partials, 2^24 values),
/// and where a loop cannot be split yet (a pooling window's scan, a row of
/// classes) lavapipe refuses the shape as `TooLarge` instead of cutting the
/// loop short; the CPU computes it.
#[test]
fn loops_past_lavapipes_limit_are_split_or_refused() {
    let Some(device) = gpu() else { return };
    let ctx = device.gpu_context().unwrap();
    if ctx.caps().loop_iteration_limit().is_none() {
        common::skip("the adapter does not cut loops short");
        return;
    }
    let len = (1 << 24) + 4099;
    let data = values(len, 51);
    let expected: f64 = data
        .iter()
        .map(|&v| 0.5 * f64::from(v) * f64::from(v))
        .sum();
    let t = aether::Tensor::from_f32(vec![len], data, &device).unwrap();
    let total = aether::optim::regularization_loss(&[(&t, 0.0, 0.5)])
        .unwrap()
        .to_vec_f32()
        .unwrap()[0];
    assert!(
        (f64::from(total) - expected).abs() < 1e-4 * expected,
        "{total} vs {expected}"
    );
    drop(t);

    use aether::ops::pool::{PoolParams, avg_pool2d};
    let p = PoolParams::new(256, 256, Padding::Valid);
    let x = values(256 * 256, 52);
    let on = |d: &Device| aether::Tensor::from_f32(vec![1, 256, 256, 1], x.clone(), d).unwrap();
    let cpu = avg_pool2d(&on(&Device::Cpu), &p)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert!(cpu[0].abs() < 0.1, "{cpu:?}");
    match avg_pool2d(&on(&device), &p) {
        Err(AetherError::TooLarge { what, .. }) => assert!(what.contains("256x256"), "{what}"),
        other => panic!("expected TooLarge, got {other:?}"),
    }

    let classes = 1 << 14;
    let logits =
        aether::Tensor::from_f32(vec![2, classes], values(2 * classes, 53), &device).unwrap();
    let labels = aether::Tensor::from_u32(vec![2], vec![3, classes as u32 - 1], &device).unwrap();
    match aether::ops::loss::softmax_cross_entropy(&logits, &labels, 0.0) {
        Err(AetherError::TooLarge { what, .. }) => {
            assert!(what.contains("16384 classes"), "{what}")
        }
        other => panic!("expected TooLarge, got {:?}", other.map(|_| ())),
    }
}

fn conv_model(device: &Device) -> Model {
    let mut model = Model::new().seed(17);
    model.add(Conv2d::new(4, (3, 3), Padding::Same));
    model.add(BatchNorm::new(0.9, 1e-3));
    model.add(ReLU::default());
    model.add(Conv2d::new(4, (3, 3), Padding::Same));
    model.add(Flatten::default());
    model.add(Dense::new(3));
    ready_model(model, device, &[4, 4, 4])
}

/// Issue 37 item 3: every f32 -> f16 conversion saturates at +-65504 (NaN
/// kept), as the backward cast always did, so inputs scaled by 1e5, or a
/// weight of -5.3e30 read from a file, give finite predictions on the GPU
/// instead of an overflow to inf that comes out as NaN.
#[test]
fn f16_conversions_saturate_so_overflowing_values_predict_finite() {
    let halves = aether::Tensor::from_f32_as_f16(
        vec![4],
        &[1e5, -7e4, f32::INFINITY, f32::NAN],
        &Device::Cpu,
    )
    .unwrap()
    .to_vec_f16()
    .unwrap();
    assert_eq!(
        &halves[..3],
        [half::f16::MAX, -half::f16::MAX, half::f16::MAX]
    );
    assert!(halves[3].is_nan());
    let Some(device) = gpu() else { return };
    let dir = TempDir::new("f16");
    let x: Vec<f32> = values(3 * 64, 61).iter().map(|v| v * 1e5).collect();
    let mut model = conv_model(&device);
    assert!(!model.f16_outputs().is_empty() || device.gpu_context().unwrap().caps().shader_f16);
    let predicted = model.predict(&x, 3, true).unwrap();
    assert!(predicted.iter().all(|v| v.is_finite()), "{predicted:?}");
    // A trained step with such inputs keeps the weights finite too.
    model.train_batch(&x, &[0, 1, 2]).unwrap();
    model.check_steps().unwrap();

    let path = dir.0.join("conv.aether");
    conv_model(&Device::Cpu).save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let kernel = tensors
        .iter_mut()
        .find(|(name, ..)| name == "layers.3.kernel")
        .unwrap();
    kernel.2[8..12].copy_from_slice(&(-5.3e30f32).to_le_bytes());
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    let meta =
        std::collections::HashMap::from([("aether_architecture".to_owned(), architecture(&bytes))]);
    let crafted = safetensors::serialize(views, Some(meta)).unwrap();
    let x = values(3 * 64, 62);
    for device in [Device::Cpu, device] {
        let mut loaded = Model::from_bytes("huge-weight.aether", &crafted, &device).unwrap();
        let predicted = loaded.predict(&x, 3, false).unwrap();
        assert!(
            predicted.iter().all(|v| v.is_finite()),
            "{}: {predicted:?}",
            device.name()
        );
    }
}

/// Issue 37, resumable checkpoints: 2 epochs, a checkpoint, `Model::resume`
/// and 2 more epochs give the bits of 4 epochs in one go (weights, BatchNorm
/// statistics, optimizer moments and step, dropout masks and shuffles), on
/// the CPU and the GPU; a file without optimizer state still loads but does
/// not resume.
#[test]
fn two_epochs_a_checkpoint_and_two_more_are_four_epochs_bit_for_bit() {
    use aether::nn::{Dropout, SpatialDropout};
    use aether::{Checkpoint, History};
    let dir = TempDir::new("resume");
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    let x = values(24 * 4 * 4 * 4, 71);
    let y: Vec<u32> = (0..24).map(|i| (i * 5 % 3) as u32).collect();
    let build = |device: &Device| {
        let mut model = Model::new().seed(23);
        model.add(Conv2d::new(8, (3, 3), Padding::Same));
        model.add(BatchNorm::new(0.9, 1e-3));
        model.add(ReLU::default());
        model.add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid));
        model.add(SpatialDropout::new(0.25));
        model.add(Flatten::default());
        model.add(Dropout::new(0.3));
        model.add(Dense::new(3));
        model.configure(
            Loss::SoftmaxCrossEntropy {
                label_smoothing: 0.1,
            },
            Adam::adamw(3e-3, 0.01),
            Metric::CategoricalAccuracy,
        );
        model.to(device).unwrap();
        model.finalize(&[4, 4, 4]).unwrap();
        model
    };
    for device in devices {
        let options = |epochs, checkpoint| TrainOptions {
            epochs,
            batch_size: 5,
            progress: false,
            checkpoint,
            ..TrainOptions::default()
        };
        let mut straight = build(&device);
        let history: History = straight.train(&x, &y, &options(4, None)).unwrap();
        let path = dir.0.join("ckpt.aether");
        let mut first = build(&device);
        let checkpoint = Checkpoint {
            path: path.clone(),
            every_epochs: 2,
        };
        first.train(&x, &y, &options(2, Some(checkpoint))).unwrap();
        let mut resumed = Model::resume(&path, &device).unwrap();
        // The resumed model is the one that saved it, optimizer state included.
        same_state(
            &state_bits(&resumed, &dir.0),
            &state_bits(&first, &dir.0),
            &format!("resumed on {}", device.name()),
        );
        drop(first);
        let rest = resumed.train(&x, &y, &options(2, None)).unwrap();
        same_state(
            &state_bits(&resumed, &dir.0),
            &state_bits(&straight, &dir.0),
            &device.name(),
        );
        assert_eq!(
            rest.epochs[1].loss,
            history.epochs[3].loss,
            "{}",
            device.name()
        );
        let probe = values(2 * 64, 72);
        assert_eq!(
            resumed.predict(&probe, 2, true).unwrap(),
            straight.predict(&probe, 2, true).unwrap()
        );
    }
    // A file saved before any step has no optimizer state: it loads, and
    // resuming from it is a ModelFile error naming what is missing.
    let fresh = dir.0.join("fresh.aether");
    build(&Device::Cpu).save(&fresh).unwrap();
    Model::load(&fresh, &Device::Cpu).unwrap();
    let reason = model_file_reason(Model::resume(&fresh, &Device::Cpu));
    assert!(reason.contains("aether_training"), "{reason}");
}

/// Issue 37 item 2, the conv kernels: a portable GEMM's reduction loop on
/// lavapipe. dweight splits its reduction so that each invocation's share
/// fits (its split-K rule already does on lavapipe; the plan raises it where
/// it would not): a 1x1 conv over 2^21 pixels gives the CPU's exact dW.
/// Forward, which cannot split, refuses a Dense layer of 2^20 inputs on a
/// portable GEMM instead of summing 65535 of its 65536 steps (what it did
/// before); a cooperative-matrix variant (Mesa 26's lavapipe) sums them all.
#[test]
fn conv_reductions_past_lavapipes_loop_limit_are_split_or_refused() {
    use aether::conv::{ConvParams, ConvPlans, conv2d_dweight, conv2d_forward};
    let Some(device) = gpu() else { return };
    if device
        .gpu_context()
        .unwrap()
        .caps()
        .loop_iteration_limit()
        .is_none()
    {
        common::skip("the adapter does not cut loops short");
        return;
    }
    let params = ConvParams::new(1, 1, Padding::Valid);
    let k = 1 << 20;
    // x of +-1 and dy of multiples of 2^-10 (at most 1/2): exact in f16, and
    // every partial sum of their products exact in f32 whatever the order,
    // so the GPU must give the CPU's bits. Truncated at 65535 steps of 16, a
    // sum of 2^21 terms would have lost half of them.
    let dims = vec![1, 2048, 1024, 1];
    let len = 2048 * 1024;
    let x: Vec<f32> = values(len, 81)
        .iter()
        .map(|v| if *v < 0.0 { -1.0 } else { 1.0 })
        .collect();
    let dy: Vec<f32> = values(len, 82)
        .iter()
        .map(|v| (v * 512.0).round() / 1024.0)
        .collect();
    let dw = |d: &Device| {
        let t = |data: &[f32]| aether::Tensor::from_f32(dims.clone(), data.to_vec(), d).unwrap();
        let (dw, db) = conv2d_dweight(&t(&x), &t(&dy), &params, &ConvPlans::new()).unwrap();
        (dw.to_vec_f32().unwrap()[0], db.to_vec_f32().unwrap()[0])
    };
    let (cpu, gpu_dw) = (dw(&Device::Cpu), dw(&device));
    assert_eq!(cpu, gpu_dw);
    assert!(cpu.0.abs() > 1.0 && cpu.1.abs() > 1.0, "{cpu:?}");

    // The forward over 2^20 inputs, on the same exact data: refused where
    // the chosen variant's loop would pass the limit (the portable GEMMs),
    // else (a cooperative-matrix variant, whose invocations loop less) the
    // CPU's exact bits. A truncated sum would be neither.
    let signs: Vec<f32> = values(k, 83)
        .iter()
        .map(|v| if *v < 0.0 { -1.0 } else { 1.0 })
        .collect();
    let steps: Vec<f32> = values(k, 84)
        .iter()
        .map(|v| (v * 512.0).round() / 1024.0)
        .collect();
    let forward = |d: &Device| {
        let x = aether::Tensor::from_f32(vec![1, 1, 1, k], signs.clone(), d).unwrap();
        let w = aether::Tensor::from_f32(vec![1, 1, k, 1], steps.clone(), d).unwrap();
        // A bias exact in any order of addition too.
        let b = aether::Tensor::from_f32(vec![1], vec![0.375], d).unwrap();
        conv2d_forward(&x, &w, &b, &params, &ConvPlans::new()).map(|y| y.to_vec_f32().unwrap()[0])
    };
    let cpu = forward(&Device::Cpu).unwrap();
    match forward(&device) {
        Err(err) => assert!(err.to_string().contains("loop iterations"), "{err}"),
        Ok(gpu) => assert_eq!(gpu.to_bits(), cpu.to_bits(), "GPU {gpu} vs CPU {cpu}"),
    }
}
