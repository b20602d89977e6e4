//! The conv kernels at the five conv shapes of the v1 CIFAR-10 model and one
//! large shape (56x56x64 -> 64, 3x3 same), every variant the adapter offers
//! plus the CPU reference, batch 256 by default; and a 4096^3 GEMM (a 1x1 conv)
//! on the GPU variants.
//!
//!     cargo bench --bench conv                       # everything
//!     cargo bench --bench conv -- coop16/conv2       # criterion's filter
//!     AETHER_BENCH_BATCH=8 cargo bench --bench conv  # small batch (lavapipe, CPU)
//!
//! GPU iterations are timed with timestamp queries around each dispatch (the
//! kernels' own GPU time, operands already in the variant's type, as a layer
//! holds them), so they compare with cuDNN's per-call times in BENCHMARKS.md.
//! dinput reads the filter flipped beforehand where its halo kernel runs, as a
//! training step's dweight reduce writes it (until stop 33 its time included a
//! flip dispatch: docs/lab/perf-notes.md, entry 86).
//! Throughput is given in elements/s where **one element is one floating-point
//! operation** of the GEMM (2 per multiply-add): `Gelem/s` reads as GFLOP/s.
//! The cast bench's throughput is in bytes read and written.

use std::time::{Duration, Instant};

use aether::conv::{
    ConvParams, ConvPlans, ConvShapeMeta, ConvVariant, Padding, cast_f16, conv_backward_cast_fp16,
    conv2d_dinput_flipped, conv2d_dweight, conv2d_forward, dinput_flipped_filter,
};
use aether::{Device, Result, Tensor};
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, measurement::WallTime};

/// One benched conv: 'same' padding, NHWC, the batch from `AETHER_BENCH_BATCH`
/// unless `batch` fixes it.
struct BenchShape {
    name: &'static str,
    batch: Option<usize>,
    hwc: (usize, usize, usize),
    c_out: usize,
    filter: usize,
}

const fn conv3x3(name: &'static str, h: usize, w: usize, c_in: usize, c_out: usize) -> BenchShape {
    BenchShape {
        name,
        batch: None,
        hwc: (h, w, c_in),
        c_out,
        filter: 3,
    }
}

const SHAPES: [BenchShape; 7] = [
    conv3x3("conv1", 32, 32, 3, 32),
    conv3x3("conv2", 32, 32, 32, 32),
    conv3x3("conv3", 16, 16, 32, 64),
    conv3x3("conv4", 16, 16, 64, 64),
    conv3x3("conv5", 8, 8, 64, 128),
    conv3x3("large", 56, 56, 64, 64),
    // A 1x1 conv of one 64x64 image, 4096 -> 4096 channels: exactly a
    // 4096^3 GEMM, the sanity check of the coop core without im2col.
    BenchShape {
        name: "gemm4096",
        batch: Some(1),
        hwc: (64, 64, 4096),
        c_out: 4096,
        filter: 1,
    },
];
/// Dispatches per timed region (two timestamps each; query sets hold 4096).
const TIMED_CHUNK: u64 = 256;

fn batch_size() -> usize {
    std::env::var("AETHER_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i + seed) * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

/// The operands of one shape on `device`, in `variant`'s operand type.
struct Operands {
    params: ConvParams,
    meta: ConvShapeMeta,
    x: Tensor,
    w: Tensor,
    bias: Tensor,
    dy: Tensor,
}

impl Operands {
    fn new(device: &Device, n: usize, shape: &BenchShape) -> Self {
        let (h, w, c_in) = shape.hwc;
        let params = ConvParams::new(shape.c_out, shape.filter, Padding::Same);
        let meta = ConvShapeMeta::new([n, h, w, c_in], &params).unwrap();
        let t = |dims: [usize; 4], seed| {
            Tensor::from_f32(dims.to_vec(), data(dims.iter().product(), seed), device).unwrap()
        };
        Self {
            params,
            x: t(meta.input_dims(), 1),
            w: t(meta.weight_dims(), 2),
            bias: Tensor::from_f32(vec![shape.c_out], data(shape.c_out, 3), device).unwrap(),
            dy: t(meta.output_dims(), 4),
            meta,
        }
    }

    /// The operands in `variant`'s type: f16 copies for the f16 variants,
    /// the f32 tensors themselves for `portable_f32` and the CPU path.
    fn for_variant(&self, variant: Option<ConvVariant>) -> Self {
        let (x, w, dy) = if variant.is_some_and(ConvVariant::f16_operands) {
            let (dy, x) = conv_backward_cast_fp16(&self.dy, &self.x).unwrap();
            (x, cast_f16(&self.w, false).unwrap(), dy)
        } else {
            (self.x.clone(), self.w.clone(), self.dy.clone())
        };
        Self {
            x,
            w,
            dy,
            bias: self.bias.clone(),
            ..*self
        }
    }

    fn gemm_flops(&self, reduction: usize) -> u64 {
        2 * (self.meta.m * reduction * self.meta.c_out) as u64
    }
}

/// Time of `iters` runs of `work`: summed GPU timestamps on a GPU, wall time on the CPU.
fn measure(device: &Device, iters: u64, work: &dyn Fn() -> Result<()>) -> Duration {
    let Some(ctx) = device.gpu_context() else {
        let start = Instant::now();
        for _ in 0..iters {
            work().unwrap();
        }
        return start.elapsed();
    };
    let mut nanos = 0.0;
    let mut left = iters;
    while left > 0 {
        let chunk = left.min(TIMED_CHUNK);
        let (_, times) = ctx
            .timed(4 * chunk as u32, || (0..chunk).try_for_each(|_| work()))
            .unwrap();
        nanos += times.iter().map(|t| t.nanos).sum::<f64>();
        left -= chunk;
    }
    Duration::from_nanos(nanos as u64)
}

fn bench(
    group: &mut BenchmarkGroup<'_, WallTime>,
    device: &Device,
    name: &str,
    throughput: Throughput,
    work: &dyn Fn() -> Result<()>,
) {
    group.throughput(throughput);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| measure(device, iters, work))
    });
}

fn bench_variant(c: &mut Criterion, device: &Device, variant: Option<ConvVariant>) {
    let label = variant.map_or("cpu", ConvVariant::name);
    let plans = variant.map_or_else(ConvPlans::new, ConvPlans::forcing);
    for shape in &SHAPES {
        if variant.is_none() && matches!(shape.name, "large" | "gemm4096") {
            continue; // minutes per iteration on a laptop-class CPU
        }
        let n = shape.batch.unwrap_or_else(batch_size);
        let f32_ops = Operands::new(device, n, shape);
        let ops = f32_ops.for_variant(variant);
        let mut group = c.benchmark_group(format!("{label}/{}_b{n}", shape.name));
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        let (p, m) = (&ops.params, &ops.meta);
        bench(
            &mut group,
            device,
            "forward",
            Throughput::Elements(ops.gemm_flops(m.k)),
            &|| conv2d_forward(&ops.x, &ops.w, &ops.bias, p, &plans).map(drop),
        );
        bench(
            &mut group,
            device,
            "dweight",
            Throughput::Elements(ops.gemm_flops(m.k + 1)),
            &|| conv2d_dweight(&ops.x, &ops.dy, p, &plans).map(drop),
        );
        // The filter flipped once, as a training step's dweight reduce writes
        // it: `conv2d_dinput` would flip it in a dispatch of its own each call
        // where the halo kernel runs, and the GEMM core reads it unflipped
        // (docs/lab/perf-notes.md, entry 86).
        let flipped = dinput_flipped_filter(&ops.w, m.input_dims(), p, &plans)
            .expect("dinput's flipped filter");
        bench(
            &mut group,
            device,
            "dinput",
            Throughput::Elements(ops.gemm_flops(m.k)),
            &|| {
                conv2d_dinput_flipped(&ops.dy, &ops.w, flipped.as_ref(), m.input_dims(), p, &plans)
                    .map(drop)
            },
        );
        if variant.is_some_and(ConvVariant::f16_operands) {
            // f32 dy and x read, f16 copies of both written.
            let bytes = 6 * (m.m * m.c_out + m.n * m.h * m.w * m.c_in) as u64;
            bench(
                &mut group,
                device,
                "backward_cast",
                Throughput::Bytes(bytes),
                &|| conv_backward_cast_fp16(&f32_ops.dy, &f32_ops.x).map(drop),
            );
        }
        group.finish();
    }
}

fn conv(c: &mut Criterion) {
    match Device::gpu() {
        Ok(gpu) => {
            let caps = gpu.gpu_context().expect("gpu").caps();
            eprintln!("[aether-bench] {}", caps.describe());
            for variant in ConvVariant::candidates(caps) {
                bench_variant(c, &gpu, Some(variant));
            }
        }
        Err(e) => eprintln!("[aether-bench] GPU benchmarks skipped: {e}"),
    }
    bench_variant(c, &Device::Cpu, None);
}

criterion::criterion_group! {
    name = benches;
    // No plots: the plotters backend needs system fonts a headless GPU host lacks.
    config = Criterion::default().without_plots();
    targets = conv
}
criterion::criterion_main!(benches);
