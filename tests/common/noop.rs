//! Devices on wgpu's noop backend (nothing executes): the kernels aether
//! builds for an adapter, without the adapter.

use std::sync::Arc;

use aether::gpu::{GpuContext, GpuOptions, REQUIRED_LIMITS, with_required_limits};

/// A device on wgpu's noop backend (no GPU; nothing executes) whose adapter
/// reports `features`, `limits` and subgroups of 32, requested with all of
/// them: aether's code runs there as on a GPU, without results.
pub fn noop_device(
    features: wgpu::Features,
    limits: wgpu::Limits,
) -> (wgpu::Adapter, wgpu::Device, wgpu::Queue) {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::NOOP;
    desc.backend_options.noop = wgpu::NoopBackendOptions {
        enable: true,
        limits: Some(limits.clone()),
        features: Some(features),
        device_type: Some(wgpu::DeviceType::Other),
        subgroup_min_size: Some(32),
        subgroup_max_size: Some(32),
    };
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("the noop adapter");
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("noop"),
        required_features: features,
        required_limits: limits,
        // SAFETY: nothing executes on the noop backend.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        ..Default::default()
    }))
    .expect("a noop device");
    (adapter, device, queue)
}

/// The features aether uses, all of them on the full device.
pub fn all_features() -> wgpu::Features {
    wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::IMMEDIATES
        | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
}

/// An H100's compute limits, as far as aether's planners read them.
pub fn full_limits() -> wgpu::Limits {
    wgpu::Limits {
        max_compute_workgroup_storage_size: 48 << 10,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroup_size_x: 1024,
        max_compute_workgroup_size_y: 1024,
        max_storage_buffer_binding_size: 1 << 31,
        max_buffer_size: 1 << 31,
        max_immediate_size: 128,
        // NVIDIA's Vulkan driver binds far more; BatchNorm's dx flagging
        // f16 saturation takes 10 (the least device: 9).
        max_storage_buffers_per_shader_stage: 16,
        ..with_required_limits(wgpu::Limits::default())
    }
}

/// The least limits aether accepts: a downlevel device raised to each
/// [`REQUIRED_LIMITS`] entry.
pub fn least_limits() -> wgpu::Limits {
    let mut limits = wgpu::Limits::downlevel_defaults();
    for required in REQUIRED_LIMITS {
        *required.field_mut(&mut limits) = required.least;
    }
    limits
}

/// A context on wgpu's noop backend with `features` and `limits`, keeping
/// every module it builds.
pub fn noop_context(features: wgpu::Features, limits: wgpu::Limits) -> Arc<GpuContext> {
    noop_context_with(features, limits, GpuOptions::default())
}

/// [`noop_context`] with `options` (shaders recorded too).
pub fn noop_context_with(
    features: wgpu::Features,
    limits: wgpu::Limits,
    options: GpuOptions,
) -> Arc<GpuContext> {
    let (adapter, device, queue) = noop_device(features, limits);
    let options = GpuOptions {
        record_shaders: true,
        ..options
    };
    GpuContext::from_wgpu(&adapter, &device, &queue, &options).expect("aether accepts it")
}

/// An H100 as aether plans for it, on the noop backend: every feature, its
/// limits, and its 16x16x16 f16 cooperative matrices (which the noop
/// backend does not report), so the coop kernels are planned and compiled.
pub fn h100_like_context() -> Arc<GpuContext> {
    h100_like_context_with(GpuOptions::default())
}

/// [`h100_like_context`] with `options` (its matrices and recorded shaders
/// set).
pub fn h100_like_context_with(options: GpuOptions) -> Arc<GpuContext> {
    use wgpu::CooperativeScalarType::{F16, F32};
    let tile = |cr| aether::gpu::CoopMatrixConfig {
        m: 16,
        n: 16,
        k: 16,
        ab: F16,
        cr,
    };
    let options = GpuOptions {
        noop_coop_matrix: vec![tile(F16), tile(F32)],
        ..options
    };
    noop_context_with(all_features(), full_limits(), options)
}
