//! The GPU context: capabilities, the pipeline cache and its failure path, the
//! disk cache, the buffer pool and batched submission. Each test that counts
//! something opens its own context so other tests cannot disturb the counts.

mod common;

use std::sync::Arc;

use half::f16;

use aether::conv::Padding;
use aether::gpu::{DevicePreference, GpuContext, GpuOptions, PipelineKey};
use aether::nn::{BatchNorm, Conv2d, Dense, GlobalAvgPool, MaxPool2d, ReLU};
use aether::{DType, Device, Model, Tensor, diagnostics};
use common::{Rng, report, skip, test_gpu_options};

/// A private context for one test, or `None` after a visible skip.
fn own_context(options: &GpuOptions) -> Option<Arc<GpuContext>> {
    common::gpu()?;
    match Device::with_preference(DevicePreference::Gpu, options).unwrap() {
        Device::Gpu(ctx) => Some(ctx),
        Device::Cpu => unreachable!("Gpu preference never yields the CPU"),
    }
}

#[test]
fn reports_capabilities_and_cooperative_matrix_configurations() {
    let Some(device) = common::gpu() else { return };
    let caps = device.gpu_context().unwrap().caps();
    let configs: Vec<String> = caps.coop_matrix.iter().map(|c| c.to_string()).collect();
    report(&format!(
        "[aether-test] cooperative-matrix configurations on {:?}: {}; f16xf16->f32 square tile: {:?}",
        caps.adapter_name,
        if configs.is_empty() {
            "none".to_owned()
        } else {
            configs.join(", ")
        },
        caps.coop_f16_f32_tile()
    ));
    assert!(!caps.adapter_name.is_empty());
    // The context asks for the adapter's real limits, not the 128 MiB default.
    assert!(caps.limits.max_storage_buffer_binding_size >= 128 << 20);
    if let Some(tile) = caps.coop_f16_f32_tile() {
        assert!(tile == 8 || tile == 16);
    }
}

#[test]
fn invalid_shader_gives_none_and_one_warning_then_valid_kernels_still_work() {
    let Some(ctx) = own_context(&test_gpu_options()) else {
        return;
    };
    let key = PipelineKey::new("broken_for_test", "portable").with("TILE", 4);
    let before = diagnostics::warnings().len();
    let broken = "@compute @workgroup_size(1) fn main() { let x: f32 = undeclared_thing; }";
    assert!(
        ctx.pipelines()
            .get_or_create(&key, "main", || broken.into())
            .is_none()
    );
    // Remembered: no second compile attempt and no second warning.
    let mut recompiled = false;
    assert!(
        ctx.pipelines()
            .get_or_create(&key, "main", || {
                recompiled = true;
                broken.into()
            })
            .is_none()
    );
    assert!(!recompiled, "a failed key must not be compiled again");
    let new: Vec<String> = diagnostics::warnings()[before..]
        .iter()
        .filter(|w| w.contains("broken_for_test"))
        .cloned()
        .collect();
    assert_eq!(new.len(), 1, "exactly one warning expected, got {new:?}");
    assert!(
        new[0].starts_with("[aether] ") && new[0].contains("portable"),
        "{}",
        new[0]
    );

    // A valid kernel compiled afterwards on the same device still works.
    let x = Tensor::from_f32(
        vec![4],
        vec![-1.0, 2.0, -3.0, 4.0],
        &Device::Gpu(ctx.clone()),
    )
    .unwrap();
    assert_eq!(
        aether::ops::relu(&x).unwrap().to_vec_f32().unwrap(),
        [0.0, 2.0, 0.0, 4.0]
    );
}

#[test]
fn pipelines_compile_once_per_key() {
    let Some(ctx) = own_context(&test_gpu_options()) else {
        return;
    };
    let device = Device::Gpu(ctx.clone());
    let x = Tensor::from_f32(vec![2, 3], vec![1.0, -2.0, 3.0, -4.0, 5.0, -6.0], &device).unwrap();
    for _ in 0..3 {
        aether::ops::relu(&x).unwrap();
    }
    assert_eq!(ctx.pipelines().compiled_count(), 1);
}

#[test]
fn pipeline_cache_is_persisted_and_a_corrupt_file_is_ignored_with_a_warning() {
    let dir = std::env::temp_dir().join(format!("aether-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut options = test_gpu_options();
    options.cache_dir = Some(dir.clone());
    let Some(ctx) = own_context(&options) else {
        return;
    };
    let Some(path) = ctx.pipelines().disk_path().map(|p| p.to_owned()) else {
        skip(&format!(
            "backend of {:?} has no pipeline cache",
            ctx.caps().adapter_name
        ));
        return;
    };
    let x = Tensor::from_f32(vec![3], vec![-1.0, 0.5, 2.0], &Device::Gpu(ctx.clone())).unwrap();
    let y = aether::ops::relu(&x).unwrap();
    // Written once the host waits for the GPU, not per compiled pipeline.
    assert!(!path.exists(), "cache file written before any wait");
    y.to_vec_f32().unwrap();
    let saved = std::fs::read(&path).expect("cache file written after a compile and a wait");
    assert!(!saved.is_empty());
    // A pipeline compiled with no wait after it is saved when the context goes.
    std::fs::remove_file(&path).unwrap();
    aether::ops::activation::relu_backward(&x, &x).unwrap();
    drop((x, y, ctx));
    assert!(path.exists(), "cache file written on drop");

    std::fs::write(&path, b"definitely not a pipeline cache").unwrap();
    let before = diagnostics::warnings().len();
    let ctx = own_context(&options).unwrap();
    let warned = diagnostics::warnings()[before..]
        .iter()
        .any(|w| w.starts_with("[aether] ignoring corrupt pipeline cache"));
    assert!(
        warned,
        "corrupt cache must be reported: {:?}",
        diagnostics::warnings()
    );
    let x = Tensor::from_f32(vec![3], vec![-1.0, 0.5, 2.0], &Device::Gpu(ctx)).unwrap();
    assert_eq!(
        aether::ops::relu(&x).unwrap().to_vec_f32().unwrap(),
        [0.0, 0.5, 2.0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One "step": upload, two kernels, read back.
fn step(device: &Device, data: &[f32]) -> Vec<f32> {
    let x = Tensor::from_f32(vec![data.len()], data.to_vec(), device).unwrap();
    let y = aether::ops::relu(&x).unwrap();
    let z = aether::ops::relu(&y).unwrap();
    z.to_vec_f32().unwrap()
}

#[test]
fn buffer_pool_reuses_buffers_across_identical_steps() {
    let Some(ctx) = own_context(&test_gpu_options()) else {
        return;
    };
    let device = Device::Gpu(ctx.clone());
    let mut rng = Rng::fresh();
    let data = rng.vec(1000);
    let first = step(&device, &data);
    let after_first = ctx.pool().stats();
    let second = step(&device, &data);
    let after_second = ctx.pool().stats();
    assert_eq!(first, second);
    assert!(after_first.created > 0);
    assert_eq!(
        after_second.created, after_first.created,
        "the second identical step must allocate nothing new"
    );
    assert!(after_second.reused > after_first.reused);
}

/// f32 values rounded to f16 while they are uploaded match `f16::from_f32`
/// bit for bit, ties to even, overflow to infinity and subnormals included;
/// the odd length needs a padded last word.
#[test]
fn values_uploaded_as_f16_are_rounded_to_nearest_even() {
    let mut values: Vec<f32> = Rng::fresh().vec(5001).iter().map(|v| v * 3000.0).collect();
    let tie_down = 1.0 + f32::powi(2.0, -11);
    let tie_up = 1.0 + 3.0 * f32::powi(2.0, -11);
    values.extend([
        tie_down,
        tie_up,
        65504.0,
        65520.0,
        -1e6,
        f32::INFINITY,
        3e-6,
        -6e-8,
        0.0,
    ]);
    // Saturating past +-65504 (issue 37), so 65520, -1e6 and inf give +-65504.
    let expected: Vec<u16> = values
        .iter()
        .map(|&v| f16::from_f32(aether::conv::clip_f16_range(v)).to_bits())
        .collect();
    assert_eq!(expected[5001..5003], [0x3c00, 0x3c02], "ties go to even");
    assert_eq!(expected[5004..5007], [0x7bff, 0xfbff, 0x7bff], "saturated");
    for device in [Some(Device::Cpu), common::gpu()].into_iter().flatten() {
        let t = Tensor::from_f32_as_f16(vec![values.len()], &values, &device).unwrap();
        let bits: Vec<u16> = t
            .to_vec_f16()
            .unwrap()
            .iter()
            .map(|h| h.to_bits())
            .collect();
        assert_eq!(bits, expected, "on {device:?}");
    }
}

/// Uploads of several jobs' worth of values are written by several threads
/// (src/gpu/host_write.rs): every value lands in its place, f32 exactly and f16
/// rounded as `f16::from_f32`, up to an odd last job.
#[test]
fn large_uploads_arrive_whole_as_f32_and_f16() {
    let Some(device) = common::gpu() else { return };
    let len = 3 * 65536 + 1001;
    let values: Vec<f32> = Rng::fresh().vec(len).iter().map(|v| v * 1000.0).collect();
    let t = Tensor::from_f32_slice(vec![len], &values, &device).unwrap();
    assert_eq!(t.to_vec_f32().unwrap(), values);
    let t = Tensor::from_f32_as_f16(vec![len], &values, &device).unwrap();
    let expected: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
    assert_eq!(t.to_vec_f16().unwrap(), expected);
}

/// `Tensor::from_f32_rows` gathers rows in the order given, repeats included,
/// the same on every device and in both float types; rows past the array, a
/// row count that is not the first dimension and U32 are errors that say so.
#[test]
fn rows_are_gathered_in_order_as_f32_and_f16() {
    let row_len = 3 * 5 * 7;
    let available = 2003;
    let x = Rng::fresh().vec(available * row_len);
    let rows: Vec<usize> = (0..2000)
        .map(|i| (i * 389 + 17) % available)
        .chain([5, 5])
        .collect();
    let gathered: Vec<f32> = rows
        .iter()
        .flat_map(|&r| x[r * row_len..(r + 1) * row_len].iter().copied())
        .collect();
    let rounded: Vec<f16> = gathered.iter().map(|&v| f16::from_f32(v)).collect();
    let dims = vec![rows.len(), 3, 5, 7];
    for device in [Some(Device::Cpu), common::gpu()].into_iter().flatten() {
        let t = Tensor::from_f32_rows(dims.clone(), &x, &rows, DType::F32, &device).unwrap();
        assert_eq!(t.to_vec_f32().unwrap(), gathered, "f32 on {device:?}");
        let t = Tensor::from_f32_rows(dims.clone(), &x, &rows, DType::F16, &device).unwrap();
        assert_eq!(t.to_vec_f16().unwrap(), rounded, "f16 on {device:?}");
        let past =
            Tensor::from_f32_rows(vec![2, 3, 5, 7], &x, &[0, available], DType::F32, &device);
        let message = past.unwrap_err().to_string();
        assert!(
            message.contains(&format!("row {available} of an array of {available} rows")),
            "{message}"
        );
        let count = Tensor::from_f32_rows(vec![3, 3, 5, 7], &x, &[0, 1], DType::F32, &device);
        assert!(
            count
                .unwrap_err()
                .to_string()
                .contains("2 rows for its first dimension")
        );
        let u32s = Tensor::from_f32_rows(vec![2, 3, 5, 7], &x, &[0, 1], DType::U32, &device);
        assert!(u32s.unwrap_err().to_string().contains("U32"));
    }
}

/// Uploads with no command after them still reach the GPU at a flush (an
/// empty submission): wgpu holds their staging memory until a submission, and
/// a loop of uploads alone would otherwise grow it without end. Consecutive
/// uploads share one submission, and a flush with nothing pending submits
/// nothing.
#[test]
fn a_flush_delivers_uploads_that_no_command_follows() {
    let Some(ctx) = own_context(&test_gpu_options()) else {
        return;
    };
    let device = Device::Gpu(Arc::clone(&ctx));
    let values = Rng::fresh().vec(1000);
    let before = ctx.submission_count();
    let a = Tensor::from_f32_slice(vec![1000], &values, &device).unwrap();
    let b = Tensor::from_f32_as_f16(vec![1000], &values, &device).unwrap();
    assert_eq!(ctx.submission_count(), before, "uploads wait for a flush");
    ctx.flush();
    assert_eq!(
        ctx.submission_count(),
        before + 1,
        "one submission for both uploads"
    );
    ctx.flush();
    assert_eq!(
        ctx.submission_count(),
        before + 1,
        "nothing pending, nothing submitted"
    );
    assert_eq!(a.to_vec_f32().unwrap(), values);
    let rounded: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
    assert_eq!(b.to_vec_f16().unwrap(), rounded);
}

/// wgpu uploads whole 4-byte words: an odd count of f16 values still arrives
/// whole (it used to fail validation at the next wait).
#[test]
fn an_odd_count_of_f16_values_uploads_whole() {
    let Some(device) = common::gpu() else { return };
    for len in [1, 3, 1001] {
        let values: Vec<f16> = Rng::fresh()
            .vec(len)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let t = Tensor::from_f16(vec![len], values.clone(), &device).unwrap();
        assert_eq!(t.to_vec_f16().unwrap(), values, "{len} values");
    }
}

/// A chain of `steps` dependent leaky ReLUs, each with its own slope, and the
/// same on the host (one f32 product per step, so the two agree exactly).
fn leaky_chain(x: &Tensor, steps: usize, host: &mut [f32]) -> Tensor {
    let mut y = x.clone();
    for i in 0..steps {
        let alpha = 0.5 + i as f32 / 64.0;
        y = aether::ops::activation::leaky_relu(&y, alpha).unwrap();
        host.iter_mut()
            .for_each(|v| *v = if *v > 0.0 { *v } else { alpha * *v });
    }
    y
}

/// Work recorded after the host waited for the GPU is submitted early as it
/// grows: after 8 dispatches, then 16 more, ... Once the host submits without
/// waiting, the GPU is busy and what follows is one submission again. The
/// results are those of the kernels run in order either way.
#[test]
fn work_recorded_after_a_wait_is_submitted_early_until_the_next_submission() {
    let Some(ctx) = own_context(&test_gpu_options()) else {
        return;
    };
    let device = Device::Gpu(ctx.clone());
    let mut expected = Rng::fresh().vec(1000);
    let x = Tensor::from_f32(vec![1000], expected.clone(), &device).unwrap();
    ctx.flush();
    ctx.wait_idle().unwrap();
    let before = ctx.submission_count();
    let y = leaky_chain(&x, 30, &mut expected);
    assert_eq!(
        ctx.submission_count() - before,
        2,
        "30 dispatches: after 8 and 24"
    );
    ctx.flush();
    let before = ctx.submission_count();
    let z = leaky_chain(&y, 40, &mut expected);
    ctx.flush();
    assert_eq!(
        ctx.submission_count() - before,
        1,
        "recorded while the GPU is busy"
    );
    assert_eq!(z.to_vec_f32().unwrap(), expected);
}

#[test]
fn a_step_is_recorded_into_one_submission() {
    let Some(ctx) = own_context(&test_gpu_options()) else {
        return;
    };
    let device = Device::Gpu(ctx.clone());
    let data = Rng::fresh().vec(300);
    let x = Tensor::from_f32(vec![300], data, &device).unwrap();
    let (submissions, dispatches) = (ctx.submission_count(), ctx.dispatch_count());
    let y =
        aether::ops::relu(&aether::ops::relu(&aether::ops::relu(&x).unwrap()).unwrap()).unwrap();
    y.to_vec_f32().unwrap();
    assert_eq!(ctx.dispatch_count() - dispatches, 3);
    assert_eq!(
        ctx.submission_count() - submissions,
        1,
        "three kernels and a read back in one submission"
    );
}

/// A context of its own with timestamp queries and `values` on its device;
/// `None` (after a skip line) without them.
fn timed_context(values: &[f32]) -> Option<(Arc<GpuContext>, Tensor)> {
    let ctx = own_context(&test_gpu_options())?;
    if !ctx.caps().timestamps {
        skip("adapter has no timestamp queries");
        return None;
    }
    let device = Device::Gpu(ctx.clone());
    let x = Tensor::from_f32(vec![values.len()], values.to_vec(), &device).unwrap();
    Some((ctx, x))
}

#[test]
fn timestamp_queries_time_each_dispatch() {
    let Some((ctx, x)) = timed_context(&Rng::fresh().vec(4096)) else {
        return;
    };
    let (_, times) = ctx
        .timed(8, || {
            let y = aether::ops::relu(&x)?;
            aether::ops::relu(&y)
        })
        .unwrap();
    let labels: Vec<_> = times.iter().map(|t| t.label).collect();
    assert_eq!(labels, ["relu", "relu"]);
    assert!(times.iter().all(|t| t.nanos.is_finite() && t.nanos >= 0.0));
    report(&format!("[aether-test] relu x4096 GPU times: {times:?}"));
}

/// A timed span puts its dispatches back to back in one compute pass and
/// times the pass: one positive time for 30 dependent kernels whose results
/// are still right, in one submission with its timestamps' read back; 0 for
/// no dispatch; an error where a read back splits the pass.
#[test]
fn a_timed_span_times_its_dispatches_back_to_back() {
    let mut expected = Rng::fresh().vec(4096);
    let Some((ctx, x)) = timed_context(&expected) else {
        return;
    };
    ctx.flush();
    let (submissions, dispatches) = (ctx.submission_count(), ctx.dispatch_count());
    let (y, nanos) = ctx
        .timed_span(|| Ok(leaky_chain(&x, 30, &mut expected)))
        .unwrap();
    assert_eq!(ctx.dispatch_count() - dispatches, 30);
    assert!(
        nanos.is_finite() && nanos > 0.0,
        "span of 30 kernels: {nanos} ns"
    );
    assert_eq!(y.to_vec_f32().unwrap(), expected);
    // One submission for the span (and its timestamps' read back), one for y's.
    assert_eq!(ctx.submission_count() - submissions, 2);
    assert_eq!(ctx.timed_span(|| Ok(())).unwrap().1, 0.0);
    let split = ctx.timed_span(|| {
        let y = aether::ops::relu(&x)?;
        y.to_vec_f32()?;
        aether::ops::relu(&y)
    });
    let err = split.unwrap_err().to_string();
    assert!(err.contains("split its compute pass"), "{err}");
    report(&format!(
        "[aether-test] 30 leaky ReLUs x4096 back to back: {nanos} ns"
    ));
}

/// Two training steps and a prediction of a small model that runs every
/// parameterised kernel family (conv, batch norm, pooling, dense, loss, Adam).
fn train_small_model(device: &Device) -> (Vec<f32>, Vec<f32>) {
    let (x, y) = aether::data::synthetic_images(4, 6, 6, 3).expect("synthetic images");
    // The model's 3 classes.
    let y: Vec<u32> = y.iter().map(|label| label % 3).collect();
    let mut model = Model::new().seed(7);
    model
        .add(Conv2d::new(5, (3, 3), Padding::Same))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(ReLU::default())
        .add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
        .add(GlobalAvgPool::default())
        .add(Dense::new(3));
    let mut model = common::ready_model(model, device, &[6, 6, 3]);
    let mut losses = Vec::new();
    for _ in 0..2 {
        let (loss, _) = model.train_batch(&x, &y).unwrap();
        losses.extend(loss.to_vec_f32().unwrap());
    }
    (losses, model.predict(&x, 4, true).unwrap())
}

#[test]
fn parameters_in_immediates_and_in_uniform_buffers_give_the_same_results() {
    let Some(with) = own_context(&test_gpu_options()) else {
        return;
    };
    let without = own_context(&GpuOptions {
        disable_immediates: true,
        ..test_gpu_options()
    })
    .unwrap();
    assert!(!without.caps().params_in_immediates());
    if !with.caps().params_in_immediates() {
        skip("adapter has too few immediate bytes; only the uniform path exists");
        return;
    }
    assert_train_alike(
        with,
        without,
        "the same kernels on the same adapter must agree bit for bit",
    );
}

#[test]
fn shaders_with_and_without_index_checks_give_the_same_results() {
    let Some(without) = own_context(&GpuOptions {
        shader_checks: false,
        ..test_gpu_options()
    }) else {
        return;
    };
    let with = own_context(&GpuOptions {
        shader_checks: true,
        ..test_gpu_options()
    })
    .unwrap();
    assert_train_alike(
        without,
        with,
        "naga's index clamping must change no result: an index it would clamp is a bug",
    );
}

/// Trains the small model on `a` and on `b`: finite losses and predictions,
/// the same bit for bit (`why` says why they must be).
fn assert_train_alike(a: Arc<GpuContext>, b: Arc<GpuContext>, why: &str) {
    let a = train_small_model(&Device::Gpu(a));
    let b = train_small_model(&Device::Gpu(b));
    assert!(a.0.iter().chain(&a.1).all(|v| v.is_finite()));
    assert_eq!(a, b, "{why}");
}

#[test]
fn cpu_preference_never_opens_an_adapter_and_unknown_filter_is_an_error() {
    let device = Device::with_preference(DevicePreference::Cpu, &GpuOptions::default()).unwrap();
    assert!(matches!(device, Device::Cpu));
    let options = GpuOptions {
        adapter_filter: Some("no-such-adapter-xyz".into()),
        ..GpuOptions::default()
    };
    for preference in [DevicePreference::Auto, DevicePreference::Gpu] {
        let err = Device::with_preference(preference, &options)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no-such-adapter-xyz"), "{err}");
    }
}
