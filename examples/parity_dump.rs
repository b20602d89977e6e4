//! The aether side of the step-by-step parity check against PyTorch
//! (`benches/parity_pytorch.py` is the other): builds the v1 CIFAR model
//! (`zoo::cifar10_v1`'s layers and recipe, optionally with its dropout rates
//! at 0), saves its initial weights, a few fixed batches, the loss and every
//! parameter gradient of the first batch (`Model::gradients`), the loss of
//! each `train_batch` step, the spatial-dropout masks each step drew, the
//! weights after the last step and the evaluation-mode loss then, all under
//! one directory, so that a PyTorch twin can replay the same steps.
//!
//!     cargo run --release --example parity_dump -- DIR [--seed N] [--batch N]
//!         [--side N] [--batches N] [--steps N] [--no-dropout] [--device cpu|gpu]
//!
//! Files: `initial.safetensors` and `final.safetensors` (`Model::save`),
//! `x.f32` (`[batches * batch, side, side, 3]` NHWC, little-endian f32),
//! `y.u32` (labels), `grads.safetensors` (step 1's gradients, flat, named as
//! the model file's tensors), `masks.f32` (`[steps, layer, batch, channels]`
//! per dropout layer, in layer order, each step's multiplier per sample and
//! channel) and `run.json` (the settings and the losses).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use aether::conv::Padding;
use aether::nn::{BatchNorm, Conv2d, Dense, GlobalAvgPool, MaxPool2d, ReLU, SpatialDropout};
use aether::ops::dropout::spatial_dropout;
use aether::optim::Adam;
use aether::{AetherError, Device, Loss, Metric, Model, Result, Tensor};

/// v1's stages: the convs' filters and the spatial-dropout rate after the pool.
const STAGES: [(&[usize], f32); 3] = [(&[32, 32], 0.1), (&[64, 64], 0.15), (&[128], 0.2)];
/// `Model`'s per-layer seed multiplier (model.rs `layer_seed`).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The mask key of dropout layer `i` of a model seeded `seed`, as the layer
/// forms it (model.rs `layer_seed`, then nn/dropout.rs `mask_key`); should
/// the two ever part, the PyTorch replay parts at step 1 of a dropout run.
fn mask_key(seed: u64, i: usize) -> u64 {
    let layer_seed = seed ^ (i as u64 + 1).wrapping_mul(GOLDEN);
    let mut z = seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    layer_seed ^ z ^ (z >> 31)
}

struct Args {
    dir: PathBuf,
    seed: u64,
    batch: usize,
    side: usize,
    batches: usize,
    steps: usize,
    dropout: bool,
    device: Device,
}

fn usage(message: &str) -> AetherError {
    AetherError::Model(format!(
        "{message}\nusage: parity_dump DIR [--seed N] [--batch N] [--side N] [--batches N] \
         [--steps N] [--no-dropout] [--device cpu|gpu]"
    ))
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        dir: PathBuf::new(),
        seed: 0,
        batch: 32,
        side: 32,
        batches: 10,
        steps: 50,
        dropout: true,
        device: Device::Cpu,
    };
    let mut dir = None;
    let mut rest = std::env::args().skip(1);
    while let Some(arg) = rest.next() {
        if arg == "--no-dropout" {
            args.dropout = false;
            continue;
        }
        if !arg.starts_with("--") {
            dir = Some(PathBuf::from(arg));
            continue;
        }
        let value = rest
            .next()
            .ok_or_else(|| usage(&format!("{arg} needs a value")))?;
        let number = || {
            value
                .parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| usage(&format!("{arg}: expected a whole number >= 1")))
        };
        match arg.as_str() {
            "--seed" => {
                args.seed = value
                    .parse()
                    .map_err(|_| usage(&format!("--seed: {value:?}")))?
            }
            "--batch" => args.batch = number()?,
            "--side" => args.side = number()?,
            "--batches" => args.batches = number()?,
            "--steps" => args.steps = number()?,
            "--device" => {
                args.device = match value.as_str() {
                    "cpu" => Device::Cpu,
                    "gpu" => Device::gpu()?,
                    _ => return Err(usage("--device: cpu or gpu")),
                }
            }
            _ => return Err(usage(&format!("unknown option {arg}"))),
        }
    }
    args.dir = dir.ok_or_else(|| usage("no output directory"))?;
    // Three 2x2 pools: each side needs at least 8 pixels.
    if args.side < 8 {
        return Err(usage("--side must be at least 8"));
    }
    Ok(args)
}

/// v1 as `zoo::cifar10_v1` builds it (same layers, so the same per-layer
/// seeds and weights), with each dropout rate kept or set to 0.
fn v1(seed: u64, dropout: bool) -> Model {
    let mut model = Model::new().seed(seed);
    for (filters, rate) in STAGES {
        for &f in filters {
            model.add(Conv2d::new(f, (3, 3), Padding::Same));
            model.add(BatchNorm::new(0.9, 1e-5));
            model.add(ReLU::default());
        }
        model.add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid));
        model.add(SpatialDropout::new(if dropout { rate } else { 0.0 }));
    }
    model.add(GlobalAvgPool::default());
    model.add(Dense::new(10));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(1e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    model
}

fn build(args: &Args) -> Result<Model> {
    let mut model = v1(args.seed, args.dropout);
    model.finalize(&[args.side, args.side, 3])?;
    model.to(&args.device)?;
    Ok(model)
}

/// Each dropout layer's `[batch, channels]` multipliers at `step`, drawn as
/// the layer draws them (on the CPU: the masks are the same on every device).
fn masks(args: &Args, step: u32) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    let (mut layer, mut side) = (0usize, args.side);
    for (filters, rate) in STAGES {
        layer += filters.len() * 3 + 1; // conv, BN, ReLU each, then the pool
        side /= 2;
        let channels = *filters.last().expect("a stage has convs");
        let rate = if args.dropout { rate } else { 0.0 };
        let ones = Tensor::from_f32(
            vec![args.batch, side, side, channels],
            vec![1.0; args.batch * side * side * channels],
            &Device::Cpu,
        )?;
        let (_, mask) = spatial_dropout(&ones, rate, mask_key(args.seed, layer), step)?;
        let mask = mask.to_vec_f32()?;
        // Constant over the map: pixel (0, 0) of each sample.
        for n in 0..args.batch {
            let at = n * side * side * channels;
            out.extend_from_slice(&mask[at..at + channels]);
        }
        layer += 1;
    }
    Ok(out)
}

fn write_raw(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| AetherError::Model(format!("{}: {e}", path.display())))
}

/// `tensors` as flat f32 safetensors (the Python side reshapes them by name).
fn write_flat(path: &Path, tensors: &[(String, Vec<f32>)]) -> Result<()> {
    let bytes: Vec<(String, Vec<u8>, usize)> = tensors
        .iter()
        .map(|(name, v)| (name.clone(), bytemuck::cast_slice(v).to_vec(), v.len()))
        .collect();
    let views = bytes
        .iter()
        .map(|(name, b, len)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![*len], b)
                .map(|v| (name.clone(), v))
                .map_err(|e| AetherError::Model(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let out = safetensors::serialize(views, None::<HashMap<String, String>>)
        .map_err(|e| AetherError::Model(e.to_string()))?;
    write_raw(path, &out)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| AetherError::Model(format!("{}: {e}", args.dir.display())))?;
    let images = args.batches * args.batch;
    let (x, y) = aether::data::synthetic_images(images, args.side, args.side, args.seed ^ 0xda7a)?;
    let per_batch = args.batch * args.side * args.side * 3;
    write_raw(&args.dir.join("x.f32"), bytemuck::cast_slice(&x))?;
    write_raw(&args.dir.join("y.u32"), bytemuck::cast_slice(&y))?;

    // Step 1's gradients from a second model built alike: the same weights,
    // the same dropout masks (step 0), and no step taken.
    let mut probe = build(&args)?;
    let grads = probe.gradients(&x[..per_batch], &y[..args.batch])?;
    write_flat(&args.dir.join("grads.safetensors"), &grads.tensors)?;

    let mut model = build(&args)?;
    model.save(args.dir.join("initial.safetensors"))?;
    let mut losses = Vec::with_capacity(args.steps);
    let mut all_masks = Vec::new();
    for step in 0..args.steps {
        let b = step % args.batches;
        let (xb, yb) = (
            &x[b * per_batch..(b + 1) * per_batch],
            &y[b * args.batch..(b + 1) * args.batch],
        );
        all_masks.extend(masks(&args, step as u32)?);
        let (loss, _) = model.train_batch(xb, yb)?;
        losses.push(loss.to_vec_f32()?[0]);
    }
    model.save(args.dir.join("final.safetensors"))?;
    write_raw(
        &args.dir.join("masks.f32"),
        bytemuck::cast_slice(&all_masks),
    )?;
    let (eval_loss, eval_accuracy) = model.evaluate(&x, &y, args.batch)?;
    let run = serde_json::json!({
        "model": "cifar10_v1",
        "device": args.device.name(),
        "seed": args.seed,
        "batch": args.batch,
        "side": args.side,
        "batches": args.batches,
        "steps": args.steps,
        "dropout": args.dropout,
        "lr": 1e-3, "weight_decay": 0.01, "label_smoothing": 0.05,
        "adam_epsilon": 1e-7, "bn_momentum_keras": 0.9, "bn_epsilon": 1e-5,
        "grad_loss": grads.loss,
        "losses": losses,
        "eval_loss": eval_loss,
        "eval_accuracy": eval_accuracy,
    });
    let text = serde_json::to_string_pretty(&run).map_err(|e| AetherError::Model(e.to_string()))?;
    write_raw(&args.dir.join("run.json"), text.as_bytes())?;
    for s in [1, 10, 50] {
        if let Some(l) = losses.get(s - 1) {
            println!("aether {} loss after step {s}: {l:.6}", args.device.name());
        }
    }
    println!(
        "eval loss {eval_loss:.6}, accuracy {eval_accuracy:.4}; wrote {}",
        args.dir.display()
    );
    Ok(())
}
