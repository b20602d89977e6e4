//! The example's command line: [`Cifar10Args::parse`] and `--help`'s text.

use std::path::PathBuf;

use aether::gpu::DevicePreference;
use aether::{AetherError, Result};

/// The options of the example.
#[derive(Clone, Debug, PartialEq)]
pub struct Cifar10Args {
    /// `--data DIR`; without it [`Cifar10Args::data_dir`] falls back to `AETHER_CIFAR10`.
    pub data: Option<PathBuf>,
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f32,
    /// `--device`; `None` lets [`Device::best`] read `AETHER_DEVICE` (default auto).
    pub device: Option<DevicePreference>,
    pub seed: u64,
    /// Use the first N training images.
    pub limit: Option<usize>,
    /// Evaluate on the first N test images.
    pub test_limit: Option<usize>,
    pub save: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub augment: bool,
    /// `--model`: which zoo network trains.
    pub model: ZooModel,
    pub help: bool,
}

/// The networks `--model` chooses from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZooModel {
    /// `aether::zoo::cifar10_v1`, the default.
    V1,
    /// `aether::zoo::resnet18_cifar`, a graph with residual adds.
    Resnet18,
}

impl Default for Cifar10Args {
    fn default() -> Self {
        Self {
            data: None,
            epochs: 10,
            batch_size: 256,
            lr: 1e-3,
            device: None,
            seed: 0,
            limit: None,
            test_limit: None,
            save: None,
            plot: None,
            augment: false,
            model: ZooModel::V1,
            help: false,
        }
    }
}

/// The `--help` text of the example.
pub const USAGE: &str = "\
Train a reference CNN (aether::zoo::cifar10_v1, or resnet18_cifar) on CIFAR-10, or on
an embedded synthetic stand-in when no data directory is given.

usage: cargo run --release --example cifar10 -- [options]

options:
  --data DIR         CIFAR-10 binary version: data_batch_1.bin .. data_batch_5.bin and
                     test_batch.bin (batches.meta.txt optional) in DIR or
                     DIR/cifar-10-batches-bin. Default: $AETHER_CIFAR10; without either,
                     a synthetic 10-class set made in code (NOT CIFAR-10)
  --model M          v1 (default: zoo::cifar10_v1) or resnet18 (zoo::resnet18_cifar)
  --epochs N         training epochs (default 10)
  --batch-size N     images per step (default 256)
  --lr F             AdamW learning rate (default 0.001)
  --device D         cpu, gpu or auto (default: $AETHER_DEVICE, else auto)
  --seed N           seed of weights, dropout, shuffling and augmentation (default 0)
  --limit N          train on the first N training images only
  --test-limit N     evaluate on the first N test images only
  --save PATH        write the trained model (safetensors) to PATH
  --plot PATH        write a PNG of loss and accuracy per epoch to PATH
  --augment          random crop with 4-pixel zero padding and horizontal flip; done on
                     the model's device (the GPU when training there)
  -h, --help         show this text

Images are scaled to [0, 1] without per-channel standardisation. The last line
printed is `test accuracy: 0.XXXX`.";

impl Cifar10Args {
    /// Parses the arguments after the program name. `--name value` and
    /// `--name=value` both work; a later option overrides an earlier one. The
    /// error is a message for the user (the example prints it and exits with 2).
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut parsed = Self::default();
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) if name.starts_with("--") => (name, Some(value)),
                _ => (arg.as_str(), None),
            };
            if matches!(name, "--augment" | "--help" | "-h") {
                if inline.is_some() {
                    return Err(format!("{name} takes no value"));
                }
                match name {
                    "--augment" => parsed.augment = true,
                    _ => parsed.help = true,
                }
                continue;
            }
            if !name.starts_with('-') {
                return Err(format!("unexpected argument {arg:?}"));
            }
            if !OPTIONS_WITH_VALUE.contains(&name) {
                return Err(format!("unknown option {name:?}"));
            }
            let value = match inline {
                Some(v) => v,
                None => rest
                    .next()
                    .map(String::as_str)
                    .filter(|v| !v.starts_with("--"))
                    .ok_or_else(|| format!("{name} needs a value"))?,
            };
            match name {
                "--data" => parsed.data = Some(path_value(name, value)?),
                "--epochs" => parsed.epochs = count_value(name, value)?,
                "--batch-size" => parsed.batch_size = count_value(name, value)?,
                "--lr" => parsed.lr = rate_value(name, value)?,
                "--device" => parsed.device = Some(device_value(value)?),
                "--seed" => {
                    parsed.seed = value.parse().map_err(|_| {
                        format!("--seed: expected a whole number 0 or more, got {value:?}")
                    })?
                }
                "--limit" => parsed.limit = Some(count_value(name, value)?),
                "--test-limit" => parsed.test_limit = Some(count_value(name, value)?),
                "--save" => parsed.save = Some(path_value(name, value)?),
                "--model" => {
                    parsed.model = match value {
                        "v1" => ZooModel::V1,
                        "resnet18" => ZooModel::Resnet18,
                        other => {
                            return Err(format!("--model: expected v1 or resnet18, got {other:?}"));
                        }
                    }
                }
                _ => parsed.plot = Some(path_value(name, value)?),
            }
        }
        Ok(parsed)
    }

    /// `--data`, else a non-empty `AETHER_CIFAR10`, else `None` (synthetic data).
    pub fn data_dir(&self) -> Option<PathBuf> {
        self.data.clone().or_else(|| {
            std::env::var_os("AETHER_CIFAR10")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    }
}

const OPTIONS_WITH_VALUE: [&str; 11] = [
    "--data",
    "--model",
    "--epochs",
    "--batch-size",
    "--lr",
    "--device",
    "--seed",
    "--limit",
    "--test-limit",
    "--save",
    "--plot",
];

/// The checks `parse` makes, for arguments built in code: counts of at
/// least 1 and a positive, finite learning rate.
pub fn check_args(args: &Cifar10Args) -> Result<()> {
    let counts = [
        ("epochs", Some(args.epochs)),
        ("batch_size", Some(args.batch_size)),
        ("limit", args.limit),
        ("test_limit", args.test_limit),
    ];
    if let Some((name, _)) = counts.iter().find(|(_, count)| *count == Some(0)) {
        return Err(AetherError::Model(format!(
            "Cifar10Args {name} is 0: it must be at least 1"
        )));
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        return Err(AetherError::InvalidHyperparameter {
            name: "Cifar10Args lr",
            value: args.lr,
            expected: "finite and > 0",
        });
    }
    // A bad --save or --plot path is reported now, not after training.
    for path in args.save.iter().chain(&args.plot) {
        aether::io::check_writable(path)?;
    }
    Ok(())
}

fn count_value(name: &str, value: &str) -> Result<usize, String> {
    value
        .parse::<usize>()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| format!("{name}: expected a whole number of at least 1, got {value:?}"))
}

fn rate_value(name: &str, value: &str) -> Result<f32, String> {
    value
        .parse::<f32>()
        .ok()
        .filter(|r| r.is_finite() && *r > 0.0)
        .ok_or_else(|| format!("{name}: expected a positive number such as 0.001, got {value:?}"))
}

fn path_value(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("{name}: expected a path, got an empty value"));
    }
    Ok(PathBuf::from(value))
}

fn device_value(value: &str) -> Result<DevicePreference, String> {
    match value.to_ascii_lowercase().as_str() {
        "cpu" => Ok(DevicePreference::Cpu),
        "gpu" => Ok(DevicePreference::Gpu),
        "auto" => Ok(DevicePreference::Auto),
        _ => Err(format!(
            "--device: expected cpu, gpu or auto, got {value:?}"
        )),
    }
}
