//! The Model: training the v1 CIFAR-10 model end to end on both devices,
//! GPU/CPU parity of predictions, save/load round trips and every bad-file
//! case, configuration errors, divergence, one submission per step, and bind
//! groups reused once training settles.

mod common;

use std::sync::Arc;

use aether::conv::Padding;
use aether::data::synthetic_images;
use aether::gpu::{DevicePreference, GpuContext};
use aether::nn::{
    BatchNorm, Conv2d, Dense, Flatten, GELU, GlobalAvgPool, Layer, LeakyReLU, MaxPool2d, ReLU,
    SiLU, Softmax,
};
use aether::optim::Adam;
use aether::{AetherError, Device, Loss, Metric, Model, Tensor, TrainOptions};
use common::{Rng, report, skip};

const SIDE: usize = 16;

fn v1_on(device: &Device, seed: u64) -> Model {
    let mut model = aether::zoo::cifar10_v1(seed);
    model.to(device).unwrap();
    model.finalize(&[SIDE, SIDE, 3]).unwrap();
    model
}

fn norm_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut d, mut n) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        d += (f64::from(x) - f64::from(y)).powi(2);
        n += f64::from(y).powi(2);
    }
    (d / n).sqrt()
}

test_device!(v1_model_learns_the_synthetic_set, |device: &Device| {
    let (x, y) = synthetic_images(320, SIDE, SIDE, 7).expect("synthetic images");
    let (vx, vy) = synthetic_images(160, SIDE, SIDE, 8).expect("synthetic images");
    let mut model = v1_on(device, 1);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(3e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    let options = TrainOptions {
        epochs: 4,
        batch_size: 32,
        validation: Some((&vx, &vy)),
        progress: false,
        ..TrainOptions::default()
    };
    let history = model.train(&x, &y, &options).unwrap();
    let first = &history.epochs[0];
    let last = history.epochs.last().unwrap();
    report(&format!(
        "[aether-test] v1 on {}: loss {:.3} -> {:.3}, accuracy {:.3} -> {:.3}, validation {:?}, {:.1} s/epoch",
        device.name(),
        first.loss,
        last.loss,
        first.accuracy,
        last.accuracy,
        last.validation,
        last.seconds
    ));
    assert!(last.loss < first.loss, "loss must fall: {history:?}");
    let (_, val_acc) = last.validation.unwrap();
    // Seeds 0-5 end at 0.42-0.60 on these 160 images (4 epochs of 320): a
    // bar at 3x chance fails a model that does not learn, not an unlucky seed.
    assert!(
        val_acc > 0.3,
        "validation accuracy {val_acc} should be far above chance (0.1)"
    );
});

#[test]
fn gpu_predictions_match_cpu_for_the_same_seed() {
    let Some(gpu) = common::gpu() else { return };
    let (x, _) = synthetic_images(9, SIDE, SIDE, 3).expect("synthetic images");
    let cpu_probs = v1_on(&Device::Cpu, 5).predict(&x, 4, true).unwrap();
    let gpu_probs = v1_on(&gpu, 5).predict(&x, 4, true).unwrap();
    let err = norm_rel(&gpu_probs, &cpu_probs);
    // f16 conv operands on the GPU: 5e-3 norm-relative on the logits.
    assert!(err <= 5e-3, "logits differ by {err:e}");
}

/// The v1 model on a GPU device of its own (so no other test's work shows in
/// its counters), with that device's context; None without a GPU.
fn v1_on_own_gpu(seed: u64) -> Option<(Arc<GpuContext>, Model)> {
    common::gpu()?;
    let device =
        Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap();
    let ctx = device.gpu_context().unwrap().clone();
    Some((ctx, v1_on(&device, seed)))
}

/// A step recorded while the previous one may still run is one submission. A
/// step recorded after the host waited for the GPU is submitted in pieces as
/// it is recorded, after 8, 16 more, 32 more, ... dispatches, so the idle GPU
/// starts on its first kernels early. Both give the same model.
#[test]
fn a_training_step_is_one_submission_unless_the_gpu_was_idle() {
    let Some((ctx, mut model)) = v1_on_own_gpu(2) else {
        return;
    };
    let Some((twin_ctx, mut twin)) = v1_on_own_gpu(2) else {
        return;
    };
    let (x, y) = synthetic_images(8, SIDE, SIDE, 4).expect("synthetic images");
    let (mut losses, mut twin_losses) = (Vec::new(), Vec::new());
    for step in 0..3 {
        // `model` waits for every step, `twin` for none.
        ctx.wait_idle().unwrap();
        let (before, dispatches) = (ctx.submission_count(), ctx.dispatch_count());
        let (loss, _) = model.train_batch(&x, &y).unwrap();
        ctx.flush();
        let after_wait = ctx.submission_count() - before;
        let dispatches = ctx.dispatch_count() - dispatches;
        let before = twin_ctx.submission_count();
        let (twin_loss, _) = twin.train_batch(&x, &y).unwrap();
        twin_ctx.flush();
        let back_to_back = twin_ctx.submission_count() - before;
        report(&format!(
            "[aether-test] step {step}: {dispatches} dispatches in {after_wait} submission(s) \
             after a wait, {back_to_back} back to back"
        ));
        // The first step also uploads the optimizer's initial state.
        if step > 0 {
            assert_eq!(back_to_back, 1, "step {step} back to back");
            assert_eq!(
                after_wait,
                early_submissions(dispatches),
                "step {step} after a wait"
            );
        }
        losses.extend(loss.to_vec_f32().unwrap());
        twin_losses.push(twin_loss);
    }
    let twin_losses: Vec<f32> = twin_losses
        .iter()
        .flat_map(|l| l.to_vec_f32().unwrap())
        .collect();
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert_eq!(losses, twin_losses);
    let predict = |m: &mut Model| m.predict(&x, 8, true).unwrap();
    assert_eq!(predict(&mut model), predict(&mut twin));
}

/// Submissions for `dispatches` recorded after a wait: one after 8, 16 more,
/// 32 more, ..., and one for what is left.
fn early_submissions(dispatches: usize) -> usize {
    let (mut submissions, mut next, mut left) = (0, 8, dispatches);
    while left >= next {
        (submissions, left, next) = (submissions + 1, left - next, 2 * next);
    }
    submissions + usize::from(left > 0)
}

/// Once training has settled, a step meets the same pooled buffers with the same
/// pipelines every time, so it builds (almost) no bind groups: the pool hands
/// out the lowest free buffer and layers drop their step's caches at its end.
/// Handing out the last buffer returned instead built a new bind group for
/// about half of a v1 step's dispatches, every step, without end. Nor does it
/// copy buffers: the layers write their gradients into the optimizer's packed
/// buffer and hold views of its packed parameters (66 copies a step before).
#[test]
fn a_settled_training_step_reuses_its_bind_groups_and_copies_nothing() {
    let Some((ctx, mut model)) = v1_on_own_gpu(3) else {
        return;
    };
    let (x, y) = synthetic_images(8, SIDE, SIDE, 4).expect("synthetic images");
    for _ in 0..30 {
        model.train_batch(&x, &y).unwrap();
    }
    let (before, dispatches, copies) = (
        ctx.bind_groups_created(),
        ctx.dispatch_count(),
        ctx.copy_count(),
    );
    const STEPS: usize = 5;
    for _ in 0..STEPS {
        model.train_batch(&x, &y).unwrap();
    }
    ctx.flush();
    let built = ctx.bind_groups_created() - before;
    let dispatched = ctx.dispatch_count() - dispatches;
    report(&format!(
        "[aether-test] {built} bind groups built for {dispatched} dispatches in {STEPS} settled steps"
    ));
    assert!(
        built * 20 <= dispatched,
        "{built} bind groups built for {dispatched} dispatches: steps do not reuse their buffers"
    );
    let copied = ctx.copy_count() - copies;
    assert_eq!(copied, 0, "{copied} buffer copies in {STEPS} settled steps");
}

test_device!(save_load_round_trip_across_devices, |device: &Device| {
    let (x, y) = synthetic_images(64, SIDE, SIDE, 9).expect("synthetic images");
    let mut model = v1_on(device, 3);
    model
        .train(
            &x,
            &y,
            &TrainOptions {
                epochs: 1,
                batch_size: 16,
                progress: false,
                ..TrainOptions::default()
            },
        )
        .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "aether-model-{}-{}",
        std::process::id(),
        Rng::fresh().next_u64()
    ));
    let path = dir.join("v1.aether");
    model.save(&path).unwrap();
    let want = model.predict(&x[..SIDE * SIDE * 3 * 5], 5, false).unwrap();
    let mut loaded = Model::load(&path, &Device::Cpu).unwrap();
    let got = loaded.predict(&x[..SIDE * SIDE * 3 * 5], 5, false).unwrap();
    let err = norm_rel(&got, &want);
    assert!(err <= 5e-3, "loaded model predicts differently: {err:e}");
    // The same file loads back into the same architecture; no temp files stay behind.
    model.load_weights(&path).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
});

/// `Layer::state_values`, which `Model::load` holds a file's architecture to,
/// counts what `build` allocates, for layers with state and without.
#[test]
fn state_values_count_what_build_allocates() {
    let layers: Vec<(Box<dyn Layer>, Vec<usize>)> = vec![
        (
            Box::new(aether::nn::Conv2d::new(5, (3, 2), Padding::Valid)),
            vec![7, 6, 3],
        ),
        (Box::new(Dense::new(9)), vec![13]),
        (
            Box::new(aether::nn::BatchNorm::new(0.9, 1e-3)),
            vec![4, 4, 6],
        ),
        (Box::new(Flatten::default()), vec![2, 3, 4]),
    ];
    for (mut layer, input) in layers {
        let predicted = layer.state_values(&input).unwrap();
        layer.build(&input, 7, &Device::Cpu).unwrap();
        let held: usize = layer.state().iter().map(|(_, t)| t.numel()).sum();
        assert_eq!(predicted, held, "{:?} on {input:?}", layer.spec());
    }
}

fn small_model(units: usize) -> Model {
    let mut model = Model::new().seed(1);
    model.add(Flatten::default());
    model.add(Dense::new(units));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-2),
        Metric::CategoricalAccuracy,
    );
    model.finalize(&[2, 2, 3]).unwrap();
    model
}

fn expect_model_file_error(result: Result<(), AetherError>, needle: &str) {
    match result {
        Err(AetherError::ModelFile { reason, .. }) => assert!(reason.contains(needle), "{reason}"),
        other => panic!("expected a ModelFile error containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn bad_model_files_give_typed_errors_naming_the_problem() {
    let dir = std::env::temp_dir().join(format!("aether-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.aether");
    small_model(4).save(&good).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    let truncated = dir.join("truncated.aether");
    std::fs::write(&truncated, &bytes[..bytes.len() - 7]).unwrap();
    expect_model_file_error(
        Model::load(&truncated, &Device::Cpu).map(|_| ()),
        "safetensors",
    );

    expect_model_file_error(small_model(5).load_weights(&good), "another architecture");

    // Same architecture metadata, but the kernel tensor has the wrong shape
    // (more values than the architecture's, so the loader's state budget
    // passes and the shape check names the tensor).
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let arch = header["__metadata__"]["aether_architecture"]
        .as_str()
        .unwrap()
        .to_owned();
    let kernel = vec![0u8; 4 * 12 * 5];
    let bias = vec![0u8; 4 * 4];
    let views = vec![
        (
            "layers.1.kernel".to_owned(),
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                vec![1, 1, 12, 5],
                &kernel,
            )
            .unwrap(),
        ),
        (
            "layers.1.bias".to_owned(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &bias).unwrap(),
        ),
    ];
    let meta = std::collections::HashMap::from([("aether_architecture".to_owned(), arch.clone())]);
    let wrong = dir.join("wrong-shape.aether");
    std::fs::write(&wrong, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
    expect_model_file_error(
        Model::load(&wrong, &Device::Cpu).map(|_| ()),
        "layers.1.kernel",
    );

    // An input shape whose sample overflows the count of values, or has an
    // empty axis: refused before any layer builds.
    for input in ["[4294967296,4294967296,2]", "[2,0,3]"] {
        let shape = arch.replace("[2,2,3]", input);
        assert_ne!(
            shape, arch,
            "the architecture names its input shape as [2,2,3]"
        );
        let meta = std::collections::HashMap::from([("aether_architecture".to_owned(), shape)]);
        let huge = dir.join("huge-input.aether");
        let no_tensors = Vec::<(String, safetensors::tensor::TensorView)>::new();
        std::fs::write(
            &huge,
            safetensors::serialize(no_tensors, Some(meta)).unwrap(),
        )
        .unwrap();
        expect_model_file_error(Model::load(&huge, &Device::Cpu).map(|_| ()), "input shape");
    }

    // An architecture asking for more state than the file's tensors hold
    // (a Dense layer of 2^27 units, 6 GiB of weights, beside the 52 values
    // of the real one): refused before any layer allocates.
    let huge_units = arch.replace("\"units\":4,", "\"units\":134217728,");
    assert_ne!(
        huge_units, arch,
        "the architecture names its Dense units as 4"
    );
    let meta = std::collections::HashMap::from([("aether_architecture".to_owned(), huge_units)]);
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let huge = dir.join("huge-layer.aether");
    std::fs::write(
        &huge,
        safetensors::serialize(file.tensors(), Some(meta)).unwrap(),
    )
    .unwrap();
    expect_model_file_error(
        Model::load(&huge, &Device::Cpu).map(|_| ()),
        "more than the model file's tensors hold (52)",
    );

    let plain = dir.join("plain.safetensors");
    std::fs::write(
        &plain,
        safetensors::serialize(
            Vec::<(String, safetensors::tensor::TensorView)>::new(),
            None,
        )
        .unwrap(),
    )
    .unwrap();
    expect_model_file_error(
        Model::load(&plain, &Device::Cpu).map(|_| ()),
        "not an aether model",
    );

    assert!(matches!(
        Model::load(dir.join("missing"), &Device::Cpu),
        Err(AetherError::Io { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn configuration_errors_are_clear() {
    let mut model = Model::new();
    model.add(Flatten::default());
    model.add(Dense::new(3));
    model.add(Softmax::default());
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    let err = model.finalize(&[2, 2, 1]).unwrap_err().to_string();
    assert!(err.contains("Softmax"), "{err}");

    let mut model = Model::new();
    model.add(ReLU::default());
    model.add(Dense::new(3));
    let err = model.finalize(&[4, 4, 2]).unwrap_err().to_string();
    assert!(err.contains("layer 1") && err.contains("Flatten"), "{err}");

    let mut model = Model::new();
    model.add(aether::nn::Conv2d::new(4, (5, 5), Padding::Valid));
    let err = model.finalize(&[3, 3, 1]).unwrap_err().to_string();
    assert!(err.contains("layer 0"), "{err}");

    // A layer added after finalize has no weights: nothing saves or trains
    // until finalize builds it.
    let mut model = small_model(3);
    model.add(Dense::new(2));
    let path =
        std::env::temp_dir().join(format!("aether-unbuilt-{}.safetensors", std::process::id()));
    let err = model.save(&path).unwrap_err().to_string();
    assert!(err.contains("finalize") && !path.exists(), "{err}");
    let err = model.train_batch(&[0.5; 12], &[1]).unwrap_err().to_string();
    assert!(err.contains("finalize"), "{err}");
    model.finalize(&[2, 2, 3]).unwrap();
    model.train_batch(&[0.5; 12], &[1]).unwrap();

    // A last batch of one sample gives a dense BatchNorm one value per
    // channel: refused before the first step, not after the epoch's work.
    let mut model = Model::new();
    model.add(Flatten::default());
    model.add(Dense::new(4));
    model.add(aether::nn::BatchNorm::new(0.9, 1e-3));
    model.add(Dense::new(3));
    let mut model = common::ready_model(model, &Device::Cpu, &[2, 2, 1]);
    let options = TrainOptions {
        batch_size: 2,
        progress: false,
        ..TrainOptions::default()
    };
    let x = Rng::fresh().vec(5 * 4);
    let err = model
        .train(&x, &[0, 1, 2, 0, 1], &options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("batch of 1") && err.contains("layer 2"),
        "{err}"
    );
    model.train(&x[..16], &[0, 1, 2, 0], &options).unwrap();

    // One batch of one sample likewise, through train_batch and
    // train_tensors: refused before the forward pass, so the BatchNorm in
    // front (4 values a channel) keeps its running statistics.
    let mut model = Model::new();
    model.add(aether::nn::BatchNorm::new(0.9, 1e-3));
    model.add(Flatten::default());
    model.add(Dense::new(4));
    model.add(aether::nn::BatchNorm::new(0.9, 1e-3));
    model.add(Dense::new(3));
    let mut model = common::ready_model(model, &Device::Cpu, &[2, 2, 1]);
    let saved = |model: &Model, name: &str| {
        let path = std::env::temp_dir().join(format!("aether-{name}-{}", std::process::id()));
        model.save(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        bytes
    };
    let before = saved(&model, "bn-before");
    let err = model.train_batch(&x[..4], &[1]).unwrap_err().to_string();
    assert!(
        err.contains("batch of 1") && err.contains("layer 3"),
        "{err}"
    );
    let one = Tensor::from_f32(vec![1, 2, 2, 1], x[..4].to_vec(), &Device::Cpu).unwrap();
    let label = Tensor::from_u32(vec![1], vec![1], &Device::Cpu).unwrap();
    let err = model.train_tensors(&one, &label).unwrap_err().to_string();
    assert!(err.contains("layer 3"), "{err}");
    assert!(
        before == saved(&model, "bn-after"),
        "a refused step changed the model"
    );
    model.train_batch(&x[..8], &[1, 2]).unwrap();
    assert!(
        before != saved(&model, "bn-trained"),
        "the step changed nothing"
    );

    // Hyperparameters out of range (NaN included) are refused at finalize,
    // before they train NaNs or save a file whose JSON holds null.
    for (momentum, epsilon, needle) in [
        (f32::NAN, 1e-3, "BatchNorm momentum = NaN"),
        (1.5, 1e-3, "BatchNorm momentum = 1.5"),
        (0.9, 0.0, "BatchNorm epsilon = 0"),
    ] {
        let mut model = Model::new();
        model.add(Flatten::default());
        model.add(aether::nn::BatchNorm::new(momentum, epsilon));
        let err = model.finalize(&[2, 2, 1]).unwrap_err().to_string();
        assert!(err.contains("layer 1") && err.contains(needle), "{err}");
    }
    // The other layers' hyperparameters and the loss's likewise.
    type AddLayer = Box<dyn Fn(&mut Model)>;
    let layers: [(AddLayer, &str); 5] = [
        (
            Box::new(|m| {
                m.add(Dense::new(3).regularize(f32::NAN, 0.0, 0.0, 0.0));
            }),
            "l1 = NaN",
        ),
        (
            Box::new(|m| {
                m.add(Dense::new(3).regularize(0.0, 0.0, 0.0, -1.0));
            }),
            "bias_l2 = -1",
        ),
        (
            Box::new(|m| {
                m.add(aether::nn::Dropout::new(1.0));
            }),
            "dropout rate = 1",
        ),
        (
            Box::new(|m| {
                m.add(aether::nn::SpatialDropout::new(f32::NAN));
            }),
            "dropout rate = NaN",
        ),
        (
            Box::new(|m| {
                m.add(aether::nn::LeakyReLU::new(f32::INFINITY));
            }),
            "LeakyReLU alpha = inf",
        ),
    ];
    for (add, needle) in layers {
        let mut model = Model::new();
        model.add(Flatten::default());
        add(&mut model);
        let err = model.finalize(&[2, 2, 1]).unwrap_err().to_string();
        assert!(err.contains("layer 1") && err.contains(needle), "{err}");
    }
    // CategoricalCrossEntropy takes probabilities: a model ending in logits
    // is refused, naming its last layer.
    let mut logits = small_model(3);
    assert_eq!(Dense::new(3).units(), 3);
    logits.configure(
        Loss::CategoricalCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    let err = logits.finalize(&[2, 2, 3]).unwrap_err().to_string();
    assert!(err.contains("last layer is Dense"), "{err}");
    for smoothing in [f32::NAN, 1.5] {
        let mut model = small_model(3);
        model.configure(
            Loss::SoftmaxCrossEntropy {
                label_smoothing: smoothing,
            },
            Adam::new(1e-3),
            Metric::CategoricalAccuracy,
        );
        match model.finalize(&[2, 2, 3]) {
            Err(AetherError::InvalidHyperparameter { name, .. }) => {
                assert_eq!(name, "label_smoothing")
            }
            other => panic!("label_smoothing {smoothing}: got {other:?}"),
        }
    }
    let mut no_momentum_decay = Adam::new(1e-3);
    no_momentum_decay.beta1 = 1.0;
    let adams = [
        (Adam::new(f32::NAN), "Adam learning_rate = NaN"),
        (Adam::new(-1e-3), "Adam learning_rate = -0.001"),
        (no_momentum_decay, "Adam beta1 = 1"),
        (Adam::adamw(1e-3, f32::INFINITY), "Adam weight_decay = inf"),
    ];
    for (adam, needle) in adams {
        let mut model = small_model(3);
        model.configure(
            Loss::SoftmaxCrossEntropy {
                label_smoothing: 0.0,
            },
            adam,
            Metric::CategoricalAccuracy,
        );
        match model.finalize(&[2, 2, 3]) {
            Err(err @ AetherError::InvalidHyperparameter { .. }) => {
                assert!(err.to_string().contains(needle), "{err}")
            }
            other => panic!("{needle}: expected InvalidHyperparameter, got {other:?}"),
        }
    }
}

// A model finalized again for another input shape after training trains on
// (its layers' gradients went into the old optimizer's buffer, sized for the
// old weights); one whose second finalize fails is left unfinalized, not
// half rebuilt, and `train_tensors` asks for finalize as `train_batch` does.
test_device!(
    finalize_again_rebuilds_the_model_or_leaves_it_unfinalized,
    |device: &Device| {
        let mut model = Model::new().seed(4);
        model.add(Flatten::default());
        model.add(Dense::new(3));
        let mut model = common::ready_model(model, device, &[2, 2, 3]);
        let mut rng = Rng::fresh();
        let (y, x12) = (vec![0, 1, 2, 0], rng.vec(4 * 12));
        model.train_batch(&x12, &y).unwrap();
        model.finalize(&[2, 3, 3]).unwrap();
        let x18 = rng.vec(4 * 18);
        for _ in 0..2 {
            let (loss, _) = model.train_batch(&x18, &y).unwrap();
            let loss = loss.to_vec_f32().unwrap()[0];
            assert!(loss.is_finite(), "loss {loss} after finalize again");
        }

        // Conv2d over a 1-pixel-wide input: a 3x3 valid conv cannot build.
        let mut conv = Model::new();
        conv.add(aether::nn::Conv2d::new(2, (1, 1), Padding::Valid));
        conv.add(aether::nn::Conv2d::new(2, (3, 3), Padding::Valid));
        conv.add(Flatten::default());
        let mut conv = common::ready_model(conv, device, &[3, 3, 1]);
        assert!(conv.finalize(&[3, 1, 1]).is_err());
        let unfinalized = |result: Result<(), AetherError>, what: &str| {
            let err = result.expect_err(what).to_string();
            assert!(err.contains("call finalize"), "{what}: {err}");
        };
        let x9 = rng.vec(9);
        unfinalized(conv.predict(&x9, 1, false).map(drop), "predict");
        let path = std::env::temp_dir().join(format!("aether-half-{}", std::process::id()));
        unfinalized(conv.save(&path), "save");
        assert!(!path.exists());
        model.add(Softmax::default());
        let xt = Tensor::from_f32(vec![4, 2, 3, 3], x18, device).unwrap();
        let yt = Tensor::from_u32(vec![4], y, device).unwrap();
        unfinalized(model.train_tensors(&xt, &yt).map(drop), "train_tensors");
    }
);

// A model trained on the GPU, moved to the CPU and to a second GPU context
// without coop kernels, trains on at each stop: its layers' gradient
// destinations (the old optimizer's buffer) and conv launch plans (made for
// the first context) do not follow it.
test_device!(
    a_trained_model_trains_on_after_moving_devices,
    |device: &Device| {
        let mut model = v1_on(device, 3);
        let (x, y) = synthetic_images(8, SIDE, SIDE, 5).expect("synthetic images");
        let mut stops = vec![device.clone(), Device::Cpu];
        if device.gpu_context().is_some() {
            let options = aether::gpu::GpuOptions {
                disable_coop: true,
                ..common::test_gpu_options()
            };
            stops.push(Device::with_preference(DevicePreference::Gpu, &options).unwrap());
        }
        for stop in &stops {
            model.to(stop).unwrap();
            for _ in 0..2 {
                let (loss, _) = model.train_batch(&x, &y).unwrap();
                let loss = loss.to_vec_f32().unwrap()[0];
                assert!(loss.is_finite(), "on {stop:?}: loss {loss}");
            }
        }
    }
);

test_device!(
    labels_past_the_last_class_are_refused_before_any_step,
    |device: &Device| {
        let mut model = small_model(3);
        model.to(device).unwrap();
        let x = Rng::fresh().vec(4 * 12);
        let (good, bad) = (vec![0, 1, 2, 0], vec![0, 1, 3, 0]);
        let options = TrainOptions {
            epochs: 1,
            batch_size: 2,
            progress: false,
            ..TrainOptions::default()
        };
        let refused = |result: Result<(), AetherError>, what: &str| {
            let err = result.expect_err(what).to_string();
            assert!(err.contains("label 3 of sample 2"), "{what}: {err}");
        };
        refused(model.train(&x, &bad, &options).map(drop), "train");
        refused(model.train_batch(&x, &bad).map(drop), "train_batch");
        refused(model.evaluate(&x, &bad, 2).map(drop), "evaluate");
        let validation = TrainOptions {
            validation: Some((&x, &bad)),
            ..options.clone()
        };
        refused(model.train(&x, &good, &validation).map(drop), "validation");
        // Nothing trained: the first step from here matches a fresh model's.
        let mut fresh = small_model(3);
        fresh.to(device).unwrap();
        let loss = |m: &mut Model| m.train_batch(&x, &good).unwrap().0.to_vec_f32().unwrap();
        assert_eq!(loss(&mut model), loss(&mut fresh));
    }
);

test_device!(
    non_finite_loss_stops_training_naming_the_step,
    |device: &Device| {
        let x = Rng::fresh().vec(4 * 8);
        let y = vec![0, 1, 2, 0, 1, 2, 0, 1];
        // A learning rate of f32::MAX drives the bias past f32 within a few steps
        // (NaN in host data is refused before any step). Logging every step,
        // and only at the epoch's end: the loss is read back at step 4 there,
        // and the error still names the same step.
        let mut steps = Vec::new();
        for log_every in [1, 100] {
            let mut model = Model::new().seed(2);
            model.to(device).unwrap();
            model.add(Flatten::default());
            model.add(Dense::new(3));
            model.configure(
                Loss::SoftmaxCrossEntropy {
                    label_smoothing: 0.0,
                },
                Adam::new(f32::MAX),
                Metric::CategoricalAccuracy,
            );
            model.finalize(&[2, 2, 1]).unwrap();
            let options = TrainOptions {
                epochs: 1,
                batch_size: 2,
                shuffle: false,
                log_every,
                progress: false,
                ..TrainOptions::default()
            };
            match model.train(&x, &y, &options) {
                Err(AetherError::NonFiniteLoss { step, .. }) => steps.push(step),
                other => panic!("log_every {log_every}: expected NonFiniteLoss, got {other:?}"),
            }
        }
        assert!(steps[0] > 1 && steps[0] <= 4, "{steps:?}");
        assert_eq!(steps[0], steps[1]);
    }
);

/// `build(fuse)`'s model, with fusion on and then off, as
/// [`loss_and_logit_bits`] gives it on 8 synthetic images, after checking
/// that `listed` names `folded` with fusion on and nothing with it off.
fn fused_and_separate(
    build: impl Fn(bool) -> Model,
    listed: fn(&Model) -> Vec<usize>,
    folded: &[usize],
) -> (Vec<u32>, Vec<u32>) {
    let (x, y) = synthetic_images(8, SIDE, SIDE, 5).expect("synthetic images");
    let run = |fuse: bool| {
        let mut model = build(fuse);
        let expected = if fuse { folded.to_vec() } else { vec![] };
        assert_eq!(listed(&model), expected, "fusion {fuse}");
        loss_and_logit_bits(&mut model, &x, &y)
    };
    let (fused, separate) = (run(true), run(false));
    assert_eq!(fused.len(), separate.len());
    (fused, separate)
}

/// The bits of the losses of 3 training steps on `(x, y)`, then of the
/// logits the model predicts for `x` (8 samples).
fn loss_and_logit_bits(model: &mut Model, x: &[f32], y: &[u32]) -> Vec<u32> {
    let mut bits = Vec::new();
    for _ in 0..3 {
        let (loss, _) = model.train_batch(x, y).unwrap();
        bits.push(loss.to_vec_f32().unwrap()[0].to_bits());
    }
    let predictions = model.predict(x, 8, true).unwrap();
    bits.extend(predictions.iter().map(|v| v.to_bits()));
    bits
}

test_device!(
    fused_relu_trains_bit_identically_to_separate_layers,
    |device: &Device| {
        // v1 has BatchNorm -> ReLU after every conv: finalize folds each ReLU into
        // its BatchNorm unless told not to. Three steps, then predictions.
        let build = |fuse: bool| {
            let mut model = aether::zoo::cifar10_v1(6).fuse_activations(fuse);
            model.to(device).unwrap();
            model.finalize(&[SIDE, SIDE, 3]).unwrap();
            model
        };
        let folded = [2, 5, 10, 13, 18];
        let (fused, separate) = fused_and_separate(build, Model::fused_activations, &folded);
        let first_difference = fused.iter().zip(&separate).position(|(a, b)| a != b);
        assert_eq!(
            first_difference, None,
            "losses (first 3) then logits differ between fused and separate ReLU"
        );
    }
);

test_device!(
    fused_gelu_silu_and_leaky_relu_train_as_separate_layers,
    |device: &Device| {
        // A GELU, a SiLU and a leaky ReLU, each the sole reader of a
        // BatchNorm, fold into it (the GELU's BatchNorm one channel a lane,
        // the others four): three steps, then predictions. The CPU runs the
        // layers' own ops, bit for bit; a GPU compiler may contract the
        // recomputed normalized value differently in two kernels, so there
        // the bound is 1e-5 relative.
        let build = |fuse: bool| {
            let mut model = Model::new().seed(3).fuse_activations(fuse);
            model
                .add(Conv2d::new(6, (3, 3), Padding::Same))
                .add(BatchNorm::new(0.9, 1e-5))
                .add(GELU::default())
                .add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
                .add(Conv2d::new(12, (3, 3), Padding::Same))
                .add(BatchNorm::new(0.9, 1e-5))
                .add(SiLU::default())
                .add(Conv2d::new(8, (3, 3), Padding::Same))
                .add(BatchNorm::new(0.9, 1e-5))
                .add(LeakyReLU::new(0.2))
                .add(GlobalAvgPool::default())
                .add(Dense::new(10));
            common::ready_model(model, device, &[SIDE, SIDE, 3])
        };
        let (fused, separate) = fused_and_separate(build, Model::fused_activations, &[2, 6, 9]);
        let exact = device.gpu_context().is_none();
        let apart = |(a, b): (&u32, &u32)| {
            let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
            if exact {
                a.to_bits() != b.to_bits()
            } else {
                (a - b).abs() > 1e-5 * a.abs().max(b.abs()).max(1e-3)
            }
        };
        let first_difference = fused.iter().zip(&separate).position(apart);
        assert_eq!(
            first_difference, None,
            "losses (first 3) then logits differ between fused and separate activations"
        );
    }
);

test_device!(
    fused_dropout_trains_bit_identically_to_separate_layers,
    |device: &Device| {
        // v1 has MaxPool2d -> SpatialDropout three times, every pool's windows
        // tiling its input: finalize folds each dropout into its pool unless
        // told not to. With f16 activations, pools 6 and 14 then write the
        // f16 that dropouts 7 and 15 wrote. Three steps, then predictions.
        let build = |fuse: bool| {
            let mut model = aether::zoo::cifar10_v1(6).fuse_dropout(fuse);
            model.to(device).unwrap();
            model.finalize(&[SIDE, SIDE, 3]).unwrap();
            assert_eq!(model.fused_activations(), [2, 5, 10, 13, 18]);
            model
        };
        let (fused, separate) = fused_and_separate(build, Model::fused_dropouts, &[7, 15, 20]);
        let first_difference = fused.iter().zip(&separate).position(|(a, b)| a != b);
        assert_eq!(
            first_difference, None,
            "losses (first 3) then logits differ between fused and separate dropout"
        );
    }
);

test_device!(
    f16_activations_train_bit_identically_to_f32_ones,
    |device: &Device| {
        // In v1, BatchNorm 1 and 9 (each with its ReLU folded in) and the
        // max pools 6 and 14 (each with its spatial dropout folded in) feed a
        // conv: where the conv rounds its input to f16, they write f16
        // outputs. Each BatchNorm's input gradient goes to a conv, which
        // rounds it to f16.
        let (x, y) = synthetic_images(8, SIDE, SIDE, 5).expect("synthetic images");
        let conv = aether::nn::Conv2d::new(8, (3, 3), Padding::Same);
        let rounds = conv.rounds_input_to_f16(device);
        let run = |f16: bool| {
            let mut model = aether::zoo::cifar10_v1(6).f16_activations(f16);
            model.to(device).unwrap();
            model.finalize(&[SIDE, SIDE, 3]).unwrap();
            let expected = if f16 && rounds {
                vec![1, 6, 9, 14]
            } else {
                vec![]
            };
            assert_eq!(model.f16_outputs(), expected, "f16_activations({f16})");
            // Every BatchNorm follows a conv: all return f16 input gradients.
            let expected = if f16 && rounds {
                vec![1, 4, 9, 12, 17]
            } else {
                vec![]
            };
            assert_eq!(model.f16_input_grads(), expected, "f16_activations({f16})");
            loss_and_logit_bits(&mut model, &x, &y)
        };
        let half = run(true);
        let single = run(false);
        let first_difference = half.iter().zip(&single).position(|(a, b)| a != b);
        assert_eq!(
            first_difference, None,
            "losses (first 3) then logits differ between f16 and f32 activations"
        );
        if !rounds {
            report(&format!(
                "[aether-test] {}: no conv rounds to f16 here, so no f16 activations",
                device.name()
            ));
        }
    }
);

/// Trains the model `layers` builds with f16 activations on and off, three
/// steps then predictions, and checks it bit for bit; with them on, where
/// convs round to f16, the layers writing f16 input gradients and outputs
/// are `grads` and `outputs`.
fn f16_trains_as_f32(device: &Device, layers: fn(&mut Model), grads: &[usize], outputs: &[usize]) {
    let (x, y) = synthetic_images(8, SIDE, SIDE, 5).expect("synthetic images");
    let rounds = Conv2d::new(8, (3, 3), Padding::Same).rounds_input_to_f16(device);
    let run = |f16: bool| {
        let mut model = Model::new().seed(7).f16_activations(f16);
        layers(&mut model);
        let mut model = common::ready_model(model, device, &[SIDE, SIDE, 3]);
        let on = f16 && rounds;
        let expected = |layers: &[usize]| if on { layers.to_vec() } else { vec![] };
        assert_eq!(
            model.f16_input_grads(),
            expected(grads),
            "f16 input gradients"
        );
        assert_eq!(model.f16_outputs(), expected(outputs), "f16 outputs");
        loss_and_logit_bits(&mut model, &x, &y)
    };
    let half = run(true);
    let single = run(false);
    let first_difference = half.iter().zip(&single).position(|(a, b)| a != b);
    assert_eq!(
        first_difference, None,
        "losses (first 3) then logits differ between f16 and f32 activations"
    );
}

test_device!(
    f16_gradients_from_a_max_pool_train_bit_identically_to_f32_ones,
    |device: &Device| {
        // airbench's group: conv, 2x2 max pool, BatchNorm + GELU, conv,
        // BatchNorm + ReLU. The pool (1) writes the first conv's output
        // gradient as f16, and BatchNorm 5 the second's; BatchNorm 2, whose
        // GELU runs inside it, writes the second conv's input as f16.
        let layers = |model: &mut Model| {
            model
                .add(Conv2d::new(8, (3, 3), Padding::Same).bias(false))
                .add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
                .add(BatchNorm::new(0.9, 1e-5))
                .add(GELU::default())
                .add(Conv2d::new(12, (3, 3), Padding::Same).bias(false))
                .add(BatchNorm::new(0.9, 1e-5))
                .add(ReLU::default())
                .add(GlobalAvgPool::default())
                .add(Dense::new(10));
        };
        f16_trains_as_f32(device, layers, &[1, 5], &[2]);
    }
);

test_device!(
    f16_gradients_from_activations_train_bit_identically_to_f32_ones,
    |device: &Device| {
        // Convs without BatchNorm, each followed by an activation: ReLU (1),
        // leaky ReLU (3), GELU (6) and SiLU (8) write their conv's output
        // gradient as f16 (the max pool 4 follows an activation, not a
        // conv); ReLU, the pool and GELU write the next conv's input as f16.
        let layers = |model: &mut Model| {
            model
                .add(Conv2d::new(8, (3, 3), Padding::Same))
                .add(ReLU::default())
                .add(Conv2d::new(8, (3, 3), Padding::Same))
                .add(LeakyReLU::new(0.1))
                .add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
                .add(Conv2d::new(12, (3, 3), Padding::Same))
                .add(GELU::default())
                .add(Conv2d::new(12, (3, 3), Padding::Same))
                .add(SiLU::default())
                .add(GlobalAvgPool::default())
                .add(Dense::new(10));
        };
        f16_trains_as_f32(device, layers, &[1, 3, 6, 8], &[1, 4, 6]);
    }
);

/// f16 activations and gradients take no dispatch of their own (BatchNorm
/// writes them in its normalize and dx passes, a max pool with its dropout
/// folded in as it pools) and save the casts: in v1, every conv gets both
/// backward operands as f16 (its input is the f16 batch, a BatchNorm's or a
/// max pool's f16 output) and casts nothing. Each conv casts once for both of its backward
/// GEMMs (dweight and dinput each cast an f32 gradient before); without f16
/// activations convs 3, 8, 11 and 16 take one fused cast each and conv 0 one
/// of its gradient (the batch is uploaded as f16 either way): 5 dispatches a
/// step. The loss scaler's saturation check of each conv's output gradient
/// takes none either way: a BatchNorm writing it as f16 flags it in the same
/// pass, and a conv casting an f32 one flags it in its cast.
#[test]
fn f16_activations_save_the_backward_casts() {
    let Some((ctx, _)) = v1_on_own_gpu(2) else {
        return;
    };
    let device = Device::Gpu(ctx.clone());
    let (x, y) = synthetic_images(8, SIDE, SIDE, 4).expect("synthetic images");
    let dispatches_per_step = |f16: bool| {
        let mut model = aether::zoo::cifar10_v1(2).f16_activations(f16);
        model.to(&device).unwrap();
        model.finalize(&[SIDE, SIDE, 3]).unwrap();
        model.train_batch(&x, &y).unwrap();
        let before = ctx.dispatch_count();
        model.train_batch(&x, &y).unwrap();
        (ctx.dispatch_count() - before, model.f16_outputs())
    };
    let (half, half_layers) = dispatches_per_step(true);
    let (single, _) = dispatches_per_step(false);
    report(&format!(
        "[aether-test] {half} dispatches a step with f16 outputs from layers {half_layers:?}, {single} without"
    ));
    assert_eq!(
        half + 5,
        single,
        "dispatches a step, f16 activations against f32"
    );
}

/// The first training step (train-mode BatchNorm, dropout masks, loss) gives
/// the same loss on the GPU as on the CPU for the same seed.
#[test]
fn first_training_step_loss_matches_cpu() {
    let Some(gpu) = common::gpu() else { return };
    let (x, y) = synthetic_images(12, SIDE, SIDE, 11).expect("synthetic images");
    let cpu_loss = v1_on(&Device::Cpu, 4)
        .train_batch(&x, &y)
        .unwrap()
        .0
        .to_vec_f32()
        .unwrap()[0];
    let gpu_loss = v1_on(&gpu, 4)
        .train_batch(&x, &y)
        .unwrap()
        .0
        .to_vec_f32()
        .unwrap()[0];
    let rel = ((gpu_loss - cpu_loss) / cpu_loss).abs();
    // f16 conv operands on the GPU.
    assert!(
        rel <= 5e-3,
        "loss {gpu_loss} on the GPU vs {cpu_loss} on the CPU"
    );
}

/// A conv first layer rounds its input to f16 on a GPU with f16 kernels, so the
/// model uploads its batches as f16: training on them gives exactly what
/// training on the batch rounded on the host and passed as a tensor gives.
#[test]
fn a_conv_first_model_trains_on_its_batches_rounded_to_f16() {
    let Some(gpu) = common::gpu() else { return };
    let conv = aether::nn::Conv2d::new(8, (3, 3), Padding::Same);
    assert!(!conv.rounds_input_to_f16(&Device::Cpu));
    let caps = gpu.gpu_context().unwrap().caps();
    if !caps.shader_f16 {
        return skip("no shader-f16: the conv kernels take f32 inputs");
    }
    assert!(conv.rounds_input_to_f16(&gpu));
    let (x, y) = synthetic_images(12, SIDE, SIDE, 11).expect("synthetic images");
    let rounded = Tensor::from_f32_as_f16(vec![12, SIDE, SIDE, 3], &x, &gpu).unwrap();
    let labels = Tensor::from_u32(vec![12], y.clone(), &gpu).unwrap();
    let (mut batches, mut tensors) = (v1_on(&gpu, 4), v1_on(&gpu, 4));
    for step in 0..2 {
        let from_batch = batches.train_batch(&x, &y).unwrap().0.to_vec_f32().unwrap();
        let from_tensor = tensors.train_tensors(&rounded, &labels).unwrap().0;
        assert_eq!(from_batch, from_tensor.to_vec_f32().unwrap(), "step {step}");
    }
}

#[test]
fn regularization_loss_is_reported_only_for_regularized_models() {
    let mut model = Model::new().seed(3);
    model.add(Flatten::default());
    model.add(Dense::new(3).regularize(0.0, 1e-2, 0.0, 0.0));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-2),
        Metric::CategoricalAccuracy,
    );
    model.finalize(&[2, 2, 1]).unwrap();
    let reg = model.regularization_loss().unwrap().unwrap();
    assert!(
        reg > 0.0,
        "He-initialised weights have a positive L2 penalty"
    );
    assert!(small_model(3).regularization_loss().unwrap().is_none());
}
