//! Wall-clock time of the three conv directions on CIFAR conv2's shape
//! (32x32x32 -> 32, 3x3 same), batch 32, on the CPU path and on the best GPU.
//! GPU iterations include submission and the read back of one result, so they
//! measure what a caller waits for; per-kernel GPU times are in the
//! `conv_breakdown` example.
//!
//!     cargo bench --bench conv

use aether::conv::{
    ConvParams, ConvPlans, ConvShapeMeta, Padding, conv2d_dinput, conv2d_dweight, conv2d_forward,
};
use aether::{Device, Tensor};
use criterion::{Criterion, criterion_group, criterion_main};

fn data(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

fn bench_device(c: &mut Criterion, name: &str, device: &Device) {
    let params = ConvParams::new(32, 3, Padding::Same);
    let meta = ConvShapeMeta::new([32, 32, 32, 32], &params).unwrap();
    let x = Tensor::from_f32(
        meta.input_dims().to_vec(),
        data(meta.n * 32 * 32 * 32),
        device,
    )
    .unwrap();
    let w = Tensor::from_f32(meta.weight_dims().to_vec(), data(meta.k * 32), device).unwrap();
    let b = Tensor::from_f32(vec![32], data(32), device).unwrap();
    let dy = Tensor::from_f32(meta.output_dims().to_vec(), data(meta.m * 32), device).unwrap();
    let plans = ConvPlans::new();
    let mut group = c.benchmark_group(format!("conv2_b32/{name}"));
    group.sample_size(10);
    group.bench_function("forward", |bench| {
        bench.iter(|| {
            conv2d_forward(&x, &w, &b, &params, &plans)
                .unwrap()
                .to_vec_f32()
                .unwrap()
        })
    });
    group.bench_function("dweight", |bench| {
        bench.iter(|| {
            conv2d_dweight(&x, &dy, &params, &plans)
                .unwrap()
                .0
                .to_vec_f32()
                .unwrap()
        })
    });
    group.bench_function("dinput", |bench| {
        bench.iter(|| {
            conv2d_dinput(&dy, &w, meta.input_dims(), &params, &plans)
                .unwrap()
                .to_vec_f32()
                .unwrap()
        })
    });
    group.finish();
}

fn conv(c: &mut Criterion) {
    bench_device(c, "cpu", &Device::Cpu);
    match Device::gpu() {
        Ok(gpu) => bench_device(c, "gpu", &gpu),
        Err(e) => eprintln!("[aether] GPU benchmarks skipped: {e}"),
    }
}

criterion_group!(benches, conv);
criterion_main!(benches);
