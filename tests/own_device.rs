//! aether on a wgpu device the app created ([`Device::from_wgpu`]): refused
//! with a typed error naming the limit when the device was requested below
//! [`REQUIRED_LIMITS`] (each one, on wgpu's noop backend, and on the GPU), trains and predicts like the CPU path when it has no
//! optional feature at all, and hands a tensor's buffer to the app's own
//! commands in the documented layout. And [`Model::predict_into`], the app's
//! per-frame inference: no GPU buffer, pipeline or bind group made after the
//! first call, and the output's memory reused.

mod common;

use aether::conv::Padding;
use aether::gpu::{GpuContext, GpuOptions, REQUIRED_LIMITS, RequiredLimit, with_required_limits};
use aether::nn::{BatchNorm, Conv2d, Dense, GlobalAvgPool, MaxPool2d, ReLU};
use aether::{AetherError, Device, Model, Tensor};
use common::{Rng, report};
use half::f16;

/// The adapter the test suite runs on, found as an app would find it; `None`
/// (after a visible skip) without one.
fn app_adapter() -> Option<wgpu::Adapter> {
    let name = common::gpu()?.name();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::PRIMARY;
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    let adapter = adapters.into_iter().find(|a| a.get_info().name == name);
    Some(adapter.expect("the adapter aether found"))
}

/// A device on `adapter` with `features` and `limits`, as an app requests it.
fn app_device(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    limits: wgpu::Limits,
) -> (wgpu::Device, wgpu::Queue) {
    pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("the app's device"),
        required_features: features,
        required_limits: limits,
        ..Default::default()
    }))
    .expect("the app's device")
}

#[test]
fn a_device_requested_below_a_required_limit_is_refused_naming_it() {
    let Some(adapter) = app_adapter() else { return };
    let full = adapter.limits();
    let lowered = [
        (
            "max_storage_buffers_per_shader_stage",
            wgpu::Limits {
                // WebGPU's default: one short of BatchNorm's backward.
                max_storage_buffers_per_shader_stage: 8,
                ..full.clone()
            },
        ),
        (
            "max_compute_workgroup_storage_size",
            wgpu::Limits {
                max_compute_workgroup_storage_size: 4096,
                ..full.clone()
            },
        ),
    ];
    for (limit, limits) in lowered {
        let actual = REQUIRED_LIMITS
            .iter()
            .find(|r| r.name == limit)
            .expect("a required limit")
            .of(&limits);
        let (device, queue) = app_device(&adapter, wgpu::Features::empty(), limits);
        let err = Device::from_wgpu(&adapter, &device, &queue).unwrap_err();
        assert!(
            matches!(&err, AetherError::DeviceRequirement { requirement, actual: a, .. }
                if *requirement == limit && *a == actual.to_string()),
            "{limit}: {err}"
        );
        let text = err.to_string();
        assert!(
            text.contains(limit) && text.contains(&adapter.get_info().name),
            "{text}"
        );
    }
}

#[test]
fn each_required_limit_one_below_is_refused_naming_it_without_a_gpu() {
    let least = |r: &RequiredLimit| {
        let mut limits = with_required_limits(wgpu::Limits::default());
        *r.field_mut(&mut limits) = r.least;
        limits
    };
    for required in REQUIRED_LIMITS {
        let (adapter, device, queue) =
            common::noop::noop_device(wgpu::Features::empty(), least(&required));
        let options = GpuOptions::default();
        GpuContext::from_wgpu(&adapter, &device, &queue, &options)
            .unwrap_or_else(|e| panic!("{} at its least: {e}", required.name));
        let mut below = least(&required);
        *required.field_mut(&mut below) -= 1;
        let (adapter, device, queue) = common::noop::noop_device(wgpu::Features::empty(), below);
        let err = GpuContext::from_wgpu(&adapter, &device, &queue, &options).unwrap_err();
        let want = (required.least - 1).to_string();
        assert!(
            matches!(&err, AetherError::DeviceRequirement { requirement, actual, .. }
                if *requirement == required.name && *actual == want),
            "{}: {err}",
            required.name
        );
    }
}

/// A small CNN with every kind of layer a CIFAR model has.
fn small_model() -> Model {
    let mut model = Model::new().seed(11);
    model
        .add(Conv2d::new(8, (3, 3), Padding::Same))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(ReLU::default())
        .add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
        .add(GlobalAvgPool::default())
        .add(Dense::new(3));
    model
}

#[test]
fn an_app_device_without_optional_features_trains_and_predicts_like_the_cpu() {
    let Some(adapter) = app_adapter() else { return };
    // WebGPU's defaults raised to aether's needs, and no feature: the f32
    // kernels in uniform-buffer form, read from the device, not the adapter.
    let limits = with_required_limits(wgpu::Limits::default());
    let (device, queue) = app_device(&adapter, wgpu::Features::empty(), limits.clone());
    let gpu = Device::from_wgpu(&adapter, &device, &queue).unwrap();
    let caps = gpu.gpu_context().unwrap().caps();
    assert!(!caps.shader_f16 && caps.subgroup_size.is_none() && caps.immediate_bytes == 0);
    assert_eq!(caps.limits, limits);
    let mut rng = Rng::fresh();
    let x = rng.vec(6 * 8 * 8 * 3);
    let y = [0, 2, 1, 1, 0, 2];
    let mut on = [(&Device::Cpu, small_model()), (&gpu, small_model())].map(|(d, m)| {
        let mut m = common::ready_model(m, d, &[8, 8, 3]);
        for _ in 0..3 {
            m.train_batch(&x, &y).unwrap();
        }
        m.predict(&x, 4, false).unwrap()
    });
    let [cpu, gpu] = &mut on;
    assert_eq!(cpu.len(), 6 * 3);
    let worst = cpu
        .iter()
        .zip(gpu.iter())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "GPU and CPU predictions differ by {worst}");
    assert!(
        cpu.iter().any(|&p| (p - 1.0 / 3.0).abs() > 1e-3),
        "untrained: {cpu:?}"
    );
}

/// Copies `bytes` of `buffer` from `offset` with the app's own encoder and
/// queue, and reads them back.
fn read_with_app_commands(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    buffer: &wgpu::Buffer,
    offset: u64,
    bytes: u64,
) -> Vec<u8> {
    let padded = bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("the app's staging"),
        size: padded,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, padded);
    queue.submit([encoder.finish()]);
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let data = staging.slice(..).get_mapped_range().unwrap()[..bytes as usize].to_vec();
    staging.unmap();
    data
}

#[test]
fn a_tensors_buffer_holds_its_values_in_the_documented_layout() {
    let Some(adapter) = app_adapter() else { return };
    let limits = with_required_limits(adapter.limits());
    let (device, queue) = app_device(
        &adapter,
        adapter.features() & wgpu::Features::SHADER_F16,
        limits,
    );
    let gpu = Device::from_wgpu(&adapter, &device, &queue).unwrap();
    assert!(
        Tensor::from_f32(vec![2], vec![1.0, 2.0], &Device::Cpu)
            .unwrap()
            .gpu_buffer()
            .is_none()
    );
    let mut rng = Rng::fresh();
    let values = rng.vec(2 * 3 * 5 * 7);
    let dims = vec![2, 3, 5, 7];
    // A kernel's output, still unsubmitted in aether's batch when asked for.
    let x = Tensor::from_f32(dims.clone(), values.clone(), &gpu).unwrap();
    let relu = aether::ops::relu(&x).unwrap();
    let buffer = relu.gpu_buffer().unwrap();
    assert_eq!(buffer.bytes, 4 * values.len() as u64);
    assert_eq!(buffer.offset % 256, 0);
    let bytes = read_with_app_commands(&device, &queue, buffer.buffer, buffer.offset, buffer.bytes);
    let read: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
    let want: Vec<f32> = values.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(read, want, "row-major f32, NHWC");
    if gpu.gpu_context().unwrap().caps().shader_f16 {
        let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
        let t = Tensor::from_f16(dims, halves.clone(), &gpu).unwrap();
        let b = t.gpu_buffer().unwrap();
        assert_eq!(b.bytes, 2 * values.len() as u64);
        let bytes = read_with_app_commands(&device, &queue, b.buffer, b.offset, b.bytes);
        assert_eq!(bytemuck::pod_collect_to_vec::<u8, f16>(&bytes), halves);
    } else {
        report("[aether-test] no SHADER_F16 on this adapter: the f16 layout is not checked");
    }
}

test_device!(
    predict_into_reuses_its_output_and_makes_nothing_after_the_first_call,
    |device: &Device| {
        let mut model = common::ready_model(small_model(), device, &[8, 8, 3]);
        let mut rng = Rng::fresh();
        let images: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(8 * 8 * 3)).collect();
        let mut out = Vec::new();
        model.predict_into(&images[0], 1, false, &mut out).unwrap();
        let ctx = device.gpu_context();
        let counts = || {
            ctx.map(|c| {
                (
                    c.pool().stats().created,
                    c.bind_groups_created(),
                    c.pipelines().compiled_count(),
                )
            })
        };
        let (first, memory) = (counts(), out.as_ptr());
        for image in &images {
            model.predict_into(image, 1, false, &mut out).unwrap();
            assert_eq!(out, model.predict(image, 1, false).unwrap());
            model.predict_into(image, 1, false, &mut out).unwrap();
            assert_eq!(out.as_ptr(), memory, "the output's memory was not reused");
        }
        assert_eq!(
            counts(),
            first,
            "(buffers, bind groups, pipelines) made after the first call"
        );
        assert_ne!(images[0], images[1]);
        let sums: Vec<f32> = out.chunks(3).map(|p| p.iter().sum()).collect();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
    }
);
