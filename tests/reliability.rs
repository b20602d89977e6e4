//! Issue 37's hostile-user cases: each a typed error before anything moves,
//! never a model that builds and cannot run, a failed call that changes the
//! model, or an allocation a crafted file controls.

mod common;

use std::path::{Path, PathBuf};

use aether::conv::Padding;
use aether::model::{Loss, Metric};
use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, MaxPool2d, ReLU};
use aether::optim::Adam;
use aether::{AetherError, Device, Model, TrainOptions};
use common::{gpu, ready_model};

/// A fresh folder under the temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("aether-reliability-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
fn state_bits(model: &Model, dir: &Path) -> Vec<u8> {
    let path = dir.join("state.aether");
    model.save(&path).unwrap();
    std::fs::read(path).unwrap()
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
        assert_eq!(state_bits(&model, &dir.0), before, "{}", device.name());

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
        assert_eq!(state_bits(&model, &dir.0), before, "{}", device.name());
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

/// Issue 37 (minor): the cifar10 example reports a `--save` or `--plot` path
/// it cannot write before it trains, not after.
#[test]
fn the_cifar10_run_refuses_an_unwritable_save_or_plot_path_before_training() {
    use aether::datasets::cifar10::{Cifar10Args, run};
    let dir = TempDir::new("cifar10-paths");
    let blocker = dir.0.join("a-file");
    std::fs::write(&blocker, b"not a directory").unwrap();
    // Many epochs on the whole synthetic set: minutes, were they trained.
    let args = Cifar10Args {
        epochs: 1000,
        device: Some(aether::gpu::DevicePreference::Cpu),
        ..Cifar10Args::default()
    };
    for args in [
        Cifar10Args {
            save: Some(dir.0.clone()),
            ..args.clone()
        },
        Cifar10Args {
            plot: Some(blocker.join("curves.png")),
            ..args.clone()
        },
    ] {
        let start = std::time::Instant::now();
        let err = run(&args).map(|_| ()).unwrap_err();
        assert!(matches!(err, AetherError::Io { .. }), "{err}");
        assert!(start.elapsed().as_secs() < 5, "refused before training");
    }
    // The writability probe leaves nothing behind.
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["a-file"]);
}
