//! GPU faults come out of `train` / `predict` as typed errors, never a panic or
//! a hang: an allocation the device refuses (a real wgpu error, caught in an
//! error scope) and a device lost in the middle of training, after which the
//! last checkpoint still loads and predicts as before. Each test opens its own
//! context, since it breaks it.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use aether::gpu::{DevicePreference, GpuOptions};
use aether::nn::{Dense, Flatten, ReLU};
use aether::{AetherError, Checkpoint, Device, Model, Tensor, TrainOptions};
use common::{Rng, report, test_gpu_options};

const INPUT: [usize; 3] = [16, 16, 4];

/// A fresh GPU device with `options` on top of the test defaults, or `None`
/// (after the harness's skip line) without an adapter.
fn own_gpu(options: impl FnOnce(&mut GpuOptions)) -> Option<Device> {
    common::gpu()?;
    let mut opts = test_gpu_options();
    options(&mut opts);
    Some(Device::with_preference(DevicePreference::Gpu, &opts).unwrap())
}

fn model(device: &Device) -> Model {
    let mut model = Model::new().seed(3);
    model
        .add(Flatten::default())
        .add(Dense::new(32))
        .add(ReLU::default())
        .add(Dense::new(10));
    common::ready_model(model, device, &INPUT)
}

/// Runs `work` on another thread and fails the test if it takes longer than a
/// minute: a fault must end in an error, not a wait that never ends.
fn without_hang<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(work());
    });
    receive
        .recv_timeout(Duration::from_secs(60))
        .expect("the call hung (or panicked) instead of returning an error")
}

#[test]
fn refused_allocation_is_a_typed_error_and_the_device_goes_on() {
    const LIMIT: u64 = 1 << 20;
    let Some(device) = own_gpu(|o| o.fail_allocations_over = Some(LIMIT)) else {
        return;
    };
    let per: usize = INPUT.iter().product();
    let mut model = model(&device);
    // 32 samples of 4 KiB: the 128 KiB batch fits.
    let x = Rng::fresh().vec(32 * per);
    let small = model.predict(&x, 32, true).unwrap();
    // 512 samples at once: the 2 MiB input tensor is refused by the device.
    let big = Rng::fresh().vec(512 * per);
    match model.predict(&big, 512, true) {
        Err(AetherError::Allocation {
            what,
            bytes,
            message,
        }) => {
            assert_eq!(bytes, 512 * per as u64 * 4);
            assert!(what.contains("[512, 16, 16, 4]"), "{what}");
            report(&format!(
                "[aether-test] refused allocation: {what}, {bytes} bytes: {message}"
            ));
        }
        other => panic!("expected an Allocation error, got {other:?}"),
    }
    let y: Vec<u32> = (0..512).map(|i| i % 10).collect();
    let options = TrainOptions {
        batch_size: 512,
        progress: false,
        ..TrainOptions::default()
    };
    assert!(matches!(
        model.train(&big, &y, &options),
        Err(AetherError::Allocation { .. })
    ));
    // The refused buffer never reaches the pool: the same calls at a size that
    // fits still give the same answers.
    assert_eq!(model.predict(&x, 32, true).unwrap(), small);
    let t = Tensor::from_f32(vec![4], vec![1.0, 2.0, 3.0, 4.0], &device).unwrap();
    assert_eq!(t.to_vec_f32().unwrap(), [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn device_lost_during_training_is_a_typed_error_and_the_checkpoint_survives() {
    let Some(device) = own_gpu(|_| ()) else {
        return;
    };
    let per: usize = INPUT.iter().product();
    let mut rng = Rng::fresh();
    let x = rng.vec(64 * per);
    let y: Vec<u32> = (0..64).map(|i| i % 10).collect();
    let probes = rng.vec(4 * per);
    let dir = std::env::temp_dir().join(format!(
        "aether-device-lost-{}-{}",
        std::process::id(),
        rng.next_u64()
    ));
    let path = dir.join("ckpt.aether");
    let mut model = model(&device);
    let options = TrainOptions {
        epochs: 1,
        batch_size: 16,
        progress: false,
        checkpoint: Some(Checkpoint {
            path: path.clone(),
            every_epochs: 1,
        }),
        ..TrainOptions::default()
    };
    model.train(&x, &y, &options).unwrap();
    let saved = Model::load(&path, &Device::Cpu)
        .unwrap()
        .predict(&probes, 4, false)
        .unwrap();

    device.gpu_context().unwrap().device().destroy();
    let (model, train) = without_hang(move || {
        let result = model.train(&x, &y, &options);
        (model, result)
    });
    match train {
        Err(AetherError::DeviceLost { during, reason }) => {
            report(&format!(
                "[aether-test] train after device loss: lost during {during}: {reason}"
            ));
        }
        other => panic!("expected DeviceLost from train, got {other:?}"),
    }
    let probe_copy = probes.clone();
    let (_, predict) = without_hang(move || {
        let mut model = model;
        let result = model.predict(&probe_copy, 4, false);
        (model, result)
    });
    assert!(
        matches!(predict, Err(AetherError::DeviceLost { .. })),
        "expected DeviceLost from predict, got {predict:?}"
    );
    assert!(device.gpu_context().unwrap().is_lost());
    let mut restored = Model::load(&path, &Device::Cpu).unwrap();
    assert_eq!(restored.predict(&probes, 4, false).unwrap(), saved);
    std::fs::remove_dir_all(&dir).unwrap();
}
