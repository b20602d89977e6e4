//! Where one training step of a CIFAR-10 network goes, on the chosen device:
//! the instrument the PyTorch side-by-side in BENCHMARKS.md is read from
//! (`benches/pytorch_reference.py` prints the same layout for v1,
//! `benches/pytorch_models.py --model M` the step times of every model).
//!
//!     cargo run --release --example cifar10_breakdown -- [--model v1|resnet18|airbench94] \
//!         [--batch-size 256] [--repeats 30] [--device auto|gpu|cpu] [--json PATH]
//!         [--f32-activations] [--separate-dropout]
//!
//! - `--model`: Aether-ML's v1 (default), `zoo::resnet18_cifar` or
//!   `zoo::airbench94_net`, the last trained here with AdamW (lr 1e-3, weight
//!   decay 0.01) and label smoothing 0.2, as `pytorch_models.py` trains it.
//!
//! - ms/step: the median over `--repeats` steps of upload + record + submit +
//!   wait, each step synchronised on its own (what a caller of `train_batch`
//!   waits for when it reads the loss every step); and pipelined: `--repeats`
//!   steps back to back, one wait at the end, divided by the count, with the
//!   host's time inside that loop (when it nears the step, the GPU waits on the
//!   host); the time to upload the batch and record a synchronised step; and
//!   the first step alone (pipeline compilation, or loading from the
//!   persistent pipeline cache of `AETHER_CACHE_DIR`).
//! - Per conv layer: forward and backward GPU time (timestamp queries around
//!   every dispatch of the layer, medians over the repeats), TFLOP/s of the
//!   GEMMs, and the kernel variant the planner chose.
//! - Dispatches and submissions per step, the pool's peak bytes on loan during
//!   a step and its total device footprint, and the step's GPU time by kernel
//!   with the largest cost named.
//!
//! `--f32-activations` keeps every activation f32 (`Model::f16_activations(false)`),
//! to measure what the f16 ones save; `--separate-dropout` runs each
//! SpatialDropout as its own layer (`Model::fuse_dropout(false)`). On the CPU
//! path only the step time is measured (no timestamps there).

#[path = "shared/xdg.rs"]
mod xdg;

use std::collections::BTreeMap;
use std::time::Instant;

use aether::conv::{ConvDirection, ConvShapeMeta};
use aether::data::synthetic_images;
use aether::gpu::{DevicePreference, GpuOptions};
use aether::{Device, Model, Result, Tensor};
use serde::Serialize;

const USAGE: &str = "usage: cifar10_breakdown [--model v1|resnet18|airbench94] [--batch-size N] [--repeats N] \
                     [--device auto|gpu|cpu] [--json PATH] [--f32-activations] [--separate-dropout]";

struct Args {
    model: String,
    batch: usize,
    repeats: usize,
    device: Option<DevicePreference>,
    json: Option<String>,
    f16_activations: bool,
    fuse_dropout: bool,
}

impl Args {
    fn parse() -> std::result::Result<Self, String> {
        let mut args = Args {
            model: "v1".into(),
            batch: 256,
            repeats: 30,
            device: None,
            json: None,
            f16_activations: true,
            fuse_dropout: true,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or(format!("{flag} needs a value"));
            let count = |v: String| match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{flag} takes a whole number >= 1, got {v:?}")),
            };
            match flag.as_str() {
                "--model" => {
                    args.model = value()?;
                    if !["v1", "resnet18", "airbench94"].contains(&args.model.as_str()) {
                        return Err(format!(
                            "--model takes v1|resnet18|airbench94, got {:?}",
                            args.model
                        ));
                    }
                }
                "--batch-size" => args.batch = count(value()?)?,
                "--repeats" => args.repeats = count(value()?)?,
                "--device" => {
                    args.device = Some(match value()?.as_str() {
                        "auto" => DevicePreference::Auto,
                        "gpu" => DevicePreference::Gpu,
                        "cpu" => DevicePreference::Cpu,
                        other => return Err(format!("--device takes auto|gpu|cpu, got {other:?}")),
                    })
                }
                "--json" => args.json = Some(value()?),
                "--f32-activations" => args.f16_activations = false,
                "--separate-dropout" => args.fuse_dropout = false,
                "--help" | "-h" => return Err(USAGE.into()),
                other => return Err(format!("unknown option {other:?}\n{USAGE}")),
            }
        }
        Ok(args)
    }
}

/// One conv layer's row of the table.
#[derive(Serialize)]
struct ConvRow {
    layer: usize,
    shape: String,
    forward_ms: f64,
    backward_ms: f64,
    /// The backward's two GEMMs alone (split-K reduce and casts excluded).
    dweight_ms: f64,
    dinput_ms: f64,
    forward_tflops: f64,
    backward_tflops: f64,
    variant: String,
}

/// Everything the example prints, for `--json`.
#[derive(Serialize)]
struct Report {
    adapter: String,
    model: String,
    batch: usize,
    repeats: usize,
    ms_per_step: f64,
    pipelined_ms_per_step: f64,
    /// Mean host time per step inside the pipelined loop.
    pipelined_host_ms: f64,
    /// Pipelined, with the batch already on the device: ms per step and the
    /// host's share of it (GPU devices only).
    resident_pipelined_ms: Option<f64>,
    resident_host_ms: Option<f64>,
    /// Host time to upload the batch and record the step (median).
    record_ms: f64,
    /// The first step, synchronised: pipeline compilation (or loading from the
    /// persistent cache), first allocations and optimizer state included.
    first_step_ms: f64,
    images_per_s: f64,
    dispatches_per_step: Option<usize>,
    submissions_per_step: Option<usize>,
    peak_live_bytes: Option<u64>,
    pool_bytes: Option<u64>,
    gpu_ms_per_step: Option<f64>,
    convs: Vec<ConvRow>,
    /// GPU ms per step by kernel label, largest first.
    kernels: Vec<(String, f64)>,
    /// GPU ms per step by layer type and direction, largest first.
    phases: Vec<(String, f64)>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    xdg::quiet_missing_runtime_dir();
    let args = Args::parse().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2);
    });
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<()> {
    let device = match args.device {
        None => Device::best()?,
        Some(p) => Device::with_preference(p, &GpuOptions::from_env()?)?,
    };
    let adapter = match device.gpu_context() {
        Some(ctx) => ctx.caps().describe(),
        None => "cpu (pure-Rust path)".to_owned(),
    };
    println!("{adapter}");
    println!("model {}", args.model);
    let batch = args.batch;
    let (x, y) = synthetic_images(batch, 32, 32, 1)?;
    let mut model = network(&args.model)
        .f16_activations(args.f16_activations)
        .fuse_dropout(args.fuse_dropout);
    model.to(&device)?;
    model.finalize(&[32, 32, 3])?;
    println!(
        "layers writing f16 outputs: {:?}; returning f16 input gradients: {:?}",
        model.f16_outputs(),
        model.f16_input_grads()
    );
    let sync = || match device.gpu_context() {
        Some(ctx) => {
            ctx.flush();
            ctx.wait_idle()
        }
        None => Ok(()),
    };
    let first = Instant::now();
    model.train_batch(&x, &y)?;
    sync()?;
    let first_step_ms = first.elapsed().as_secs_f64() * 1e3;
    // Warm up for at least a second: the first process on a fresh device
    // machine measured 12-14 ms synchronised steps after only 3 warm-up steps,
    // 5.3-5.4 ms in the next process (docs/lab/perf-notes.md, entry 9).
    let warm_up = Instant::now();
    let mut steps = 0;
    while steps < 3 || warm_up.elapsed().as_secs_f64() < 1.0 {
        model.train_batch(&x, &y)?;
        sync()?;
        steps += 1;
    }

    let (mut step_ms, mut record_ms) = (Vec::new(), Vec::new());
    for _ in 0..args.repeats {
        let start = Instant::now();
        model.train_batch(&x, &y)?;
        record_ms.push(start.elapsed().as_secs_f64() * 1e3);
        sync()?;
        step_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let ms_per_step = median(step_ms);
    let record_ms = median(record_ms);
    // Back to back, synchronised only at the end: recording a step overlaps the
    // GPU running the previous one, as in `Model::train` between logging steps.
    // The host's share of it: when recording takes as long as the step, the
    // GPU waits on the host, and GPU-side savings do not show.
    let pipelined = |step: &mut dyn FnMut() -> Result<()>| -> Result<(f64, f64)> {
        let start = Instant::now();
        let mut host_ms = 0.0;
        for _ in 0..args.repeats {
            let recording = Instant::now();
            step()?;
            host_ms += recording.elapsed().as_secs_f64() * 1e3;
        }
        sync()?;
        let repeats = args.repeats as f64;
        Ok((
            start.elapsed().as_secs_f64() * 1e3 / repeats,
            host_ms / repeats,
        ))
    };
    let (pipelined_ms_per_step, pipelined_host_ms) =
        pipelined(&mut || model.train_batch(&x, &y).map(drop))?;
    // The same steps on a batch already on the device (`Model::train_tensors`,
    // uploaded as the model uploads it): the difference is the host's cost of
    // converting and uploading a batch.
    let resident = match device.gpu_context() {
        Some(_) => {
            let rows: Vec<usize> = (0..batch).collect();
            let dims = [batch, 32, 32, 3];
            let xb = Tensor::from_f32_rows(dims, &x, &rows, model.input_dtype(), &device)?;
            let yb = Tensor::from_u32(vec![batch], y.clone(), &device)?;
            Some(pipelined(&mut || model.train_tensors(&xb, &yb).map(drop))?)
        }
        None => None,
    };
    let mut report = Report {
        adapter,
        model: args.model.clone(),
        batch,
        repeats: args.repeats,
        ms_per_step,
        pipelined_ms_per_step,
        pipelined_host_ms,
        resident_pipelined_ms: resident.map(|r| r.0),
        resident_host_ms: resident.map(|r| r.1),
        record_ms,
        first_step_ms,
        images_per_s: batch as f64 / ms_per_step * 1e3,
        dispatches_per_step: None,
        submissions_per_step: None,
        peak_live_bytes: None,
        pool_bytes: None,
        gpu_ms_per_step: None,
        convs: Vec::new(),
        kernels: Vec::new(),
        phases: Vec::new(),
    };
    if let Some(ctx) = device.gpu_context() {
        let (dispatches, submissions) = (ctx.dispatch_count(), ctx.submission_count());
        ctx.pool().reset_peak();
        model.train_batch(&x, &y)?;
        sync()?;
        let stats = ctx.pool().stats();
        report.dispatches_per_step = Some(ctx.dispatch_count() - dispatches);
        report.submissions_per_step = Some(ctx.submission_count() - submissions);
        report.peak_live_bytes = Some(stats.peak_live_bytes);
        report.pool_bytes = Some(stats.created_bytes);
        profile(&mut model, &x, &y, args.repeats, &mut report)?;
    }
    print_report(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("report serialises");
        aether::io::write_atomic(path.as_ref(), text.as_bytes())?;
        println!("wrote {path}");
    }
    Ok(())
}

/// The network `name`, configured to train.
fn network(name: &str) -> Model {
    match name {
        "resnet18" => aether::zoo::resnet18_cifar(10, 1),
        "airbench94" => {
            let mut model = aether::zoo::airbench94_net(1);
            model.configure(
                aether::Loss::SoftmaxCrossEntropy {
                    label_smoothing: 0.2,
                },
                aether::optim::Adam::adamw(1e-3, 0.01),
                aether::Metric::CategoricalAccuracy,
            );
            model
        }
        _ => aether::zoo::cifar10_v1(1),
    }
}

/// GPU times of `repeats` profiled steps: by scope (layer and direction) and by
/// kernel label, each the median of its per-step totals.
fn profile(
    model: &mut Model,
    x: &[f32],
    y: &[u32],
    repeats: usize,
    report: &mut Report,
) -> Result<()> {
    let ctx = model.device().gpu_context().expect("gpu device").clone();
    let mut by_scope: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut by_kernel: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut by_scope_kernel: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut totals = Vec::new();
    for _ in 0..repeats {
        let (_, times) = ctx.timed(1024, || model.train_batch(x, y))?;
        let mut scope_ms: BTreeMap<String, f64> = BTreeMap::new();
        let mut kernel_ms: BTreeMap<String, f64> = BTreeMap::new();
        let mut scope_kernel_ms: BTreeMap<(String, String), f64> = BTreeMap::new();
        for t in &times {
            let scope = t.scope.as_deref().unwrap_or("upload").to_owned();
            *scope_kernel_ms
                .entry((scope.clone(), t.label.to_owned()))
                .or_default() += t.nanos / 1e6;
            *scope_ms.entry(scope).or_default() += t.nanos / 1e6;
            *kernel_ms.entry(t.label.to_owned()).or_default() += t.nanos / 1e6;
        }
        for (k, v) in scope_kernel_ms {
            by_scope_kernel.entry(k).or_default().push(v);
        }
        totals.push(times.iter().map(|t| t.nanos / 1e6).sum());
        for (k, v) in scope_ms {
            by_scope.entry(k).or_default().push(v);
        }
        for (k, v) in kernel_ms {
            by_kernel.entry(k).or_default().push(v);
        }
    }
    let by_scope: BTreeMap<String, f64> =
        by_scope.into_iter().map(|(k, v)| (k, median(v))).collect();
    report.gpu_ms_per_step = Some(median(totals));
    report.kernels = sorted(by_kernel.into_iter().map(|(k, v)| (k, median(v))));
    // "3 BatchNorm forward" -> "BatchNorm forward": what each kind of layer costs.
    let mut phases: BTreeMap<String, f64> = BTreeMap::new();
    for (scope, ms) in &by_scope {
        let phase = scope.split_once(' ').map_or(scope.as_str(), |(_, p)| p);
        *phases.entry(phase.to_owned()).or_default() += ms;
    }
    report.phases = sorted(phases.into_iter());

    for (layer, plans) in model.conv_plans() {
        let Some(&(_, meta, _)) = plans.iter().find(|(d, _, _)| *d == ConvDirection::Forward)
        else {
            continue;
        };
        let kind = model.layer_spec(layer).map_or("?", |s| s.kind());
        let ms = |dir: &str| {
            by_scope
                .get(&format!("{layer} {kind} {dir}"))
                .copied()
                .unwrap_or(0.0)
        };
        let gemm = |m: &ConvShapeMeta, k: usize| 2.0 * (m.m * k * m.c_out) as f64;
        let has = |d| plans.iter().any(|(dir, _, _)| *dir == d);
        let forward_flops = gemm(&meta, meta.k);
        let backward_flops = gemm(&meta, meta.k + 1)
            + if has(ConvDirection::DInput) {
                gemm(&meta, meta.k)
            } else {
                0.0
            };
        let mut variants: Vec<String> = plans
            .iter()
            .map(|(_, _, p)| p.kernel_name().to_owned())
            .collect();
        variants.sort();
        variants.dedup();
        // Where plans were measured (AETHER_TUNE_CONVS=1), the tunings that won.
        for (direction, meta, _) in &plans {
            let tuning = ctx.plan_tuning(*direction, meta);
            if !tuning.is_empty() {
                let values: Vec<String> = tuning
                    .values()
                    .map(|(var, value)| format!("{}={value}", var.trim_start_matches("AETHER_")))
                    .collect();
                variants.push(format!("{direction:?}[{}]", values.join(" ")));
            }
        }
        let (forward_ms, backward_ms) = (ms("forward"), ms("backward"));
        let kernel_ms = |label: &str| {
            let key = (format!("{layer} {kind} backward"), label.to_owned());
            by_scope_kernel.get(&key).cloned().map_or(0.0, median)
        };
        report.convs.push(ConvRow {
            layer,
            shape: format!("{kind} {}x{}x{}->{}", meta.h, meta.w, meta.c_in, meta.c_out),
            forward_ms,
            backward_ms,
            dweight_ms: kernel_ms("conv_dweight"),
            dinput_ms: kernel_ms("conv_dinput"),
            forward_tflops: forward_flops / (forward_ms * 1e-3) / 1e12,
            backward_tflops: backward_flops / (backward_ms * 1e-3) / 1e12,
            variant: variants.join("+"),
        });
    }
    Ok(())
}

fn sorted(rows: impl Iterator<Item = (String, f64)>) -> Vec<(String, f64)> {
    let mut rows: Vec<_> = rows.collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows
}

fn print_report(r: &Report) {
    println!(
        "{} CIFAR-10 model, batch {}, 32x32x3: {:.3} ms/step (median of {} synchronised steps), \
         {:.0} images/s; pipelined {:.3} ms/step ({:.3} ms of it on the host); host time to \
         record a step {:.3} ms",
        r.model,
        r.batch,
        r.ms_per_step,
        r.repeats,
        r.images_per_s,
        r.pipelined_ms_per_step,
        r.pipelined_host_ms,
        r.record_ms
    );
    if let (Some(ms), Some(host)) = (r.resident_pipelined_ms, r.resident_host_ms) {
        println!(
            "batch already on the GPU (train_tensors): pipelined {ms:.3} ms/step ({host:.3} ms \
             of it on the host)"
        );
    }
    println!(
        "first step {:.1} ms (pipelines compiled, or loaded from the persistent cache)",
        r.first_step_ms
    );
    let (Some(dispatches), Some(submissions), Some(peak), Some(pool), Some(gpu_ms)) = (
        r.dispatches_per_step,
        r.submissions_per_step,
        r.peak_live_bytes,
        r.pool_bytes,
        r.gpu_ms_per_step,
    ) else {
        println!("(CPU path: no per-layer GPU timestamps)");
        return;
    };
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "per step: {dispatches} dispatches, {submissions} submission(s), GPU time in kernels {gpu_ms:.3} ms; \
         peak GPU memory on loan {:.1} MiB (pool footprint {:.1} MiB)",
        mib(peak),
        mib(pool)
    );
    println!(
        "{:<5} {:<26} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}  variant",
        "layer", "conv", "fwd ms", "bwd ms", "dW ms", "dX ms", "fwd TF/s", "bwd TF/s"
    );
    // Two decimals on a GPU; enough digits to be non-zero on lavapipe.
    let tflops = |v: f64| {
        if v >= 0.1 {
            format!("{v:>9.2}")
        } else {
            format!("{v:>9.5}")
        }
    };
    for c in &r.convs {
        println!(
            "{:<5} {:<26} {:>10.4} {:>10.4} {:>9.4} {:>9.4} {} {}  {}",
            c.layer,
            c.shape,
            c.forward_ms,
            c.backward_ms,
            c.dweight_ms,
            c.dinput_ms,
            tflops(c.forward_tflops),
            tflops(c.backward_tflops),
            c.variant
        );
    }
    let conv_ms: f64 = r.convs.iter().map(|c| c.forward_ms + c.backward_ms).sum();
    println!("{:<32} {conv_ms:>10.4} ms (fwd+bwd)", "all convs");
    println!("GPU ms per step by phase:");
    for (phase, ms) in &r.phases {
        println!("  {phase:<28} {ms:8.4}");
    }
    println!("GPU ms per step by kernel:");
    for (label, ms) in &r.kernels {
        println!("  {label:<28} {ms:8.4}");
    }
    if let Some((label, ms)) = r.kernels.first() {
        println!(
            "largest cost: {label} ({ms:.3} ms, {:.0}% of GPU time; wall step {:.3} ms vs {gpu_ms:.3} ms in kernels)",
            100.0 * ms / gpu_ms,
            r.ms_per_step
        );
    }
}
