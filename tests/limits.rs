//! Buffer and workgroup limits. Inference over a batch whose activations do not
//! fit one GPU buffer is split batch-wise with unchanged results; a training
//! batch or a single tensor that does not fit is refused with an error naming
//! the tensor, its bytes and the limit. Grids over 65535 workgroups are folded.
//! The splitting is tested at an artificially lowered limit
//! (`GpuOptions::max_buffer_bytes`) and, where the adapter's limit is small
//! (lavapipe: 128 MiB), at the real one.

mod common;

use aether::conv::Padding;
use aether::gpu::DevicePreference;
use aether::nn::{Conv2d, Dense, GlobalAvgPool, ReLU};
use aether::{AetherError, Device, Model, Tensor, TrainOptions};
use common::{Rng, report, test_gpu_options};

/// Real limits above this are not tested here: the host memory and time to
/// go past them would be out of proportion (a real GPU, not lavapipe).
const REAL_LIMIT_TESTED: u64 = 256 << 20;

fn model(device: &Device, input: [usize; 3], conv: bool) -> Model {
    let mut model = Model::new().seed(5);
    if conv {
        model
            .add(Conv2d::new(8, (3, 3), Padding::Same))
            .add(ReLU::default());
    }
    model.add(GlobalAvgPool::default()).add(Dense::new(10));
    common::ready_model(model, device, &input)
}

/// The buffer limit aether works within on `device`.
fn buffer_limit(device: &Device) -> u64 {
    device.gpu_context().unwrap().caps().max_tensor_bytes()
}

/// The shared GPU, and a device of the same adapter whose buffers are capped
/// at `limit` bytes (`GpuOptions::max_buffer_bytes`); `None` without a GPU.
fn gpu_capped_at(limit: u64) -> Option<(Device, Device)> {
    let shared = common::gpu()?;
    let mut options = test_gpu_options();
    options.max_buffer_bytes = Some(limit);
    let capped = Device::with_preference(DevicePreference::Gpu, &options).unwrap();
    assert_eq!(buffer_limit(&capped), limit);
    Some((shared, capped))
}

/// The GPU and its buffer limit, when that limit is small enough to test for
/// real (lavapipe's 128 MiB); otherwise a visible skip.
fn gpu_with_a_testable_limit() -> Option<(Device, u64)> {
    let device = common::gpu()?;
    let limit = buffer_limit(&device);
    if limit > REAL_LIMIT_TESTED {
        common::skip(&format!("the adapter's buffer limit is {limit} bytes"));
        return None;
    }
    Some((device, limit))
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn inference_splits_batches_at_a_lowered_limit_and_training_refuses_them() {
    const LIMIT: u64 = 1 << 20;
    let Some((shared, capped)) = gpu_capped_at(LIMIT) else {
        return;
    };

    // 16x16x4 per sample: the conv output, 16x16x8 (8 KiB), is the largest;
    // 128 samples fit 1 MiB.
    let input = [16, 16, 4];
    let n = 300;
    let mut rng = Rng::fresh();
    let x = rng.vec(n * 16 * 16 * 4);
    let y: Vec<u32> = (0..n as u32).map(|i| i % 10).collect();
    let whole = model(&shared, input, true).predict(&x, n, true).unwrap();
    let mut split = model(&capped, input, true);
    assert_eq!(bits(&split.predict(&x, n, true).unwrap()), bits(&whole));
    let (loss, accuracy) = model(&shared, input, true).evaluate(&x, &y, n).unwrap();
    let (split_loss, split_accuracy) = split.evaluate(&x, &y, n).unwrap();
    assert_eq!(split_accuracy, accuracy);
    assert!(
        (split_loss - loss).abs() <= 1e-6 * loss.abs(),
        "{split_loss} vs {loss}"
    );

    let options = TrainOptions {
        batch_size: 512,
        progress: false,
        ..TrainOptions::default()
    };
    match split.train(&x, &y, &options) {
        Err(AetherError::TooLarge { what, bytes, limit }) => {
            assert_eq!(limit, LIMIT);
            // The batch is the whole set when it is smaller than batch_size.
            assert_eq!(bytes, n as u64 * 16 * 16 * 8 * 4);
            assert!(
                what.contains("training batch") && what.contains("layer 0") && what.contains("128"),
                "{what}"
            );
            report(&format!("[aether-test] refused: {what}: {bytes} > {limit}"));
        }
        other => panic!("expected TooLarge for the training batch, got {other:?}"),
    }
    // 128 samples fit: training at that batch size runs.
    let options = TrainOptions {
        batch_size: 128,
        ..options
    };
    split.train(&x[..128 * 1024], &y[..128], &options).unwrap();

    // One sample of 512x512x2 (2 MiB) cannot be split further.
    let mut huge = model(&capped, [512, 512, 2], false);
    match huge.predict(&vec![0.0; 512 * 512 * 2], 1, true) {
        Err(AetherError::TooLarge { what, bytes, limit }) => {
            assert_eq!((bytes, limit), (512 * 512 * 2 * 4, LIMIT));
            assert!(
                what.contains("the input") && what.contains("[512, 512, 2]"),
                "{what}"
            );
        }
        other => panic!("expected TooLarge for one sample, got {other:?}"),
    }
}

#[test]
fn a_tensor_over_the_real_limit_is_refused_naming_it() {
    let Some((device, limit)) = gpu_with_a_testable_limit() else {
        return;
    };
    let len = (limit / 4 + 1) as usize;
    match Tensor::from_f32(vec![len], vec![0.0; len], &device) {
        Err(AetherError::TooLarge {
            what,
            bytes,
            limit: reported,
        }) => {
            assert_eq!((bytes, reported), (len as u64 * 4, limit));
            assert!(what.contains(&format!("[{len}]")), "{what}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn inference_splits_batches_at_the_real_limit() {
    let Some((device, limit)) = gpu_with_a_testable_limit() else {
        return;
    };
    // 32x32x8 f32 samples (32 KiB): a batch of `n` is just over the limit.
    let input = [32, 32, 8];
    let per = 32 * 32 * 8;
    let n = (limit / (per as u64 * 4)) as usize + 64;
    let x = Rng::fresh().vec(n * per);
    let mut gpu_model = model(&device, input, false);
    let whole = gpu_model.predict(&x, n, true).unwrap();
    let chunked = gpu_model.predict(&x, 1024, true).unwrap();
    assert_eq!(bits(&whole), bits(&chunked));
    let cpu = model(&Device::Cpu, input, false)
        .predict(&x, n, true)
        .unwrap();
    let worst = whole
        .iter()
        .zip(&cpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-2, "GPU and CPU differ by {worst}");
    report(&format!(
        "[aether-test] predicted {n} samples ({} bytes) over a {limit}-byte limit",
        n * per * 4
    ));
}

/// Compares `op` on the GPU and the CPU for a tensor of `dims`.
fn same_on_both(
    device: &Device,
    dims: &[usize],
    op: impl Fn(&Tensor) -> Tensor,
    name: &str,
    rng: &mut Rng,
) {
    let data = rng.vec(dims.iter().product());
    let on = |d: &Device| {
        let x = Tensor::from_f32(dims.to_vec(), data.clone(), d).unwrap();
        op(&x).to_vec_f32().unwrap()
    };
    let (gpu, cpu) = (on(device), on(&Device::Cpu));
    assert_eq!(gpu.len(), cpu.len(), "{name}");
    let bad = gpu
        .iter()
        .zip(&cpu)
        .position(|(a, b)| (a - b).abs() > 1e-5 * (1.0 + b.abs()));
    assert!(
        bad.is_none(),
        "{name} on {dims:?}: element {bad:?} differs (seed {})",
        rng.seed
    );
}

#[test]
fn grids_over_65535_workgroups_are_folded() {
    let Some(device) = common::gpu() else {
        return;
    };
    let max = device
        .gpu_context()
        .unwrap()
        .caps()
        .limits
        .max_compute_workgroups_per_dimension as usize;
    // More elements than one grid row of 256-wide workgroups covers.
    let len = max * 256 + 1000;
    if (len * 4) as u64 > buffer_limit(&device) {
        common::skip("the buffer limit is below one full grid row");
        return;
    }
    let mut rng = Rng::fresh();
    same_on_both(
        &device,
        &[len],
        |x| aether::ops::relu(x).unwrap(),
        "relu",
        &mut rng,
    );
    same_on_both(
        &device,
        &[len],
        |x| aether::ops::activation::leaky_relu(x, 0.1).unwrap(),
        "leaky_relu",
        &mut rng,
    );
    same_on_both(
        &device,
        &[len],
        |x| aether::ops::dropout::dropout(x, 0.3, 9, 4).unwrap().0,
        "dropout",
        &mut rng,
    );
    // Rows: one thread per row, 64 rows a workgroup.
    let rows = max * 64 + 100;
    same_on_both(
        &device,
        &[rows, 2],
        |x| aether::ops::loss::softmax(x).unwrap(),
        "softmax",
        &mut rng,
    );
    // One workgroup per (sample, channel) pair.
    same_on_both(
        &device,
        &[max + 1000, 1, 1, 1],
        |x| aether::ops::pool::global_avg_pool(x).unwrap(),
        "global_avg_pool",
        &mut rng,
    );
}

/// A conv whose GEMM has more rows than the adapter launches workgroups of
/// 64-row tiles runs, and matches the CPU: the portable kernel's workgroups
/// take turns over the row tiles, and a coop block too small for the grid
/// declines to it.
#[test]
fn conv_with_a_huge_gemm_runs() {
    let Some(device) = common::gpu() else {
        return;
    };
    let max = device
        .gpu_context()
        .unwrap()
        .caps()
        .limits
        .max_compute_workgroups_per_dimension as usize;
    // M = N * 32 * 32 rows of one channel: over 65535 tiles of 64 rows.
    let n = (max * 64) / 1024 + 2;
    let dims = [n, 32, 32, 1];
    let mut rng = Rng::fresh();
    let x = rng.vec(dims.iter().product());
    let w = rng.vec(9);
    let params = aether::conv::ConvParams::new(1, 3, Padding::Same);
    let run = |d: &Device| {
        let x = Tensor::from_f32(dims.to_vec(), x.clone(), d).unwrap();
        let w = Tensor::from_f32(vec![3, 3, 1, 1], w.clone(), d).unwrap();
        let b = Tensor::from_f32(vec![1], vec![0.25], d).unwrap();
        aether::conv::conv2d_forward(&x, &w, &b, &params, &aether::conv::ConvPlans::new())
            .and_then(|y| y.to_vec_f32())
    };
    let y = run(&device).unwrap();
    let cpu = run(&Device::Cpu).unwrap();
    let worst = y
        .iter()
        .zip(&cpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst < 1e-2,
        "conv with M = {} differs by {worst}",
        n * 1024
    );
}

/// The fused optimizer binds all parameters at once and each of its state
/// buffers on its own: at a 1 MiB limit, Adam trains 200k parameters (its m
/// and v, 1.6 MB together, would not fit one binding) to the same bits as
/// without the limit, and 296k parameters (1.18 MB) are refused at the first
/// step naming the optimizer and the count, with the model left as it was.
#[test]
fn adam_trains_parameters_up_to_one_binding_and_refuses_more() {
    const LIMIT: u64 = 1 << 20;
    let Some((shared, capped)) = gpu_capped_at(LIMIT) else {
        return;
    };
    let dense = |units: &[usize], device: &Device| {
        let mut model = Model::new().seed(8);
        model.add(aether::nn::Flatten::default());
        for &n in units {
            model.add(Dense::new(n)).add(ReLU::default());
        }
        model.add(Dense::new(10));
        common::ready_model(model, device, &[1, 1, 390])
    };
    let mut rng = Rng::fresh();
    let x = rng.vec(4 * 390);
    let y = vec![1, 7, 3, 9];
    // 390 * 500 + 500 + 500 * 10 + 10 = 200510 parameters.
    let mut gpu = dense(&[500], &capped);
    let mut uncapped = dense(&[500], &shared);
    gpu.train_batch(&x, &y).unwrap();
    gpu.check_steps().unwrap();
    uncapped.train_batch(&x, &y).unwrap();
    let values = |m: &Model| -> Vec<(String, Vec<u32>)> {
        m.tensors()
            .unwrap()
            .into_iter()
            .map(|(n, t)| (n, bits(&t.to_vec_f32().unwrap())))
            .collect()
    };
    assert_eq!(values(&gpu), values(&uncapped), "seed {}", rng.seed);
    // 390 * 600 + 600 + 600 * 100 + 100 + 100 * 10 + 10 = 295710
    // parameters (1.18 MB), each layer's under the limit.
    let mut over = dense(&[600, 100], &capped);
    let before = values(&over);
    let err = over.train_batch(&x, &y).unwrap_err();
    assert!(
        matches!(&err, AetherError::TooLarge { what, .. } if what.contains("295710 parameters")),
        "{err}"
    );
    assert_eq!(values(&over), before, "the refused step changed the model");
}
