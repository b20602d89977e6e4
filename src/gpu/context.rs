//! The GPU context: one adapter, its device and queue, its capabilities, the
//! pipeline cache and the buffer pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::batch::Batch;
use super::bind_groups::BindGroupCache;
use super::caps::{GpuCapabilities, check_requirements};
use super::faults::Faults;
use super::options::GpuOptions;
use super::pipelines::PipelineCache;
use super::pool::BufferPool;
use crate::conv::tune::TunedPlans;
use crate::conv::{ConvDirection, ConvShapeMeta, ConvTuning};
use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};

/// The next [`GpuContext::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// How long [`GpuContext::wait_idle`] polls before it blocks in the driver.
const WAIT_SPIN: Duration = Duration::from_millis(50);

/// Everything aether needs to run kernels on one adapter. Shared as `Arc<GpuContext>`.
pub struct GpuContext {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    caps: GpuCapabilities,
    pipelines: PipelineCache,
    pool: BufferPool,
    batch: Mutex<Batch>,
    bind_groups: BindGroupCache,
    faults: Arc<Faults>,
    /// The conv planner's tuning overrides, from the options it was made with.
    conv_tuning: ConvTuning,
    /// Whether conv plans are chosen by timing ([`GpuOptions::tune_convs`]),
    /// and the choices measured so far.
    tune_convs: bool,
    tuned_plans: TunedPlans,
    /// Unique among the process's contexts: what a cache of anything made
    /// for one context (conv launch plans) keys it by.
    id: u64,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.caps.adapter_name)
            .finish_non_exhaustive()
    }
}

/// Orders adapters: discrete over integrated over virtual over CPU emulation.
fn device_type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

impl GpuContext {
    /// Opens the best adapter allowed by `options`, or `Ok(None)` when no adapter
    /// matches. Adapters come from the primary backends (Vulkan, Metal, DX12).
    pub fn new(options: &GpuOptions) -> Result<Option<Arc<Self>>> {
        Self::best_adapter(options)
            .map(|adapter| Self::with_adapter(adapter, options))
            .transpose()
    }

    /// The best adapter allowed by `options` (discrete over integrated over
    /// virtual over CPU emulation), unopened.
    pub(crate) fn best_adapter(options: &GpuOptions) -> Option<wgpu::Adapter> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::PRIMARY;
        let instance = wgpu::Instance::new(desc.with_env());
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
        if let Some(filter) = &options.adapter_filter {
            let filter = filter.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&filter));
        }
        // An adapter that cannot run the kernels is passed over, announced.
        adapters.retain(|a| match check_requirements(a, &a.limits()) {
            Ok(()) => true,
            Err(e) => {
                warn_once(
                    &format!("unsuitable:{}", a.get_info().name),
                    &format!("passing over an adapter: {e}"),
                );
                false
            }
        });
        adapters.sort_by_key(|a| device_type_rank(a.get_info().device_type));
        adapters.into_iter().next()
    }

    pub(crate) fn with_adapter(adapter: wgpu::Adapter, options: &GpuOptions) -> Result<Arc<Self>> {
        let info = adapter.get_info();
        let features = adapter.features()
            & GpuCapabilities::wanted_features(!options.disable_coop, !options.disable_immediates);
        let experimental = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            // SAFETY: aether only uses the cooperative-matrix feature through shaders that
            // are validated by naga and tested against the CPU reference on every variant.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        // The defaults cap storage bindings at 128 MiB; big batches need the real limits.
        let limits = options.limits(adapter.limits());
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("aether"),
            required_features: features,
            required_limits: options.device_limits(&limits),
            experimental_features: experimental,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|source| AetherError::RequestDevice {
            adapter: info.name.clone(),
            source,
        })?;
        Self::assemble(&adapter, device, queue, features, limits, options)
    }

    /// Runs aether on a device the application created (to render with it,
    /// or to share it with other GPU work): nothing is requested, the device's
    /// own features and limits are what the kernels choose between, as
    /// [`GpuContext::new`] does with the features it asks for. `adapter` must
    /// be the one `device` was requested from.
    ///
    /// Refused with [`AetherError::DeviceRequirement`] when the adapter has no
    /// compute shaders or the device was requested with a limit below
    /// [`REQUIRED_LIMITS`](super::REQUIRED_LIMITS), naming it. Every feature
    /// is optional: without `SHADER_F16` the kernels run in f32, without
    /// `SUBGROUP` or `EXPERIMENTAL_COOPERATIVE_MATRIX` they take the portable
    /// GEMM, and without `IMMEDIATES` parameters travel in uniform buffers.
    ///
    /// aether installs its own device-lost callback and uncaptured-error
    /// handler on `device` (they turn faults into typed errors); an app that
    /// wants its own should wrap its calls in error scopes. `options` apply
    /// except `adapter_filter` and `fail_allocations_over`, which choose and
    /// request a device.
    pub fn from_wgpu(
        adapter: &wgpu::Adapter,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        options: &GpuOptions,
    ) -> Result<Arc<Self>> {
        let features = device.features()
            & GpuCapabilities::wanted_features(!options.disable_coop, !options.disable_immediates);
        let limits = options.limits(device.limits());
        Self::assemble(
            adapter,
            device.clone(),
            queue.clone(),
            features,
            limits,
            options,
        )
    }

    /// The context of `device`, which has `features` (those aether uses) and
    /// works within `limits`, after checking it can run aether's kernels.
    fn assemble(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        features: wgpu::Features,
        limits: wgpu::Limits,
        options: &GpuOptions,
    ) -> Result<Arc<Self>> {
        let info = adapter.get_info();
        check_requirements(adapter, &limits)?;
        let faults = Faults::watch(&device);
        let coop_disabled = options.disable_coop
            && adapter
                .features()
                .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        let mut caps = GpuCapabilities::read(adapter, features, limits, coop_disabled);
        if info.backend == wgpu::Backend::Noop
            && caps.coop_matrix.is_empty()
            && features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            caps.coop_matrix = options.noop_coop_matrix.clone();
        }
        let pipelines = PipelineCache::new(
            &device,
            &info,
            &caps,
            options.cache_dir.as_deref(),
            &options.break_kernels,
            options.shader_checks,
            options.record_shaders,
        );
        Ok(Arc::new(Self {
            device,
            queue,
            caps,
            pipelines,
            pool: BufferPool::default(),
            batch: Mutex::default(),
            bind_groups: BindGroupCache::default(),
            faults,
            conv_tuning: options.conv_tuning.clone(),
            tune_convs: options.tune_convs,
            tuned_plans: TunedPlans::open(options.cache_dir.as_deref(), &info),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }))
    }

    /// The conv planner's tuning overrides ([`GpuOptions::conv_tuning`]).
    pub fn conv_tuning(&self) -> &ConvTuning {
        &self.conv_tuning
    }

    /// The tuning a conv's `direction` at `meta` is planned with: the one
    /// measured fastest there ([`GpuOptions::tune_convs`]), else
    /// [`GpuContext::conv_tuning`]. Overrides set in the options win.
    pub fn plan_tuning(&self, direction: ConvDirection, meta: &ConvShapeMeta) -> ConvTuning {
        if self.conv_tuning.is_empty()
            && let Some(measured) = self.tuned_plans.get(direction, meta)
        {
            return measured;
        }
        self.conv_tuning.clone()
    }

    /// Whether conv plans are chosen by timing their candidates: asked for
    /// ([`GpuOptions::tune_convs`]) and no tuning override set.
    pub fn tunes_convs(&self) -> bool {
        self.tune_convs && self.conv_tuning.is_empty()
    }

    pub(crate) fn tuned_plans(&self) -> &TunedPlans {
        &self.tuned_plans
    }

    /// This context's id, unique in the process (never reused).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn caps(&self) -> &GpuCapabilities {
        &self.caps
    }

    pub(crate) fn bind_groups(&self) -> &BindGroupCache {
        &self.bind_groups
    }

    /// Cached bind groups built so far: once a training step repeats, this
    /// stops growing (the same pooled buffers meet the same pipelines).
    pub fn bind_groups_created(&self) -> usize {
        self.bind_groups.created()
    }

    #[doc(hidden)]
    pub fn pipelines(&self) -> &PipelineCache {
        &self.pipelines
    }

    #[doc(hidden)]
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    pub(crate) fn batch(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until all submitted work is done; a lost device or an error
    /// raised by that work is returned here.
    pub fn wait_idle(&self) -> Result<()> {
        // Poll in a loop first: a blocking wait can sleep in the driver for far
        // longer than the few milliseconds a training step takes to finish.
        let spin_until = Instant::now() + WAIT_SPIN;
        while Instant::now() < spin_until {
            match self.device.poll(wgpu::PollType::Poll) {
                Ok(status) if status.is_queue_empty() => return self.idle_after_wait(),
                Ok(_) => std::hint::spin_loop(),
                Err(_) => break,
            }
        }
        if let Err(e) = self.device.poll(wgpu::PollType::wait_indefinitely()) {
            self.check_faults("wait")?;
            return Err(AetherError::Gpu {
                during: "wait",
                message: e.to_string(),
            });
        }
        self.idle_after_wait()
    }

    fn idle_after_wait(&self) -> Result<()> {
        self.check_faults("wait")?;
        self.gpu_went_idle();
        self.pipelines.save_if_changed();
        Ok(())
    }

    /// `Err` once the device is lost ([`AetherError::DeviceLost`]), or when
    /// wgpu raised an error outside any error scope since the last check.
    pub fn check_faults(&self, during: &'static str) -> Result<()> {
        self.faults.check(during)
    }

    /// True once the device is lost.
    pub fn is_lost(&self) -> bool {
        self.faults.is_lost()
    }
}
