//! Milliseconds per training step of the Aether-ML v1 CIFAR-10 model (32x32x3,
//! batch 256 by default) on the best device, and where one step's GPU time goes.
//!
//!     cargo run --release --example train_step -- [--batch 256] [--steps 50]
//!
//! Each step uploads its batch, runs forward, loss, backward and the fused AdamW
//! update as one submission; the wall time of `--steps` steps (after 3 warm-up
//! steps, with the GPU drained at both ends) is divided by the step count.

use std::collections::BTreeMap;
use std::time::Instant;

use aether::data::synthetic_images;
use aether::{Device, Result};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, got {v}"))
        })
        .unwrap_or(default)
}

fn main() -> Result<()> {
    let batch = arg("--batch", 256);
    let steps = arg("--steps", 50).max(1);
    let device = Device::best()?;
    match device.gpu_context() {
        Some(ctx) => println!("{}", ctx.caps().describe()),
        None => println!("device: cpu"),
    }
    let (x, y) = synthetic_images(batch, 32, 32, 1);
    let mut model = aether::zoo::cifar10_v1(1);
    model.to(&device)?;
    model.finalize(&[32, 32, 3])?;
    let drain = || match device.gpu_context() {
        Some(ctx) => {
            ctx.flush();
            ctx.wait_idle()
        }
        None => Ok(()),
    };
    for _ in 0..3 {
        model.train_batch(&x, &y)?;
    }
    drain()?;
    let start = Instant::now();
    let mut last = None;
    for _ in 0..steps {
        last = Some(model.train_batch(&x, &y)?.0);
    }
    drain()?;
    let ms = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
    let loss = last.map(|l| l.to_vec_f32()).transpose()?.map(|v| v[0]);
    println!(
        "batch {batch}: {ms:.3} ms/step over {steps} steps ({:.0} images/s), last loss {loss:?}",
        batch as f64 / ms * 1e3
    );
    if let Some(ctx) = device.gpu_context() {
        let (_, times) = ctx.timed(512, || model.train_batch(&x, &y))?;
        let mut by_kernel: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
        for t in &times {
            let e = by_kernel.entry(t.label).or_default();
            e.0 += t.nanos / 1e6;
            e.1 += 1;
        }
        let total: f64 = by_kernel.values().map(|v| v.0).sum();
        println!(
            "one step, GPU time by kernel ({} dispatches, {total:.3} ms in kernels):",
            times.len()
        );
        let mut rows: Vec<_> = by_kernel.into_iter().collect();
        rows.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
        for (label, (ms, count)) in rows {
            println!("  {label:<28} {count:>3}x {ms:8.3} ms");
        }
    }
    Ok(())
}
