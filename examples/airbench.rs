//! airbench94 (Keller Jordan's fast CIFAR-10 recipe, public source in
//! KellerJordan/cifar10-airbench) trained with aether, printing one line per
//! epoch, the training wall time and the test accuracy with test-time
//! augmentation.
//!
//!     cargo run --release --example airbench -- [--data DIR] [--epochs 10] [--device auto|gpu|cpu]
//!         [--seed 0] [--limit N] [--export-data PATH]
//!
//! - Data: CIFAR-10's binary version from `--data DIR` (or `AETHER_CIFAR10`),
//!   else a synthetic 10-class stand-in made in code (NOT CIFAR-10), each
//!   channel normalised by the training set's mean and deviation.
//!   `--export-data PATH` writes the normalised data as safetensors and stops:
//!   `benches/airbench_recipe.py --data PATH` trains PyTorch's twin of this
//!   recipe on the same images (docs/lab/airbench.md).
//! - The network: `zoo::airbench94_net` (dirac-initialised bias-free convs,
//!   BatchNorm without scale, GELU), its first 2x2 conv set to whiten 2x2
//!   patches of the first 5000 training images and never trained, its bias
//!   trained for the first 3 epochs.
//! - The recipe: batch 1024, label smoothing 0.2, Nesterov SGD with momentum
//!   0.85, airbench's learning rate 11.5 and weight decay 0.0153 per 1024
//!   examples (scaled by 1024 (1 + 1 / (1 - momentum)), for a loss summed over
//!   the batch; aether's is the mean, so the rate is multiplied and the decay
//!   divided by the batch), BatchNorm biases at 64x the rate and 1/64 the
//!   decay, a triangular schedule (0.2 -> 1 at 23% of the steps -> 0.07),
//!   lookahead every 5 steps, alternating flip and reflect-padded translation
//!   by up to 2 pixels, and test-time augmentation (mirror, and one-pixel
//!   shifts).
//! - Where it differs from airbench94: whole epochs (10, not 9.9); the last
//!   partial batch is trained (airbench drops it); the lookahead's decay,
//!   0.95^5 (step / steps)^3 in airbench, is set once an epoch from the
//!   epoch's middle step, and the average is not copied into the weights
//!   once more at the end; the lookahead averages trained parameters only
//!   (airbench's also BatchNorm's running statistics).

#[path = "shared/xdg.rs"]
mod xdg;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use aether::datasets::cifar10::load_cifar10;
use aether::gpu::{DevicePreference, GpuOptions};
use aether::ops::augment::reflect_translate_alternating_flip;
use aether::optim::{Lookahead, ParamGroup, PiecewiseLinear, Sgd};
use aether::zoo::{airbench94_net, whiten_first_conv};
use aether::{AetherError, BatchContext, Device, Loss, Metric, Model, Result, TrainOptions, Tta};

const USAGE: &str = "usage: airbench [--data DIR] [--epochs N] [--device auto|gpu|cpu] [--seed N] \
                     [--limit N] [--export-data PATH]";

const BATCH: usize = 1024;
const SIDE: usize = 32;
const VALUES: usize = SIDE * SIDE * 3;
/// airbench94's hyperparameters, per 1024 examples of a summed loss.
const LR: f32 = 11.5;
const MOMENTUM: f32 = 0.85;
const WEIGHT_DECAY: f32 = 0.0153;
const BIAS_SCALER: f32 = 64.0;
const LABEL_SMOOTHING: f32 = 0.2;
const WHITEN_BIAS_EPOCHS: usize = 3;
const WHITEN_IMAGES: usize = 5000;
const TRANSLATE: usize = 2;
const LOOKAHEAD_EVERY: u32 = 5;
/// The synthetic stand-in's size and seeds.
const SYNTHETIC_TRAIN: usize = 20_000;
const SYNTHETIC_TEST: usize = 4_000;

struct Args {
    data: Option<PathBuf>,
    epochs: usize,
    device: Option<DevicePreference>,
    seed: u64,
    limit: Option<usize>,
    export: Option<PathBuf>,
}

impl Args {
    fn parse() -> std::result::Result<Self, String> {
        let mut args = Args {
            data: std::env::var_os("AETHER_CIFAR10")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            epochs: 10,
            device: None,
            seed: 0,
            limit: None,
            export: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            if matches!(flag.as_str(), "--help" | "-h") {
                return Err(USAGE.into());
            }
            let value = it.next().ok_or(format!("{flag} needs a value\n{USAGE}"))?;
            let count = || match value.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{flag} takes a whole number >= 1, got {value:?}")),
            };
            match flag.as_str() {
                "--data" => args.data = Some(PathBuf::from(&value)),
                "--epochs" => args.epochs = count()?,
                "--seed" => args.seed = count()? as u64,
                "--limit" => args.limit = Some(count()?),
                "--export-data" => args.export = Some(PathBuf::from(&value)),
                "--device" => {
                    args.device = match value.as_str() {
                        "auto" => None,
                        "gpu" => Some(DevicePreference::Gpu),
                        "cpu" => Some(DevicePreference::Cpu),
                        _ => return Err(format!("--device takes auto, gpu or cpu, got {value:?}")),
                    }
                }
                other => return Err(format!("unknown option {other:?}\n{USAGE}")),
            }
        }
        Ok(args)
    }
}

/// Training and test images (NHWC, each channel normalised by the training
/// set's statistics) and labels.
struct Data {
    train_x: Vec<f32>,
    train_y: Vec<u32>,
    test_x: Vec<f32>,
    test_y: Vec<u32>,
}

fn load(args: &Args) -> Result<Data> {
    let (mut data, what) = match &args.data {
        Some(dir) => {
            let c = load_cifar10(dir, args.limit)?;
            let what = format!("CIFAR-10 from {}", dir.display());
            (
                Data {
                    train_x: c.train_x,
                    train_y: c.train_y,
                    test_x: c.test_x,
                    test_y: c.test_y,
                },
                what,
            )
        }
        None => {
            let train = args.limit.unwrap_or(SYNTHETIC_TRAIN).min(SYNTHETIC_TRAIN);
            let (train_x, train_y) = aether::data::synthetic_images(train, SIDE, SIDE, 0xab01)?;
            let (test_x, test_y) =
                aether::data::synthetic_images(SYNTHETIC_TEST, SIDE, SIDE, 0xab02)?;
            let data = Data {
                train_x,
                train_y,
                test_x,
                test_y,
            };
            (data, "a synthetic 10-class stand-in (not CIFAR-10)".into())
        }
    };
    normalise(&mut data);
    println!(
        "data: {what}, {} train / {} test images",
        data.train_y.len(),
        data.test_y.len()
    );
    Ok(data)
}

/// Each channel of both sets shifted and scaled by the training set's mean
/// and standard deviation.
fn normalise(data: &mut Data) {
    let mut sums = [0f64; 3];
    let mut squares = [0f64; 3];
    for (i, &v) in data.train_x.iter().enumerate() {
        sums[i % 3] += f64::from(v);
        squares[i % 3] += f64::from(v) * f64::from(v);
    }
    let count = (data.train_x.len() / 3) as f64;
    let stats: Vec<(f32, f32)> = (0..3)
        .map(|c| {
            let mean = sums[c] / count;
            let deviation = (squares[c] / count - mean * mean).max(1e-12).sqrt();
            (mean as f32, deviation as f32)
        })
        .collect();
    for x in [&mut data.train_x, &mut data.test_x] {
        for (i, v) in x.iter_mut().enumerate() {
            let (mean, deviation) = stats[i % 3];
            *v = (*v - mean) / deviation;
        }
    }
}

/// Writes the data as safetensors for `benches/airbench_recipe.py`.
fn export(data: &Data, path: &Path) -> Result<()> {
    let as_f32 = |y: &[u32]| y.iter().map(|&l| l as f32).collect::<Vec<f32>>();
    let tensors: Vec<(&str, Vec<usize>, Vec<f32>)> = vec![
        (
            "train_x",
            vec![data.train_y.len(), SIDE, SIDE, 3],
            data.train_x.clone(),
        ),
        ("train_y", vec![data.train_y.len()], as_f32(&data.train_y)),
        (
            "test_x",
            vec![data.test_y.len(), SIDE, SIDE, 3],
            data.test_x.clone(),
        ),
        ("test_y", vec![data.test_y.len()], as_f32(&data.test_y)),
    ];
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, values)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape.clone(),
                bytemuck::cast_slice(values),
            )
            .expect("shape and bytes agree");
            ((*name).to_owned(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, path).map_err(|e| {
        AetherError::Io {
            action: "writing the exported data",
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        }
    })?;
    println!("wrote {}", path.display());
    Ok(())
}

/// airbench94's model, configured with its recipe for `total_steps` steps.
fn airbench_model(seed: u64, total_steps: u64) -> Result<Model> {
    let kilostep_scale = 1024.0 * (1.0 + 1.0 / (1.0 - MOMENTUM));
    // airbench's rate and decay are for a loss summed over the batch.
    let lr = LR / kilostep_scale * BATCH as f32;
    let weight_decay = WEIGHT_DECAY * BATCH as f32 / kilostep_scale / BATCH as f32;
    let mut model = airbench94_net(seed);
    let sgd = Sgd::new(lr)
        .momentum(MOMENTUM)
        .nesterov(true)
        .weight_decay(weight_decay);
    let loss = Loss::SoftmaxCrossEntropy {
        label_smoothing: LABEL_SMOOTHING,
    };
    model.configure(loss, sgd, Metric::CategoricalAccuracy);
    model.set_param_groups(groups(false))?;
    model.set_schedule(Some(Box::new(PiecewiseLinear::triangle(
        lr,
        total_steps,
        0.2,
        0.23,
        0.07,
    ))));
    Ok(model)
}

/// BatchNorm biases at 64x the rate and 1/64 the decay; the whitening conv's
/// kernel never trained while its bias trains (once `whiten_frozen`, the
/// whole conv is frozen, and no group may name it).
fn groups(whiten_frozen: bool) -> Vec<ParamGroup> {
    let mut groups = vec![
        ParamGroup::kind("BatchNorm", Some("beta"))
            .lr_scale(BIAS_SCALER)
            .decay_scale(1.0 / BIAS_SCALER),
    ];
    if !whiten_frozen {
        groups.push(ParamGroup::layer(0, Some("kernel")).lr_scale(0.0));
    }
    groups
}

fn main() -> Result<()> {
    xdg::quiet_missing_runtime_dir();
    let args = Args::parse().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2);
    });
    let data = load(&args)?;
    if let Some(path) = &args.export {
        return export(&data, path);
    }
    let device = match args.device {
        None => Device::best()?,
        Some(preference) => Device::with_preference(preference, &GpuOptions::from_env()?)?,
    };
    println!("device: {}", device.name());
    let n = data.train_y.len();
    let steps_per_epoch = n.div_ceil(BATCH) as u64;
    let total_steps = steps_per_epoch * args.epochs as u64;
    let mut model = airbench_model(args.seed, total_steps)?;
    model.to(&device)?;
    model.finalize(&[SIDE, SIDE, 3])?;
    let whiten = WHITEN_IMAGES.min(n) * VALUES;
    whiten_first_conv(&mut model, &data.train_x[..whiten])?;

    let augment = |b: &mut BatchContext| {
        let step = b.step as u32;
        b.inputs = reflect_translate_alternating_flip(
            &b.inputs, TRANSLATE, b.rows, b.seed, step, b.epoch,
        )?;
        Ok(())
    };
    let options = TrainOptions {
        epochs: 1,
        batch_size: BATCH,
        shuffle: true,
        progress: false,
        log_every: steps_per_epoch as usize,
        on_batch: Some(&augment),
        ..Default::default()
    };
    let (mut train_seconds, start) = (0.0, Instant::now());
    for epoch in 0..args.epochs {
        if epoch == WHITEN_BIAS_EPOCHS {
            // The whitening bias stops too: the conv freezes whole, and
            // neither its backward nor the next conv's input gradient runs
            // again. (airbench's lookahead still averages the frozen bias,
            // which moves it once more; aether's averages trained
            // parameters only.)
            model.set_param_groups(groups(true))?;
            model.set_trainable(0, false)?;
        }
        let middle = (epoch as u64 * steps_per_epoch + steps_per_epoch / 2) as f32;
        let decay = 0.95f32.powi(5) * (middle / total_steps as f32).powi(3);
        model.set_lookahead(Some(Lookahead {
            every: LOOKAHEAD_EVERY,
            decay,
        }))?;
        let history = model.train(&data.train_x, &data.train_y, &options)?;
        let stats = &history.epochs[0];
        train_seconds += stats.train_seconds;
        let accuracy =
            model.accuracy_tta(&data.test_x, &data.test_y, 2000, Tta::MirrorTranslate)?;
        println!(
            "aether airbench94 epoch {}: train loss {:.4}, test accuracy (TTA) {accuracy:.4}, {:.1} s",
            epoch + 1,
            stats.loss,
            start.elapsed().as_secs_f64()
        );
    }
    let accuracy = model.accuracy_tta(&data.test_x, &data.test_y, 2000, Tta::MirrorTranslate)?;
    println!(
        "aether airbench94 on {}: {total_steps} steps, training {train_seconds:.2} s, test accuracy (TTA) {accuracy:.4}",
        device.name()
    );
    Ok(())
}
