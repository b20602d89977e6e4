//! The example's whole run: device, data, training with `Model::train`
//! (each batch augmented on the model's device by its `on_batch` hook), one
//! line per epoch from its `on_epoch` hook and `test accuracy: 0.XXXX` at the
//! end.

use std::sync::Mutex;

use aether::conv::ConvVariant;
use aether::datasets::cifar10::{Cifar10, IMAGE_SIDE, IMAGE_VALUES, load_cifar10};
use aether::gpu::GpuOptions;
use aether::ops::augment::random_crop_flip;
use aether::optim::Adam;
use aether::{BatchContext, Device, EpochStats, Loss, Metric, Result, TrainOptions};

use crate::args::{Cifar10Args, ZooModel, check_args};

/// What one epoch of [`run`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    /// Counting from 1.
    pub epoch: usize,
    /// Mean loss of the epoch's steps (label-smoothed, with dropout), plus
    /// the L1/L2 penalty (none in the zoo's models).
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
        "model: zoo::{}, seed {}; AdamW lr {}, batch size {}, {} epochs, augmentation {}",
        match args.model {
            ZooModel::V1 => "cifar10_v1",
            ZooModel::Resnet18 => "resnet18_cifar",
        },
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

    let mut model = match args.model {
        ZooModel::V1 => aether::zoo::cifar10_v1(args.seed),
        ZooModel::Resnet18 => aether::zoo::resnet18_cifar(10, args.seed),
    };
    // Loss and weight decay as in the zoo (both alike); only the learning rate is ours.
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(args.lr, 0.01),
        Metric::CategoricalAccuracy,
    );
    model.to(&device)?;
    model.finalize(&[IMAGE_SIDE, IMAGE_SIDE, 3])?;

    // On the model's device: the GPU when training there.
    let augment = |b: &mut BatchContext| {
        b.inputs = random_crop_flip(&b.inputs, AUGMENT_PAD, b.seed, b.step as u32)?;
        Ok(())
    };
    let epochs = Mutex::new(Vec::with_capacity(args.epochs));
    let report = |epoch: usize, stats: &EpochStats| {
        let report = epoch_report(epoch, stats, data.train_y.len());
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
        epochs.lock().expect("one thread reports").push(report);
        Ok(())
    };
    let options = TrainOptions {
        epochs: args.epochs,
        batch_size: args.batch_size,
        validation: Some((test_x, test_y)),
        log_every: LOG_EVERY,
        on_batch: args.augment.then_some(&augment as &aether::BatchHook),
        on_epoch: Some(&report),
        ..TrainOptions::default()
    };
    model.train(&data.train_x, &data.train_y, &options)?;
    let epochs = epochs.into_inner().expect("one thread reports");

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
        crate::plot::plot_training(path, &title, &epochs)?;
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
        aether::data::synthetic_images(train, IMAGE_SIDE, IMAGE_SIDE, SYNTHETIC_TRAIN_SEED)?;
    let (test_x, test_y) = aether::data::synthetic_images(
        SYNTHETIC_TEST,
        IMAGE_SIDE,
        IMAGE_SIDE,
        SYNTHETIC_TEST_SEED,
    )?;
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

/// One epoch's line of [`run`], from what `Model::train` measured.
fn epoch_report(epoch: usize, stats: &EpochStats, images: usize) -> EpochReport {
    let (test_loss, test_accuracy) = stats.validation.unwrap_or((f32::NAN, f32::NAN));
    EpochReport {
        epoch: epoch + 1,
        train_loss: stats.loss,
        train_accuracy: stats.accuracy,
        test_loss,
        test_accuracy,
        train_seconds: stats.train_seconds,
        ms_per_step: stats.train_seconds * 1000.0 / stats.steps as f64,
        images_per_second: images as f64 / stats.train_seconds,
    }
}
