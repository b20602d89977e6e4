//! Every file aether reads is a regular file of bounded size, else a typed
//! error naming it: a FIFO, a link to `/dev/zero` or an oversized file as a
//! model file, a data file, `batches.meta.txt` or the pipeline cache neither
//! hangs nor reads without bound. Each case runs on a watchdog thread, so a
//! regression fails the test instead of hanging the suite.
#![cfg(unix)]

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use aether::datasets::cifar10::{RECORD_BYTES, TEST_FILE, TRAIN_FILES, load_cifar10};
use aether::gpu::DevicePreference;
use aether::nn::Dense;
use aether::{AetherError, Device, Model};
use common::{TempDir, ready_model, test_gpu_options};

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// `f`'s result, or a panic when it takes more than 20 s (a hang).
fn within_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(f());
    });
    receive
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// A small trained-free model saved to `path`, to have a valid file around.
fn save_model(path: &Path) {
    let mut model = Model::new().seed(3);
    model.add(Dense::new(3));
    let model = ready_model(model, &Device::Cpu, &[5]);
    model.save(path).unwrap();
}

#[test]
fn a_fifo_or_a_device_as_a_model_file_is_an_error_naming_it() {
    let dir = TempDir::new("model");
    let fifo = dir.0.join("fifo.aether");
    mkfifo(&fifo);
    let zero = dir.0.join("zero.aether");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for (path, kind) in [(fifo, "FIFO"), (zero, "character device")] {
        let shown = path.clone();
        let result = within_deadline("Model::load", move || {
            Model::load(&shown, &Device::Cpu).map(|_| ())
        });
        match result {
            Err(e @ AetherError::Io { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains(&path.display().to_string()) && message.contains(kind),
                    "{message}"
                );
            }
            other => panic!(
                "expected an Io error naming {}, got {other:?}",
                path.display()
            ),
        }
    }
    // load_weights reads through the same helper.
    let valid = dir.0.join("valid.aether");
    save_model(&valid);
    let mut model = Model::load(&valid, &Device::Cpu).unwrap();
    let before = model
        .predict(&[0.3, -0.2, 0.9, 0.1, -0.7], 1, true)
        .unwrap();
    let zero = dir.0.join("zero.aether");
    let err = model.load_weights(&zero).unwrap_err();
    assert!(err.to_string().contains("character device"), "{err}");
    assert_eq!(
        model
            .predict(&[0.3, -0.2, 0.9, 0.1, -0.7], 1, true)
            .unwrap(),
        before
    );
}

#[test]
fn read_regular_refuses_a_file_past_its_bound() {
    let dir = TempDir::new("bound");
    let path = dir.0.join("file");
    std::fs::write(&path, [7u8; 100]).unwrap();
    assert_eq!(aether::io::read_regular(&path, 100).unwrap(), [7u8; 100]);
    let err = aether::io::read_regular(&path, 99).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge, "{err}");
    let err = aether::io::read_regular(&dir.0, 1 << 20).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
}

/// A valid one-record-per-file data set in `dir`.
fn write_dataset(dir: &Path) {
    let mut record = vec![3u8; RECORD_BYTES];
    for (i, byte) in record.iter_mut().enumerate().skip(1) {
        *byte = (i * 31 % 251) as u8;
    }
    for name in TRAIN_FILES.iter().chain([&TEST_FILE]) {
        std::fs::write(dir.join(name), &record).unwrap();
    }
}

fn dataset_error(result: aether::Result<aether::datasets::cifar10::Cifar10>) -> String {
    match result {
        Err(e @ AetherError::Dataset { .. }) => e.to_string(),
        Err(other) => panic!("expected a Dataset error, got {other}"),
        Ok(_) => panic!("expected a Dataset error, the load succeeded"),
    }
}

#[test]
fn a_fifo_or_a_device_as_batches_meta_is_an_error_naming_it() {
    for special in ["fifo", "zero"] {
        let dir = TempDir::new(&format!("meta-{special}"));
        write_dataset(&dir.0);
        let meta = dir.0.join("batches.meta.txt");
        if special == "fifo" {
            mkfifo(&meta);
        } else {
            std::os::unix::fs::symlink("/dev/zero", &meta).unwrap();
        }
        let root = dir.0.clone();
        let message = dataset_error(within_deadline("load_cifar10", move || {
            load_cifar10(&root, None)
        }));
        assert!(
            message.contains("batches.meta.txt") && message.contains("not a regular file"),
            "{message}"
        );
    }
}

#[test]
fn a_fifo_as_a_data_file_or_one_past_the_size_bound_is_an_error_naming_it() {
    let dir = TempDir::new("data");
    write_dataset(&dir.0);
    let first = dir.0.join(TRAIN_FILES[0]);
    std::fs::remove_file(&first).unwrap();
    mkfifo(&first);
    let root = dir.0.clone();
    let message = dataset_error(within_deadline("load_cifar10", move || {
        load_cifar10(&root, None)
    }));
    assert!(
        message.contains(TRAIN_FILES[0]) && message.contains("not a regular file"),
        "{message}"
    );
    // A sparse file of whole records past 4 GiB: refused from its size, before
    // a byte is read or allocated.
    std::fs::remove_file(&first).unwrap();
    let records = (1u64 << 32) / RECORD_BYTES as u64 + 1;
    let file = std::fs::File::create(&first).unwrap();
    file.set_len(records * RECORD_BYTES as u64).unwrap();
    let root = dir.0.clone();
    let message = dataset_error(within_deadline("load_cifar10", move || {
        load_cifar10(&root, None)
    }));
    assert!(
        message.contains(TRAIN_FILES[0]) && message.contains("past the limit"),
        "{message}"
    );
}

#[test]
fn a_fifo_as_the_pipeline_cache_is_ignored_with_a_warning() {
    if common::gpu().is_none() {
        return;
    }
    let dir = TempDir::new("cache");
    let mut options = test_gpu_options();
    options.cache_dir = Some(dir.0.clone());
    let device = Device::with_preference(DevicePreference::Gpu, &options).unwrap();
    let Some(path) = device
        .gpu_context()
        .and_then(|ctx| ctx.pipelines().disk_path().map(Path::to_owned))
    else {
        common::skip("the adapter's backend has no pipeline cache");
        return;
    };
    drop(device);
    let _ = std::fs::remove_file(&path);
    mkfifo(&path);
    let before = aether::diagnostics::warnings().len();
    let device = within_deadline("Device::with_preference", move || {
        Device::with_preference(DevicePreference::Gpu, &options)
    })
    .unwrap();
    let warned = aether::diagnostics::warnings()[before..].iter().any(|w| {
        w.starts_with("[aether] ignoring unreadable pipeline cache") && w.contains("FIFO")
    });
    assert!(warned, "{:?}", aether::diagnostics::warnings());
    let x = aether::Tensor::from_f32(vec![3], vec![-1.0, 0.5, 2.0], &device).unwrap();
    assert_eq!(
        aether::ops::relu(&x).unwrap().to_vec_f32().unwrap(),
        [0.0, 0.5, 2.0]
    );
}
