//! The aether side of the ResNet-18 / airbench94 parity check against
//! PyTorch (`benches/parity_models.py` is the other, and says how to run
//! both): imports the twin's initial weights with
//! `aether::import::load_pytorch_state_dict`, computes step 1's loss and
//! gradients (`Model::gradients`) on a second copy, then trains `steps`
//! AdamW steps on the same batches and writes the losses.
//!
//!     cargo run --release --example parity_models -- DIR [--device cpu|gpu]
//!
//! Reads `DIR/run.json`, `initial.safetensors`, `x.f32` and `y.u32` as
//! `parity_models.py make` wrote them; writes `aether.json` (losses, the
//! step-1 loss, the name map) and `aether_grads.safetensors` (step 1's
//! gradients, flat, by aether name).

#[path = "shared/xdg.rs"]
mod xdg;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use aether::import::load_pytorch_state_dict;
use aether::optim::Adam;
use aether::{AetherError, Device, Loss, Metric, Model, Result};

fn err(message: impl Into<String>) -> AetherError {
    AetherError::Model(message.into())
}

/// The zoo model `name` as its twin in benches/pytorch_models.py is built,
/// configured with the run's recipe, finalized on `device` with the twin's
/// weights; and the `(aether, PyTorch)` name map.
fn build(
    name: &str,
    run: &serde_json::Value,
    dir: &Path,
    device: &Device,
) -> Result<(Model, Vec<(String, String)>)> {
    let number = |key: &str| {
        run[key]
            .as_f64()
            .map(|v| v as f32)
            .ok_or_else(|| err(format!("run.json has no number {key}")))
    };
    let (mut model, names) = match name {
        "resnet18" => (
            aether::zoo::resnet18_cifar(10, 0),
            aether::zoo::resnet18_cifar_pytorch_names(10),
        ),
        "airbench94" => (
            aether::zoo::airbench94_net(0),
            aether::zoo::airbench94_pytorch_names(),
        ),
        other => return Err(err(format!("run.json: unknown model {other:?}"))),
    };
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: number("label_smoothing")?,
        },
        Adam::adamw(number("lr")?, number("weight_decay")?),
        Metric::CategoricalAccuracy,
    );
    model.to(device)?;
    model.finalize(&[32, 32, 3])?;
    load_pytorch_state_dict(&mut model, dir.join("initial.safetensors"), &names)?;
    Ok((model, names))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| err(format!("{}: {e}", path.display())))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// `tensors` as flat f32 safetensors.
fn write_flat(path: &Path, tensors: &[(String, Vec<f32>)]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, v)| {
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                vec![v.len()],
                bytemuck::cast_slice(v),
            )
            .map(|view| (name.clone(), view))
            .map_err(|e| err(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, None::<HashMap<String, String>>)
        .map_err(|e| err(e.to_string()))?;
    write(path, &bytes)
}

fn main() -> Result<()> {
    xdg::quiet_missing_runtime_dir();
    let mut dir = None;
    let mut device = Device::Cpu;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--device" => {
                device = match args.next().as_deref() {
                    Some("cpu") => Device::Cpu,
                    Some("gpu") => Device::gpu()?,
                    _ => return Err(err("--device: cpu or gpu")),
                }
            }
            _ if !arg.starts_with("--") => dir = Some(PathBuf::from(arg)),
            _ => return Err(err(format!("unknown option {arg}"))),
        }
    }
    let dir = dir.ok_or_else(|| err("usage: parity_models DIR [--device cpu|gpu]"))?;
    let run: serde_json::Value = serde_json::from_slice(&read(&dir.join("run.json"))?)
        .map_err(|e| err(format!("run.json: {e}")))?;
    let count = |key: &str| {
        run[key]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| err(format!("run.json has no count {key}")))
    };
    let (batch, batches, steps, side) = (
        count("batch")?,
        count("batches")?,
        count("steps")?,
        count("side")?,
    );
    let name = run["model"].as_str().unwrap_or_default().to_owned();
    let x: Vec<f32> = bytemuck::pod_collect_to_vec(&read(&dir.join("x.f32"))?);
    let y: Vec<u32> = bytemuck::pod_collect_to_vec(&read(&dir.join("y.u32"))?);
    let per_batch = batch * side * side * 3;
    if x.len() != batches * per_batch || y.len() != batches * batch {
        return Err(err("x.f32 / y.u32 do not hold run.json's batches"));
    }

    let (mut probe, names) = build(&name, &run, &dir, &device)?;
    let grads = probe.gradients(&x[..per_batch], &y[..batch])?;
    write_flat(&dir.join("aether_grads.safetensors"), &grads.tensors)?;

    let (mut model, _) = build(&name, &run, &dir, &device)?;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let b = step % batches;
        let (loss, _) = model.train_batch(
            &x[b * per_batch..(b + 1) * per_batch],
            &y[b * batch..(b + 1) * batch],
        )?;
        losses.push(loss.to_vec_f32()?[0]);
    }
    model.check_steps()?;
    let out = serde_json::json!({
        "device": device.name(),
        "grad_loss": grads.loss,
        "losses": losses,
        "names": names,
    });
    write(
        &dir.join("aether.json"),
        serde_json::to_string_pretty(&out)
            .map_err(|e| err(e.to_string()))?
            .as_bytes(),
    )?;
    for s in [1, 10, 50] {
        if let Some(l) = losses.get(s - 1) {
            println!(
                "aether {name} on {} loss after step {s}: {l:.6}",
                device.name()
            );
        }
    }
    Ok(())
}
