//! Per-kernel GPU times of the conv layers of the Aether-ML v1 CIFAR-10 model,
//! measured with timestamp queries, for every variant the adapter has.
//!
//!     cargo run --release --example conv_breakdown -- [--batch 256] [--reps 20]
//!
//! Prints one line per (layer, variant, kernel) with the median time over the
//! repetitions and the achieved TFLOP/s, then per-variant totals of one
//! forward+backward of the five convs.

use aether::conv::{
    ConvParams, ConvPlans, ConvShapeMeta, ConvVariant, Padding, cast_f16, conv_backward_cast_fp16,
    conv2d_dinput, conv2d_dweight, conv2d_forward,
};
use aether::{Device, Result, Tensor};

/// (H, W, C_in, C_out) of the five 3x3 'same' convs; maxpool after conv 2 and 4.
const LAYERS: [(usize, usize, usize, usize); 5] = [
    (32, 32, 3, 32),
    (32, 32, 32, 32),
    (16, 16, 32, 64),
    (16, 16, 64, 64),
    (8, 8, 64, 128),
];

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

fn pseudo_random(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let h = (i as u32 ^ seed)
                .wrapping_mul(0x9e37_79b9)
                .rotate_left(13)
                .wrapping_mul(0x85eb_ca6b);
            (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let batch = arg("--batch", 256);
    let reps = arg("--reps", 20).max(1);
    let device = Device::gpu()?;
    let ctx = device.gpu_context().expect("gpu").clone();
    println!("{}", ctx.caps().describe());
    println!("batch {batch}, median of {reps} runs; times are GPU timestamps");
    println!(
        "{:<22} {:<13} {:<26} {:>9} {:>8}",
        "layer", "variant", "kernel", "ms", "TFLOP/s"
    );
    for variant in ConvVariant::candidates(ctx.caps()) {
        let plans = ConvPlans::forcing(variant);
        let mut total = 0.0;
        for (i, &(h, w, c_in, c_out)) in LAYERS.iter().enumerate() {
            let params = ConvParams::new(c_out, 3, Padding::Same);
            let meta = ConvShapeMeta::new([batch, h, w, c_in], &params)?;
            let x = Tensor::from_f32(
                meta.input_dims().to_vec(),
                pseudo_random(batch * h * w * c_in, 1),
                &device,
            )?;
            let wt = Tensor::from_f32(
                meta.weight_dims().to_vec(),
                pseudo_random(meta.k * c_out, 2),
                &device,
            )?;
            let b = Tensor::from_f32(vec![c_out], pseudo_random(c_out, 3), &device)?;
            let dy = Tensor::from_f32(
                meta.output_dims().to_vec(),
                pseudo_random(meta.m * c_out, 4),
                &device,
            )?;
            // Operands already in the variant's type, as a layer holds them.
            let (x_op, w_op, dy_op) = if variant.f16_operands() {
                let (dy16, x16) = conv_backward_cast_fp16(&dy, &x)?;
                (x16, cast_f16(&wt, false)?, dy16)
            } else {
                (x.clone(), wt.clone(), dy.clone())
            };
            let mut times: std::collections::BTreeMap<&'static str, Vec<f64>> = Default::default();
            for rep in 0..=reps {
                let (_, kernel_times) = ctx.timed(16, || {
                    conv2d_forward(&x_op, &w_op, &b, &params, &plans)?;
                    conv_backward_cast_fp16(&dy, &x)?;
                    conv2d_dweight(&x_op, &dy_op, &params, &plans)?;
                    conv2d_dinput(&dy_op, &w_op, meta.input_dims(), &params, &plans)
                })?;
                if rep == 0 {
                    continue; // warm-up: compiles pipelines
                }
                for t in kernel_times {
                    times.entry(t.label).or_default().push(t.nanos / 1e6);
                }
            }
            let gemm_flops = 2.0 * (meta.m * meta.k * c_out) as f64;
            for (label, ms) in times {
                let ms = median(ms);
                total += ms;
                let tflops = if label.starts_with("conv_")
                    && !label.ends_with("reduce")
                    && !label.contains("cast")
                {
                    format!("{:8.2}", gemm_flops / (ms * 1e-3) / 1e12)
                } else {
                    "       -".into()
                };
                println!(
                    "conv{} {h}x{w} {c_in}->{c_out:<5} {:<13} {label:<26} {ms:9.4} {tflops}",
                    i + 1,
                    variant.name()
                );
            }
        }
        println!(
            "TOTAL {:<16} {:<13} {:<26} {total:9.4}",
            "5 convs fwd+bwd",
            variant.name(),
            "all kernels"
        );
    }
    Ok(())
}
