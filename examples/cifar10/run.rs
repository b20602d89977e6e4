//! The example's whole run: device, data, the training loop (on
//! `Model::train_tensors`, so each batch can be augmented on the model's
//! device), one line per epoch and `test accuracy: 0.XXXX` at the end.

use std::time::Instant;

use aether::conv::ConvVariant;
use aether::datasets::cifar10::{Cifar10, IMAGE_SIDE, IMAGE_VALUES, load_cifar10};
use aether::gpu::GpuOptions;
use aether::model::PendingLosses;
use aether::ops::augment::random_crop_flip;
use aether::optim::Adam;
use aether::progress::Progress;
use aether::{Device, Loss, Metric, Model, Result, Tensor};

use crate::args::{Cifar10Args, ZooModel, check_args};

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

/// The training loop of [`run`], on `Model::train_tensors` so that each batch
/// can be augmented on the model's device after upload.
struct Trainer<'a> {
    model: Model,
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
        let bar = Progress::epoch(epoch, self.args.epochs, steps);
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

/// SplitMix64: a fast, well-mixed stream from any seed (shuffling, seeds).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
