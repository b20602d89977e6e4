//! Host time to put a v1 CIFAR-10 batch (256 x 32x32x3 f32 values) on the GPU:
//! the part of a training step the host spends before it records any kernel
//! (docs/lab/perf-notes.md, entry 68). Each iteration uploads one batch and only
//! that is timed; every 8th then waits for the GPU, untimed, so wgpu's staging
//! memory is recycled as in training.
//!
//!     cargo bench --bench upload
//!     cargo bench --bench upload -- f16   # criterion's filter

use std::time::{Duration, Instant};

use aether::{DType, Device, Tensor};
use criterion::{Criterion, Throughput};

const DIMS: [usize; 4] = [256, 32, 32, 3];

fn main() {
    // The upload to a GPU is what is timed: any adapter, lavapipe included.
    let Ok(device) = Device::gpu() else {
        eprintln!("no GPU adapter: nothing to upload to");
        return;
    };
    let ctx = device
        .gpu_context()
        .cloned()
        .expect("Device::gpu() is a GPU");
    let n: usize = DIMS.iter().product();
    let x: Vec<f32> = (0..n)
        .map(|i| (i * 7919 % 65521) as f32 / 65521.0 - 0.5)
        .collect();
    // Model::train's shuffled batch: rows scattered over the array.
    let rows: Vec<usize> = (0..DIMS[0]).map(|i| i * 97 % DIMS[0]).collect();
    let mut c = Criterion::default().without_plots().configure_from_args();
    let mut group = c.benchmark_group("upload_v1_batch");
    group.throughput(Throughput::Elements(n as u64));
    let mut bench = |name: &str, upload: &dyn Fn() -> aether::Result<Tensor>| {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut host = Duration::ZERO;
                for i in 0..iters {
                    let start = Instant::now();
                    drop(upload().expect("upload"));
                    host += start.elapsed();
                    if i % 8 == 7 {
                        ctx.flush();
                        ctx.wait_idle().expect("wait");
                    }
                }
                host
            })
        });
    };
    bench("f32_as_f16", &|| Tensor::from_f32_as_f16(DIMS, &x, &device));
    bench("rows_as_f16", &|| {
        Tensor::from_f32_rows(DIMS, &x, &rows, DType::F16, &device)
    });
    bench("f32", &|| Tensor::from_f32_slice(DIMS, &x, &device));
    drop(group);
    c.final_summary();
}
