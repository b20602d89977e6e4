//! CIFAR-10: the loader of the binary version, and everything
//! `examples/cifar10.rs` does (argument parsing in [`Cifar10Args::parse`], the
//! whole run in [`run`]), kept here so that tests reach it; the example's
//! `main` is a thin wrapper.
//!
//! Images come out NHWC f32 in [0, 1] (byte / 255) with no per-channel
//! standardisation: the reference model has BatchNorm after every convolution,
//! which absorbs the input's offset and scale, and in [0, 1] the zero padding of
//! `--augment` and of 'same' convolutions is plain black.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;

use crate::conv::ConvVariant;
use crate::device::Device;
use crate::error::{AetherError, Result, check_hyperparameter};
use crate::gpu::{DevicePreference, GpuOptions};
use crate::model::{Loss, Metric, PendingLosses};
use crate::ops::augment::random_crop_flip;
use crate::optim::Adam;
use crate::tensor::Tensor;

/// Height and width of a CIFAR-10 image.
pub const IMAGE_SIDE: usize = 32;
/// Values of one image: 32 x 32 pixels x 3 channels.
pub const IMAGE_VALUES: usize = IMAGE_SIDE * IMAGE_SIDE * 3;
/// One record of the binary version: a label byte, then 1024 red, 1024 green
/// and 1024 blue bytes, each plane row-major.
pub const RECORD_BYTES: usize = 1 + IMAGE_VALUES;
/// The training files, in the order their images are used.
pub const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
pub const TEST_FILE: &str = "test_batch.bin";
/// Optional: one class name a line.
pub const META_FILE: &str = "batches.meta.txt";
/// The folder the binary version unpacks to; `load_cifar10` also looks inside it.
pub const ARCHIVE_DIR: &str = "cifar-10-batches-bin";
/// The class names used when there is no `batches.meta.txt`.
pub const CLASS_NAMES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// A loaded CIFAR-10: NHWC f32 images in [0, 1] (`IMAGE_VALUES` each) and labels 0..9.
#[derive(Clone, Debug)]
pub struct Cifar10 {
    pub train_x: Vec<f32>,
    pub train_y: Vec<u32>,
    pub test_x: Vec<f32>,
    pub test_y: Vec<u32>,
    pub class_names: Vec<String>,
}

fn dataset_err(path: &Path, record: Option<usize>, reason: impl Into<String>) -> AetherError {
    AetherError::Dataset {
        path: path.to_owned(),
        record,
        reason: reason.into(),
    }
}

/// Loads the binary version from `dir` (or from `dir/cifar-10-batches-bin`):
/// the training images of `data_batch_1.bin`..`data_batch_5.bin` in order, at
/// most `limit` of them, and all of `test_batch.bin`. Every file is checked
/// (present, non-empty, whole records) before any is read; training files past
/// the limit are not read. Any problem is an [`AetherError::Dataset`] naming
/// the file and, where one is at fault, the record (counting from 0).
pub fn load_cifar10(dir: &Path, limit: Option<usize>) -> Result<Cifar10> {
    let dir = locate(dir);
    if limit == Some(0) {
        return Err(dataset_err(
            &dir,
            None,
            "a limit of 0 training images loads nothing",
        ));
    }
    let train_paths: Vec<PathBuf> = TRAIN_FILES.iter().map(|f| dir.join(f)).collect();
    let test_path = dir.join(TEST_FILE);
    let mut counts = Vec::with_capacity(TRAIN_FILES.len());
    for path in &train_paths {
        counts.push(record_count(path)?);
    }
    let test_count = record_count(&test_path)?;
    let class_names = read_class_names(&dir.join(META_FILE))?;

    let mut wanted = limit.unwrap_or(usize::MAX);
    let takes: Vec<usize> = counts
        .iter()
        .map(|&count| {
            let take = count.min(wanted);
            wanted -= take;
            take
        })
        .collect();
    // Sized once: the images take 4 bytes per pixel byte read, and nothing
    // else grows with the files (see `read_records`).
    let train_total: usize = takes.iter().sum();
    let mut train_x = Vec::with_capacity(train_total * IMAGE_VALUES);
    let mut train_y = Vec::with_capacity(train_total);
    for (path, take) in train_paths.iter().zip(takes) {
        if take > 0 {
            read_records(path, take, &mut train_x, &mut train_y)?;
        }
    }
    let mut test_x = Vec::with_capacity(test_count * IMAGE_VALUES);
    let mut test_y = Vec::with_capacity(test_count);
    read_records(&test_path, test_count, &mut test_x, &mut test_y)?;
    Ok(Cifar10 {
        train_x,
        train_y,
        test_x,
        test_y,
        class_names,
    })
}

/// `dir`, or its `cifar-10-batches-bin` subfolder when the files are there.
fn locate(dir: &Path) -> PathBuf {
    let nested = dir.join(ARCHIVE_DIR);
    if !dir.join(TRAIN_FILES[0]).exists() && nested.join(TRAIN_FILES[0]).is_file() {
        nested
    } else {
        dir.to_owned()
    }
}

/// The number of records in `path`, from its size.
fn record_count(path: &Path) -> Result<usize> {
    let meta = std::fs::metadata(path).map_err(|e| {
        dataset_err(
            path,
            None,
            format!(
                "cannot open ({e}); expected the CIFAR-10 binary version ({} and {TEST_FILE})",
                TRAIN_FILES.join(", ")
            ),
        )
    })?;
    if !meta.is_file() {
        return Err(dataset_err(path, None, "not a regular file"));
    }
    if meta.len() > MAX_DATA_FILE_BYTES {
        return Err(dataset_err(
            path,
            None,
            format!(
                "{} bytes, past the limit of {MAX_DATA_FILE_BYTES} bytes for one data file",
                meta.len()
            ),
        ));
    }
    let bytes = usize::try_from(meta.len())
        .map_err(|_| dataset_err(path, None, "too large for this machine"))?;
    check_length(path, bytes)
}

/// Records in a file of `bytes` bytes, or why the length is not one of the format's.
fn check_length(path: &Path, bytes: usize) -> Result<usize> {
    if bytes == 0 {
        return Err(dataset_err(path, None, "empty file: no records"));
    }
    let whole = bytes / RECORD_BYTES;
    let rest = bytes % RECORD_BYTES;
    if rest != 0 {
        return Err(dataset_err(
            path,
            Some(whole),
            format!(
                "truncated: the file has {bytes} bytes, not a whole number of {RECORD_BYTES}-byte \
                 records (label + 3072 pixels); this record has only {rest} bytes"
            ),
        ));
    }
    Ok(whole)
}

/// Records read and decoded at a time: a 3 MB buffer, whatever the file's size.
const RECORDS_PER_READ: usize = 1024;

/// The most bytes of one data file: 2^32, 1.4 million records, whose images
/// take 16 GiB as f32.
const MAX_DATA_FILE_BYTES: u64 = 1 << 32;

/// Appends the first `count` records of `path` to `images` (NHWC, in [0, 1])
/// and `labels`, reading [`RECORDS_PER_READ`] records at a time: memory grows
/// by the f32 images alone (4 bytes per pixel byte), never by a copy of the
/// file.
fn read_records(
    path: &Path,
    count: usize,
    images: &mut Vec<f32>,
    labels: &mut Vec<u32>,
) -> Result<()> {
    let (mut file, _) = crate::io::open_regular(path, MAX_DATA_FILE_BYTES)
        .map_err(|e| dataset_err(path, None, format!("cannot read ({e})")))?;
    let mut buffer = vec![0u8; RECORDS_PER_READ * RECORD_BYTES];
    let mut done = 0;
    while done < count {
        let records = (count - done).min(RECORDS_PER_READ);
        let chunk = &mut buffer[..records * RECORD_BYTES];
        let mut filled = 0;
        while filled < chunk.len() {
            match file.read(&mut chunk[filled..]) {
                Ok(0) => {
                    // The file shrank since its size was checked.
                    return Err(dataset_err(
                        path,
                        Some(done + filled / RECORD_BYTES),
                        "the file ended early while it was read",
                    ));
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(dataset_err(path, None, format!("cannot read ({e})"))),
            }
        }
        decode_into(path, chunk, done, images, labels)?;
        done += records;
    }
    Ok(())
}

/// Every record of one batch file's contents `bytes` (read from `path`, which
/// only names the file in errors), as NHWC images in [0, 1] and labels. The
/// same checks as [`load_cifar10`]: whole records, at least one, labels 0..9.
pub fn decode_batch(path: &Path, bytes: &[u8]) -> Result<(Vec<f32>, Vec<u32>)> {
    let count = check_length(path, bytes.len())?;
    let mut images = Vec::with_capacity(count * IMAGE_VALUES);
    let mut labels = Vec::with_capacity(count);
    decode_into(path, bytes, 0, &mut images, &mut labels)?;
    Ok((images, labels))
}

/// Appends the whole records `bytes`, the first of which is record `first`
/// of `path` (named in errors), to `images` and `labels`; a bad label is an
/// error and appends nothing.
fn decode_into(
    path: &Path,
    bytes: &[u8],
    first: usize,
    images: &mut Vec<f32>,
    labels: &mut Vec<u32>,
) -> Result<()> {
    let count = bytes.len() / RECORD_BYTES;
    if let Some(record) = bytes.chunks_exact(RECORD_BYTES).position(|r| r[0] > 9) {
        return Err(dataset_err(
            path,
            Some(first + record),
            format!("label {} is outside 0..9", bytes[record * RECORD_BYTES]),
        ));
    }
    labels.extend(bytes.chunks_exact(RECORD_BYTES).map(|r| u32::from(r[0])));
    let plane = IMAGE_SIDE * IMAGE_SIDE;
    let start = images.len();
    images.resize(start + count * IMAGE_VALUES, 0.0);
    images[start..]
        .par_chunks_exact_mut(IMAGE_VALUES)
        .zip(bytes.par_chunks_exact(RECORD_BYTES))
        .for_each(|(image, record)| {
            let planes = &record[1..];
            for (pixel, rgb) in image.chunks_exact_mut(3).enumerate() {
                for (c, value) in rgb.iter_mut().enumerate() {
                    *value = f32::from(planes[c * plane + pixel]) / 255.0;
                }
            }
        });
    Ok(())
}

/// The most bytes of `batches.meta.txt`, ten short names.
const MAX_META_BYTES: u64 = 64 << 10;

/// The ten names of `batches.meta.txt`, or the standard names when the file
/// is absent.
fn read_class_names(path: &Path) -> Result<Vec<String>> {
    match crate::io::read_regular(path, MAX_META_BYTES) {
        Ok(bytes) => parse_class_names(path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(CLASS_NAMES.iter().map(|s| s.to_string()).collect())
        }
        Err(e) => Err(dataset_err(path, None, format!("cannot read ({e})"))),
    }
}

/// The class names in the contents `bytes` of `batches.meta.txt` (read from
/// `path`, named in errors): UTF-8, one a line, blank lines ignored, exactly ten.
pub fn parse_class_names(path: &Path, bytes: &[u8]) -> Result<Vec<String>> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| dataset_err(path, None, "class names are not UTF-8 text"))?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if names.len() != CLASS_NAMES.len() {
        return Err(dataset_err(
            path,
            None,
            format!("{} class names, expected 10 (one a line)", names.len()),
        ));
    }
    Ok(names)
}

/// The options of `examples/cifar10.rs`.
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
    pub help: bool,
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
            help: false,
        }
    }
}

/// The `--help` text of the example.
pub const USAGE: &str = "\
Train the reference CNN (aether::zoo::cifar10_v1) on CIFAR-10, or on an embedded
synthetic stand-in when no data directory is given.

usage: cargo run --release --example cifar10 -- [options]

options:
  --data DIR         CIFAR-10 binary version: data_batch_1.bin .. data_batch_5.bin and
                     test_batch.bin (batches.meta.txt optional) in DIR or
                     DIR/cifar-10-batches-bin. Default: $AETHER_CIFAR10; without either,
                     a synthetic 10-class set made in code (NOT CIFAR-10)
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

const OPTIONS_WITH_VALUE: [&str; 10] = [
    "--data",
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
fn check_args(args: &Cifar10Args) -> Result<()> {
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
    let valid = args.lr.is_finite() && args.lr > 0.0;
    check_hyperparameter("Cifar10Args lr", args.lr, valid, "finite and > 0")?;
    // A bad --save or --plot path is reported now, not after training.
    for path in args.save.iter().chain(&args.plot) {
        crate::io::check_writable(path)?;
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

/// What one epoch of [`run`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    /// Counting from 1.
    pub epoch: usize,
    /// Mean loss of the epoch's steps (label-smoothed, with dropout).
    pub train_loss: f32,
    pub train_accuracy: f32,
    pub test_loss: f32,
    pub test_accuracy: f32,
    /// Training time of the epoch, test evaluation excluded.
    pub train_seconds: f64,
    pub ms_per_step: f64,
    pub images_per_second: f64,
}

/// What [`run`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    /// False when it trained on the synthetic stand-in.
    pub real_cifar10: bool,
    /// [`Device::name`] of the device it trained on.
    pub device: String,
    pub train_images: usize,
    pub test_images: usize,
    pub epochs: Vec<EpochReport>,
    /// The test accuracy after the last epoch.
    pub test_accuracy: f32,
}

/// Size of the synthetic stand-in (`data::synthetic_images` at 32 x 32), whose
/// fixed seeds give every run the same data; `--limit N` takes a prefix.
pub const SYNTHETIC_TRAIN: usize = 10_000;
pub const SYNTHETIC_TEST: usize = 2_000;
pub const SYNTHETIC_TRAIN_SEED: u64 = 0xc1fa_0001;
pub const SYNTHETIC_TEST_SEED: u64 = 0xc1fa_0002;
/// Steps between loss read-backs (progress message and divergence check).
const LOG_EVERY: usize = 20;
/// Padding of the random crop of `--augment`.
const AUGMENT_PAD: usize = 4;

/// Everything the example does: picks the device, loads CIFAR-10 (or makes the
/// synthetic stand-in), trains `zoo::cifar10_v1` with a progress bar and one
/// line per epoch, evaluates on the test set after every epoch, optionally
/// saves and plots, and prints `test accuracy: 0.XXXX` as its last line.
pub fn run(args: &Cifar10Args) -> Result<RunSummary> {
    check_args(args)?;
    let device = match args.device {
        None => Device::best()?,
        Some(preference) => Device::with_preference(preference, &GpuOptions::from_env()?)?,
    };
    print_device(&device);

    let (data, real) = match args.data_dir() {
        Some(dir) => {
            let data = load_cifar10(&dir, args.limit)?;
            println!(
                "data: CIFAR-10 from {} ({} train / {} test images)",
                dir.display(),
                data.train_y.len(),
                data.test_y.len()
            );
            (data, true)
        }
        None => (synthetic(args.limit)?, false),
    };
    let (test_x, test_y) = match args.test_limit {
        Some(n) if n < data.test_y.len() => (&data.test_x[..n * IMAGE_VALUES], &data.test_y[..n]),
        _ => (&data.test_x[..], &data.test_y[..]),
    };
    if let Some(limit) = args.limit
        && limit > data.train_y.len()
    {
        println!(
            "note: --limit {limit} is more than the {} training images available",
            data.train_y.len()
        );
    }
    println!("classes: {}", data.class_names.join(", "));
    println!(
        "model: zoo::cifar10_v1, seed {}; AdamW lr {}, batch size {}, {} epochs, augmentation {}",
        args.seed,
        args.lr,
        args.batch_size,
        args.epochs,
        if args.augment {
            "on (random crop, pad 4, and flip, on the model's device)"
        } else {
            "off"
        }
    );

    let mut model = crate::zoo::cifar10_v1(args.seed);
    // Loss and weight decay as in zoo::cifar10_v1; only the learning rate is ours.
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(args.lr, 0.01),
        Metric::CategoricalAccuracy,
    );
    model.to(&device)?;
    model.finalize(&[IMAGE_SIDE, IMAGE_SIDE, 3])?;

    let mut trainer = Trainer {
        model,
        args,
        step: 0,
    };
    let mut epochs = Vec::with_capacity(args.epochs);
    for epoch in 0..args.epochs {
        let report = trainer.epoch(epoch, &data.train_x, &data.train_y, test_x, test_y)?;
        println!(
            "epoch {:>3}/{}  train loss {:.4}  train acc {:.4}  test loss {:.4}  test acc {:.4}  \
             {:.1} ms/step  {:.0} images/s",
            report.epoch,
            args.epochs,
            report.train_loss,
            report.train_accuracy,
            report.test_loss,
            report.test_accuracy,
            report.ms_per_step,
            report.images_per_second
        );
        epochs.push(report);
    }
    let model = trainer.model;

    if let Some(path) = &args.save {
        model.save(path)?;
        println!("saved the model to {}", path.display());
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "{} on {} ({} train images)",
            if real {
                "CIFAR-10"
            } else {
                "synthetic stand-in (not CIFAR-10)"
            },
            device.name(),
            data.train_y.len()
        );
        super::plot::plot_training(path, &title, &epochs)?;
        println!("wrote the plot to {}", path.display());
    }
    let test_accuracy = epochs.last().map_or(0.0, |e| e.test_accuracy);
    println!("test accuracy: {test_accuracy:.4}");
    Ok(RunSummary {
        real_cifar10: real,
        device: device.name(),
        train_images: data.train_y.len(),
        test_images: test_y.len(),
        epochs,
        test_accuracy,
    })
}

fn print_device(device: &Device) {
    match device.gpu_context() {
        Some(ctx) => {
            let caps = ctx.caps();
            println!("device: {}", caps.describe());
            let variants: Vec<&str> = ConvVariant::candidates(caps)
                .into_iter()
                .map(ConvVariant::name)
                .collect();
            println!(
                "conv kernel variants (best first; a shape a variant declines falls back with a \
                 warning): {}",
                variants.join(", ")
            );
        }
        None => {
            println!(
                "device: cpu (pure-Rust path, {} rayon threads)",
                rayon::current_num_threads()
            );
            println!("conv kernels: CPU im2col + GEMM (no GPU variants)");
        }
    }
}

/// The synthetic stand-in, announced as such.
fn synthetic(limit: Option<usize>) -> Result<Cifar10> {
    let train = limit.map_or(SYNTHETIC_TRAIN, |l| l.min(SYNTHETIC_TRAIN));
    let (train_x, train_y) =
        crate::data::synthetic_images(train, IMAGE_SIDE, IMAGE_SIDE, SYNTHETIC_TRAIN_SEED)?;
    let (test_x, test_y) =
        crate::data::synthetic_images(SYNTHETIC_TEST, IMAGE_SIDE, IMAGE_SIDE, SYNTHETIC_TEST_SEED)?;
    println!(
        "data: no --data DIR and no AETHER_CIFAR10, so this trains on a SYNTHETIC 10-class set \
         ({train} train / {SYNTHETIC_TEST} test images, 32x32x3, generated in code). \
         This is NOT CIFAR-10."
    );
    println!(
        "      For the real data, download the CIFAR-10 binary version (cifar-10-binary.tar.gz, \
         https://www.cs.toronto.edu/~kriz/cifar.html), unpack it and pass \
         --data path/to/cifar-10-batches-bin (or set AETHER_CIFAR10)."
    );
    Ok(Cifar10 {
        train_x,
        train_y,
        test_x,
        test_y,
        class_names: (0..10).map(|k| format!("synthetic-{k}")).collect(),
    })
}

/// The training loop of [`run`], on `Model::train_tensors` so that each batch
/// can be augmented on the model's device after upload.
struct Trainer<'a> {
    model: crate::Model,
    args: &'a Cifar10Args,
    /// Steps taken so far, over all epochs.
    step: u64,
}

impl Trainer<'_> {
    fn epoch(
        &mut self,
        epoch: usize,
        x: &[f32],
        y: &[u32],
        test_x: &[f32],
        test_y: &[u32],
    ) -> Result<EpochReport> {
        let n = y.len();
        let batch_size = self.args.batch_size;
        let steps = n.div_ceil(batch_size);
        let epoch_seed = mix(self.args.seed, epoch as u64);
        let order = permutation(n, epoch_seed);
        let bar = progress_bar(epoch, self.args.epochs, steps);
        let start = Instant::now();
        let mut pending = PendingLosses::new(epoch, steps);
        // A batch holds at most every image (the batch size is the user's).
        let mut batch = Vec::with_capacity(batch_size.min(n) * IMAGE_VALUES);
        for (s, chunk) in order.chunks(batch_size).enumerate() {
            batch.clear();
            for &i in chunk {
                batch.extend_from_slice(&x[i * IMAGE_VALUES..(i + 1) * IMAGE_VALUES]);
            }
            let device = self.model.device().clone();
            let mut xb = Tensor::from_f32(
                vec![chunk.len(), IMAGE_SIDE, IMAGE_SIDE, 3],
                std::mem::take(&mut batch),
                &device,
            )?;
            if self.args.augment {
                // On the model's device: the GPU when training there.
                xb = random_crop_flip(&xb, AUGMENT_PAD, self.args.seed, self.step as u32)?;
            }
            let labels: Vec<u32> = chunk.iter().map(|&i| y[i]).collect();
            let yb = Tensor::from_u32(vec![chunk.len()], labels, &device)?;
            let (loss, correct) = self.model.train_tensors(&xb, &yb)?;
            self.step += 1;
            if (s + 1) % LOG_EVERY == 0 || s + 1 == steps {
                let value = pending.logged(self.step, &loss)?;
                let rate = (s + 1) as f64 / start.elapsed().as_secs_f64();
                bar.set_message(format!("loss {value:.4}  {rate:.1} steps/s"));
            }
            bar.inc(1);
            pending.push(self.step, loss, correct);
        }
        self.model.check_skipped(Some(&pending))?;
        let (loss_sum, correct_sum) = pending.totals()?;
        let train_seconds = start.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let (test_loss, test_accuracy) = self.model.evaluate(test_x, test_y, batch_size)?;
        Ok(EpochReport {
            epoch: epoch + 1,
            train_loss: (loss_sum / steps as f64) as f32,
            train_accuracy: correct_sum as f32 / n as f32,
            test_loss,
            test_accuracy,
            train_seconds,
            ms_per_step: train_seconds * 1000.0 / steps as f64,
            images_per_second: n as f64 / train_seconds,
        })
    }
}

fn mix(seed: u64, value: u64) -> u64 {
    let mut state = seed ^ value.wrapping_mul(0xd134_2543_de82_ef95);
    splitmix64(&mut state)
}

/// A Fisher-Yates shuffle of `0..n`, the same for the same seed everywhere.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in (1..n).rev() {
        let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// A bar like `Model::train`'s; indicatif draws it only on a terminal.
fn progress_bar(epoch: usize, epochs: usize, steps: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(steps as u64);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("{}/{epochs}", epoch + 1));
    bar
}

/// SplitMix64: a fast, well-mixed stream from any seed (shuffling, seeds).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
