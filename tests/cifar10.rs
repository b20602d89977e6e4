//! The CIFAR-10 loader on small files written here in the exact binary layout
//! (good files and every bad case), and the example's (`examples/cifar10/`)
//! argument parser and short smoke runs of its `run` on the CPU.

// The example's modules, compiled into this test as they are into the example.
#[allow(dead_code)]
#[path = "../examples/cifar10/args.rs"]
mod args;
mod common;
#[allow(dead_code)]
#[path = "../examples/cifar10/plot.rs"]
mod plot;
#[allow(dead_code)]
#[path = "../examples/cifar10/run.rs"]
mod run;

use std::path::{Path, PathBuf};

use aether::datasets::cifar10::{CLASS_NAMES, RECORD_BYTES, TEST_FILE, TRAIN_FILES, load_cifar10};
use aether::gpu::DevicePreference;
use aether::{AetherError, Device, Model};
use args::Cifar10Args;
use common::TempDir;
use run::{SYNTHETIC_TEST_SEED, run};

/// Deterministic bytes (SplitMix64), so failures reproduce.
struct Bytes(u64);

impl Bytes {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// `count` records in the CIFAR-10 binary layout with labels 0..9.
fn records(count: usize, bytes: &mut Bytes) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * RECORD_BYTES);
    for _ in 0..count {
        out.push((bytes.next() % 10) as u8);
        out.extend((0..3072).map(|_| bytes.next() as u8));
    }
    out
}

/// Writes the five training files with `train` records each and the test file
/// with `test` records; returns each file's bytes.
fn write_dataset(dir: &Path, train: [usize; 5], test: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut bytes = Bytes(seed);
    let mut files = Vec::new();
    for (name, count) in TRAIN_FILES.iter().zip(train) {
        let data = records(count, &mut bytes);
        std::fs::write(dir.join(name), &data).expect("write train file");
        files.push(data);
    }
    let data = records(test, &mut bytes);
    std::fs::write(dir.join(TEST_FILE), &data).expect("write test file");
    files.push(data);
    files
}

/// The expected NHWC values and labels of raw records, straight from the
/// format: value (y, x, c) of record r is byte 1 + c*1024 + y*32 + x, / 255.
fn decode(raw: &[u8]) -> (Vec<f32>, Vec<u32>) {
    let mut x = Vec::new();
    let mut y = Vec::new();
    for record in raw.chunks(3073) {
        y.push(u32::from(record[0]));
        for row in 0..32 {
            for col in 0..32 {
                for c in 0..3 {
                    x.push(f32::from(record[1 + c * 1024 + row * 32 + col]) / 255.0);
                }
            }
        }
    }
    (x, y)
}

/// The path and record of a Dataset error, or a panic naming what came instead.
fn dataset_error(
    result: aether::Result<aether::datasets::cifar10::Cifar10>,
) -> (PathBuf, Option<usize>, String) {
    match result {
        Err(e @ AetherError::Dataset { .. }) => {
            let message = e.to_string();
            let AetherError::Dataset { path, record, .. } = e else {
                unreachable!()
            };
            (path, record, message)
        }
        Err(other) => panic!("expected a Dataset error, got {other}"),
        Ok(_) => panic!("expected a Dataset error, the load succeeded"),
    }
}

#[test]
fn loads_every_file_in_order_as_nhwc_in_unit_range() {
    let dir = TempDir::new("good");
    let files = write_dataset(&dir.0, [2, 3, 1, 1, 2], 3, 11);
    let data = load_cifar10(&dir.0, None).expect("load");
    let (want_x, want_y) = decode(&files[..5].concat());
    assert_eq!(data.train_y, want_y);
    assert_eq!(
        data.train_x, want_x,
        "train images differ from the format's layout"
    );
    let (test_x, test_y) = decode(&files[5]);
    assert_eq!((data.test_x, data.test_y), (test_x, test_y));
    assert_eq!(data.class_names, CLASS_NAMES.map(String::from).to_vec());
    assert!(data.train_x.iter().all(|v| (0.0..=1.0).contains(v)));
    // Both ends of the range occur somewhere in 27 000 random bytes.
    assert!(data.train_x.contains(&0.0) && data.train_x.contains(&1.0));
}

#[test]
fn limit_takes_the_first_training_images_across_files() {
    let dir = TempDir::new("limit");
    let files = write_dataset(&dir.0, [2, 3, 1, 1, 2], 2, 12);
    let data = load_cifar10(&dir.0, Some(4)).expect("load");
    let first_four = [&files[0][..], &files[1][..2 * RECORD_BYTES]].concat();
    let (want_x, want_y) = decode(&first_four);
    assert_eq!(data.train_y, want_y);
    assert_eq!(data.train_x, want_x);
    assert_eq!(data.test_y.len(), 2, "the limit must not cut the test set");
    // A limit past the end loads everything.
    assert_eq!(
        load_cifar10(&dir.0, Some(1000))
            .expect("load")
            .train_y
            .len(),
        9
    );
    let (path, _, _) = dataset_error(load_cifar10(&dir.0, Some(0)));
    assert_eq!(path, dir.0);
}

#[test]
fn finds_the_files_in_the_unpacked_archive_folder() {
    let dir = TempDir::new("nested");
    let inner = dir.0.join("cifar-10-batches-bin");
    std::fs::create_dir_all(&inner).expect("mkdir");
    write_dataset(&inner, [1, 1, 1, 1, 1], 1, 13);
    assert_eq!(load_cifar10(&dir.0, None).expect("load").train_y.len(), 5);
}

#[test]
fn class_names_come_from_the_meta_file_when_present() {
    let dir = TempDir::new("meta");
    write_dataset(&dir.0, [1, 1, 1, 1, 1], 1, 14);
    let names: Vec<String> = (0..10).map(|k| format!("name {k}")).collect();
    std::fs::write(dir.0.join("batches.meta.txt"), names.join("\n") + "\n\n").expect("write");
    assert_eq!(load_cifar10(&dir.0, None).expect("load").class_names, names);

    std::fs::write(dir.0.join("batches.meta.txt"), names[..9].join("\n")).expect("write");
    let (path, record, message) = dataset_error(load_cifar10(&dir.0, None));
    assert!(
        path.ends_with("batches.meta.txt") && record.is_none(),
        "{message}"
    );
    assert!(message.contains("9 class names"), "{message}");
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let dir = TempDir::new("missing");
    write_dataset(&dir.0, [1, 1, 1, 1, 1], 1, 15);
    std::fs::remove_file(dir.0.join("data_batch_3.bin")).expect("remove");
    // Even when the limit would not reach it: every file is checked first.
    let (path, record, message) = dataset_error(load_cifar10(&dir.0, Some(1)));
    assert!(path.ends_with("data_batch_3.bin"), "{message}");
    assert_eq!(record, None);
    assert!(message.contains("data_batch_3.bin"), "{message}");

    let (path, _, _) = dataset_error(load_cifar10(&dir.0.join("nowhere"), None));
    assert!(path.ends_with("data_batch_1.bin"));
}

#[test]
fn a_truncated_file_is_an_error_naming_it_and_the_short_record() {
    let dir = TempDir::new("truncated");
    let files = write_dataset(&dir.0, [3, 3, 1, 1, 1], 1, 16);
    std::fs::write(
        dir.0.join("data_batch_2.bin"),
        &files[1][..2 * RECORD_BYTES + 100],
    )
    .expect("write");
    let (path, record, message) = dataset_error(load_cifar10(&dir.0, None));
    assert!(path.ends_with("data_batch_2.bin"), "{message}");
    assert_eq!(record, Some(2), "{message}");
    assert!(
        message.contains("data_batch_2.bin, record 2") && message.contains("truncated"),
        "{message}"
    );
}

#[test]
fn an_empty_file_is_an_error_naming_it() {
    let dir = TempDir::new("empty");
    write_dataset(&dir.0, [1, 1, 1, 1, 1], 1, 17);
    std::fs::write(dir.0.join(TEST_FILE), b"").expect("write");
    let (path, record, message) = dataset_error(load_cifar10(&dir.0, None));
    assert!(path.ends_with(TEST_FILE) && record.is_none(), "{message}");
    assert!(message.contains("empty"), "{message}");
}

#[test]
fn a_label_outside_0_to_9_is_an_error_naming_file_and_record() {
    let dir = TempDir::new("label");
    let mut files = write_dataset(&dir.0, [1, 1, 1, 1, 1], 3, 18);
    files[5][RECORD_BYTES] = 10;
    std::fs::write(dir.0.join(TEST_FILE), &files[5]).expect("write");
    let (path, record, message) = dataset_error(load_cifar10(&dir.0, None));
    assert!(path.ends_with(TEST_FILE), "{message}");
    assert_eq!(record, Some(1), "{message}");
    assert!(message.contains("label 10"), "{message}");

    // A directory where a file should be is malformed too.
    std::fs::remove_file(dir.0.join(TEST_FILE)).expect("remove");
    std::fs::create_dir(dir.0.join(TEST_FILE)).expect("mkdir");
    let (path, _, message) = dataset_error(load_cifar10(&dir.0, None));
    assert!(
        path.ends_with(TEST_FILE) && message.contains("not a regular file"),
        "{message}"
    );
}

fn parse(args: &[&str]) -> Result<Cifar10Args, String> {
    Cifar10Args::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

#[test]
fn parser_defaults() {
    let args = parse(&[]).expect("parse");
    assert_eq!(args, Cifar10Args::default());
    assert_eq!((args.epochs, args.batch_size, args.lr), (10, 256, 1e-3));
    assert_eq!((args.data, args.device, args.seed), (None, None, 0));
    assert!(!args.augment && !args.help && args.limit.is_none() && args.test_limit.is_none());
    assert!(args.save.is_none() && args.plot.is_none());
}

#[test]
fn parser_reads_every_option() {
    let args = parse(&[
        "--data",
        "/d",
        "--epochs",
        "3",
        "--batch-size=64",
        "--lr",
        "0.01",
        "--device",
        "gpu",
        "--seed",
        "42",
        "--limit",
        "500",
        "--test-limit",
        "100",
        "--save",
        "m.safetensors",
        "--plot=p.png",
        "--augment",
        "--help",
    ])
    .expect("parse");
    let want = Cifar10Args {
        data: Some("/d".into()),
        epochs: 3,
        batch_size: 64,
        lr: 0.01,
        device: Some(DevicePreference::Gpu),
        seed: 42,
        limit: Some(500),
        test_limit: Some(100),
        save: Some("m.safetensors".into()),
        plot: Some("p.png".into()),
        augment: true,
        model: args::ZooModel::V1,
        help: true,
    };
    assert_eq!(args, want);
    assert_eq!(
        parse(&["--device", "CPU"]).expect("parse").device,
        Some(DevicePreference::Cpu)
    );
    assert_eq!(
        parse(&["--device=auto"]).expect("parse").device,
        Some(DevicePreference::Auto)
    );
    assert!(parse(&["-h"]).expect("parse").help);
    assert_eq!(
        parse(&["--model", "resnet18"]).expect("parse").model,
        args::ZooModel::Resnet18
    );
    assert_eq!(
        parse(&["--epochs", "2", "--epochs", "5"])
            .expect("parse")
            .epochs,
        5
    );
}

#[test]
fn parser_rejects_unknown_options_and_bad_values_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--epoch", "3"], "unknown option \"--epoch\""),
        (&["-x"], "unknown option"),
        (&["stray"], "unexpected argument \"stray\""),
        (&["--epochs", "abc"], "--epochs: expected a whole number"),
        (
            &["--epochs", "0"],
            "--epochs: expected a whole number of at least 1",
        ),
        (&["--batch-size", "-5"], "--batch-size"),
        (&["--limit", "1.5"], "--limit"),
        (&["--seed", "-1"], "--seed"),
        (&["--lr", "0"], "--lr: expected a positive number"),
        (&["--lr", "nan"], "--lr"),
        (&["--lr", "fast"], "--lr"),
        (&["--device", "tpu"], "--device: expected cpu, gpu or auto"),
        (&["--model", "vgg"], "--model: expected v1 or resnet18"),
        (&["--epochs"], "--epochs needs a value"),
        (&["--data", "--epochs", "3"], "--data needs a value"),
        (&["--save="], "--save: expected a path"),
        (&["--augment=yes"], "--augment takes no value"),
    ];
    for (args, expected) in cases {
        match parse(args) {
            Err(message) => assert!(
                message.contains(expected),
                "{args:?}: message {message:?} lacks {expected:?}"
            ),
            Ok(parsed) => panic!("{args:?} parsed as {parsed:?}"),
        }
    }
}

fn smoke_args() -> Cifar10Args {
    Cifar10Args {
        epochs: 1,
        batch_size: 50,
        device: Some(DevicePreference::Cpu),
        limit: Some(200),
        test_limit: Some(100),
        ..Cifar10Args::default()
    }
}

/// A batch size past the number of images trains them as one batch, without
/// reserving room for the batch size's worth (2^40 images would be 12 PiB).
#[test]
fn run_takes_a_batch_size_larger_than_the_data() {
    let args = Cifar10Args {
        batch_size: 1 << 40,
        limit: Some(20),
        test_limit: Some(10),
        ..smoke_args()
    };
    let summary = run(&args).expect("one batch of 20 images");
    assert_eq!(summary.epochs.len(), 1);
}

#[test]
fn run_refuses_arguments_that_parse_would_refuse() {
    let bad = [
        (
            Cifar10Args {
                batch_size: 0,
                ..smoke_args()
            },
            "batch_size is 0",
        ),
        (
            Cifar10Args {
                epochs: 0,
                ..smoke_args()
            },
            "epochs is 0",
        ),
        (
            Cifar10Args {
                limit: Some(0),
                ..smoke_args()
            },
            "limit is 0",
        ),
        (
            Cifar10Args {
                lr: f32::NAN,
                ..smoke_args()
            },
            "lr = NaN",
        ),
    ];
    for (args, needle) in bad {
        let err = run(&args).expect_err(needle).to_string();
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn smoke_run_on_the_synthetic_default_saves_and_plots() {
    let dir = TempDir::new("smoke");
    let args = Cifar10Args {
        save: Some(dir.0.join("model.safetensors")),
        plot: Some(dir.0.join("curves.png")),
        ..smoke_args()
    };
    let summary = run(&args).expect("run");
    assert!(!summary.real_cifar10);
    assert_eq!(
        (
            summary.device.as_str(),
            summary.train_images,
            summary.test_images
        ),
        ("cpu", 200, 100)
    );
    assert_eq!(summary.epochs.len(), 1);
    let epoch = &summary.epochs[0];
    assert!(
        epoch.train_loss.is_finite() && epoch.train_loss > 0.0,
        "{epoch:?}"
    );
    assert!(
        epoch.ms_per_step > 0.0 && epoch.images_per_second > 0.0,
        "{epoch:?}"
    );
    assert!((0.0..=1.0).contains(&epoch.train_accuracy), "{epoch:?}");
    assert_eq!(summary.test_accuracy, epoch.test_accuracy);
    // Test accuracy is a count out of 100 images.
    let hundredths = summary.test_accuracy * 100.0;
    assert!(
        (hundredths - hundredths.round()).abs() < 1e-3,
        "{}",
        summary.test_accuracy
    );

    let png = std::fs::read(dir.0.join("curves.png")).expect("plot written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    let mut model = Model::load(dir.0.join("model.safetensors"), &Device::Cpu).expect("load model");
    let (x, y) =
        aether::data::synthetic_images(100, 32, 32, SYNTHETIC_TEST_SEED).expect("synthetic images");
    let (_, accuracy) = model.evaluate(&x, &y, 50).expect("evaluate");
    assert_eq!(
        accuracy, summary.test_accuracy,
        "the saved model is not the trained one"
    );
}

#[test]
fn smoke_run_on_files_in_the_cifar_layout_with_augmentation() {
    let dir = TempDir::new("smoke-files");
    write_dataset(&dir.0, [40, 40, 40, 40, 40], 60, 20);
    let args = Cifar10Args {
        data: Some(dir.0.clone()),
        augment: true,
        test_limit: None,
        ..smoke_args()
    };
    let summary = run(&args).expect("run");
    assert!(summary.real_cifar10);
    assert_eq!((summary.train_images, summary.test_images), (200, 60));
    assert!(summary.epochs[0].train_loss.is_finite());
    let sixtieths = summary.test_accuracy * 60.0;
    assert!(
        (sixtieths - sixtieths.round()).abs() < 1e-3,
        "{}",
        summary.test_accuracy
    );

    let bad = Cifar10Args {
        data: Some(dir.0.join("absent")),
        ..smoke_args()
    };
    assert!(matches!(run(&bad), Err(AetherError::Dataset { .. })));
}

/// Issue 37 (minor): the cifar10 example reports a `--save` or `--plot` path
/// it cannot write before it trains, not after.
#[test]
fn the_cifar10_run_refuses_an_unwritable_save_or_plot_path_before_training() {
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
