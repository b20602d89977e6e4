//! Each distinct conv of a CIFAR-10 network (`--convs v1|resnet18|airbench94`,
//! default v1, or ImageNet's ResNet-50 without its stem, `--convs resnet50`) timed the way `benches/pytorch_reference.py --convs` times
//! cuDNN's: its forward, and its backward, called 20 times back to back on the
//! same operands and divided by 20, the median of `--repeats`. A conv the
//! network runs several times is listed once, its count in the last column
//! (the `all convs` total counts it that many times).
//!
//!     cargo run --release --example conv_passes -- [--convs v1] [--batch-size 256] [--repeats 30] [--calls 20] [--parts]
//!
//! The calls go through the `Conv2d` layer as a training step makes them (f16
//! input and gradient, as the v1 model hands them over; the backward's dweight,
//! its reduce and dinput, no dinput for the first conv) and are recorded into
//! one compute pass timed at its two ends (`GpuContext::timed_span`), as the
//! reference replays its 20 calls as one CUDA graph. `cifar10_breakdown` times
//! each dispatch in a pass of its own inside a real step instead. The table has
//! the breakdown's layout, so `tools/conv-verdict.awk` sets it against the
//! reference's. `--parts` also times each backward without its dinput (dweight
//! and its reduce) and prints, after the table, `parts` lines with that and the
//! rest (dinput, with the filter flip its halo kernel reads), as
//! `benches/pytorch_reference.py --parts` prints cuDNN's wgrad + bias grad and
//! dgrad.

#[path = "shared/xdg.rs"]
mod xdg;

use aether::conv::Padding;
use aether::conv::prepare_convs;
use aether::gpu::DevicePreference;
use aether::nn::{Conv2d, Layer, Mode, StepKind};
use aether::{AetherError, Device, Result, Tensor};

const USAGE: &str = "usage: conv_passes [--convs v1|resnet18|airbench94|resnet50] [--batch-size N] \
                     [--repeats N] [--calls N] [--parts]";

/// One conv of a network: input `H x W x C_in`, `C_out` filters of
/// `kernel x kernel` ('same' padding for 3x3, none for 1x1 and 2x2) at
/// `stride`, with or without bias, run `count` times a step. As in
/// benches/pytorch_reference.py's `CONVS`.
struct Conv {
    h: usize,
    w: usize,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    bias: bool,
    count: usize,
}

const fn conv(h: usize, c_in: usize, c_out: usize, kernel: usize, stride: usize) -> Conv {
    Conv {
        h,
        w: h,
        c_in,
        c_out,
        kernel,
        stride,
        bias: false,
        count: 1,
    }
}

const fn times(count: usize, c: Conv) -> Conv {
    Conv { count, ..c }
}

const fn biased(c: Conv) -> Conv {
    Conv { bias: true, ..c }
}

/// The distinct convs of each network; the first of each is the network's
/// first layer (no input gradient).
fn convs(network: &str) -> Option<Vec<Conv>> {
    Some(match network {
        "v1" => vec![
            biased(conv(32, 3, 32, 3, 1)),
            biased(conv(32, 32, 32, 3, 1)),
            biased(conv(16, 32, 64, 3, 1)),
            biased(conv(16, 64, 64, 3, 1)),
            biased(conv(8, 64, 128, 3, 1)),
        ],
        // zoo::resnet18_cifar: 3x3 stem, four stages of two basic blocks,
        // stride-2 3x3 convs and 1x1 stride-2 projections between stages.
        "resnet18" => vec![
            conv(32, 3, 64, 3, 1),
            times(4, conv(32, 64, 64, 3, 1)),
            conv(32, 64, 128, 3, 2),
            conv(32, 64, 128, 1, 2),
            times(3, conv(16, 128, 128, 3, 1)),
            conv(16, 128, 256, 3, 2),
            conv(16, 128, 256, 1, 2),
            times(3, conv(8, 256, 256, 3, 1)),
            conv(8, 256, 512, 3, 2),
            conv(8, 256, 512, 1, 2),
            times(3, conv(4, 512, 512, 3, 1)),
        ],
        // zoo::airbench94_net: the 2x2 whitening conv, then two convs a group
        // with a 2x2 max-pool after the first.
        "airbench94" => vec![
            biased(conv(32, 3, 24, 2, 1)),
            conv(31, 24, 64, 3, 1),
            conv(15, 64, 64, 3, 1),
            conv(15, 64, 256, 3, 1),
            conv(7, 256, 256, 3, 1),
            conv(7, 256, 256, 3, 1),
            conv(3, 256, 256, 3, 1),
        ],
        // torchvision's ResNet-50 at 224 px (the stride in the 3x3 convs),
        // its stem (7x7, stride 2) left out: every 1x1 and 3x3 conv of its
        // four stages of bottleneck blocks, projections included. No conv
        // here is the network's first, so each has an input gradient.
        "resnet50" => vec![
            conv(56, 64, 64, 1, 1),
            times(3, conv(56, 64, 64, 3, 1)),
            times(4, conv(56, 64, 256, 1, 1)),
            times(2, conv(56, 256, 64, 1, 1)),
            conv(56, 256, 128, 1, 1),
            conv(56, 128, 128, 3, 2),
            times(4, conv(28, 128, 512, 1, 1)),
            conv(56, 256, 512, 1, 2),
            times(3, conv(28, 512, 128, 1, 1)),
            times(3, conv(28, 128, 128, 3, 1)),
            conv(28, 512, 256, 1, 1),
            conv(28, 256, 256, 3, 2),
            times(6, conv(14, 256, 1024, 1, 1)),
            conv(28, 512, 1024, 1, 2),
            times(5, conv(14, 1024, 256, 1, 1)),
            times(5, conv(14, 256, 256, 3, 1)),
            conv(14, 1024, 512, 1, 1),
            conv(14, 512, 512, 3, 2),
            times(3, conv(7, 512, 2048, 1, 1)),
            conv(14, 1024, 2048, 1, 2),
            times(2, conv(7, 2048, 512, 1, 1)),
            times(2, conv(7, 512, 512, 3, 1)),
        ],
        _ => return None,
    })
}

/// Whether `network`'s list starts with its first layer, timed without an
/// input gradient.
fn lists_first_layer(network: &str) -> bool {
    network != "resnet50"
}

struct Args {
    convs: String,
    batch: usize,
    repeats: usize,
    calls: usize,
    parts: bool,
}

impl Args {
    fn parse() -> std::result::Result<Self, String> {
        let mut args = Args {
            convs: "v1".into(),
            batch: 256,
            repeats: 30,
            calls: 20,
            parts: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            if matches!(flag.as_str(), "--help" | "-h") {
                return Err(USAGE.into());
            }
            if flag == "--parts" {
                args.parts = true;
                continue;
            }
            let value = it.next().ok_or(format!("{flag} needs a value"))?;
            if flag == "--convs" {
                args.convs = value;
                continue;
            }
            let count = match value.parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => return Err(format!("{flag} takes a whole number >= 1, got {value:?}")),
            };
            match flag.as_str() {
                "--batch-size" => args.batch = count,
                "--repeats" => args.repeats = count,
                "--calls" => args.calls = count,
                other => return Err(format!("unknown option {other:?}\n{USAGE}")),
            }
        }
        Ok(args)
    }
}

/// Values in [-1, 1) that differ along every axis.
fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() -> Result<()> {
    xdg::quiet_missing_runtime_dir();
    let args = Args::parse().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2);
    });
    let device =
        Device::with_preference(DevicePreference::Gpu, &aether::gpu::GpuOptions::from_env()?)?;
    let ctx = device.gpu_context().expect("a GPU device").clone();
    println!("{}", ctx.caps().describe());
    println!(
        "batch {}, {} calls back to back per pass, median of {}",
        args.batch, args.calls, args.repeats
    );
    println!(
        "{:<5} {:<26} {:>10} {:>10} {:>9} {:>9} {:>5}",
        "layer", "conv", "fwd ms", "bwd ms", "fwd TF/s", "bwd TF/s", "count"
    );
    let Some(layers) = convs(&args.convs) else {
        eprintln!("unknown network {:?}\n{USAGE}", args.convs);
        std::process::exit(2);
    };
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (index, c) in layers.iter().enumerate() {
        let n = args.batch;
        let first = index == 0 && lists_first_layer(&args.convs);
        let (h, w, c_in, c_out) = (c.h, c.w, c.c_in, c.c_out);
        let padding = if c.kernel == 3 {
            Padding::Same
        } else {
            Padding::Valid
        };
        let mut layer = Conv2d::new(c_out, (c.kernel, c.kernel), padding)
            .stride((c.stride, c.stride))
            .bias(c.bias);
        let out = layer.build(&[h, w, c_in], index as u64, &device)?;
        let (h_out, w_out) = (out[0], out[1]);
        let x =
            Tensor::from_f32_as_f16(vec![n, h, w, c_in], &values(n * h * w * c_in, 1), &device)?;
        let dy = Tensor::from_f32_as_f16(
            vec![n, h_out, w_out, c_out],
            &values(n * h_out * w_out * c_out, 2),
            &device,
        )?;
        let train = Mode::Train { seed: 0, step: 0 };
        // Planned as a model plans its first step: measured where
        // AETHER_TUNE_CONVS=1 asks (src/conv/tune.rs).
        let step = StepKind {
            batch: n,
            input: x.dtype(),
            train: true,
            input_grad: !first,
        };
        if let Some(work) = layer.conv_work(&[h, w, c_in], &step) {
            prepare_convs(&ctx, &[work], 1)?;
        }
        // Once each first: plans made, pipelines compiled, input kept.
        layer.forward(&x, train)?;
        layer.backward(&dy, !first)?;
        ctx.wait_idle()?;
        let time = |pass: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let mut samples = Vec::with_capacity(args.repeats);
            for _ in 0..args.repeats {
                let ((), nanos) = ctx.timed_span(|| (0..args.calls).try_for_each(|_| pass()))?;
                if nanos <= 0.0 {
                    return Err(AetherError::Gpu {
                        during: "timing",
                        message: "a timed span recorded no dispatch".into(),
                    });
                }
                samples.push(nanos / 1e6 / args.calls as f64);
            }
            Ok(median(samples))
        };
        let shape = match (c.kernel, c.stride) {
            (3, 1) => format!("{h}x{w}x{c_in}->{c_out}"),
            (k, s) => format!("{h}x{w}x{c_in}->{c_out}:{k}x{k}s{s}"),
        };
        let forward = time(&mut || layer.forward(&x, train).map(drop))?;
        let backward = time(&mut || layer.backward(&dy, !first).map(drop))?;
        if args.parts && !first {
            layer.backward(&dy, false)?; // its reduce's pipeline compiled
            let weights = time(&mut || layer.backward(&dy, false).map(drop))?;
            parts.push((index, shape.clone(), weights, backward));
        }
        let gemm = (2 * n * h_out * w_out * c.kernel * c.kernel * c_in * c_out) as f64;
        // dweight (with its dbias row where there is a bias), and dinput
        // except for the first conv.
        let bias_flops = if c.bias {
            2 * n * h_out * w_out * c_out
        } else {
            0
        };
        let backward_flops = gemm * (if first { 1.0 } else { 2.0 }) + bias_flops as f64;
        println!(
            "{index:<5} Conv2d {shape:<19} {forward:>10.4} {backward:>10.4} {:>9.2} {:>9.2} {:>5}",
            gemm / (forward * 1e-3) / 1e12,
            backward_flops / (backward * 1e-3) / 1e12,
            c.count,
        );
        total += (forward + backward) * c.count as f64;
    }
    println!("{:<32} {total:>10.4} ms (fwd+bwd)", "all convs");
    if args.parts {
        // `parts` first, so tools/conv-verdict.awk (which matches `Conv2d` as the
        // second field) leaves these lines alone.
        println!(
            "parts {:<5} {:<26} {:>14} {:>14}",
            "layer", "conv", "dW+reduce ms", "dX (rest) ms"
        );
        for (index, shape, weights, backward) in parts {
            println!(
                "parts {index:<5} Conv2d {shape:<19} {weights:>14.4} {:>14.4}",
                backward - weights
            );
        }
    }
    Ok(())
}
