//! Where tensors live and kernels run: the pure-Rust CPU path or one GPU adapter.

use std::sync::Arc;

use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};
use crate::gpu::{DevicePreference, GpuContext, GpuOptions, device_preference_from_env};

/// A compute device. Cloning is cheap: GPU devices share one context.
#[derive(Clone, Debug)]
pub enum Device {
    /// The pure-Rust CPU path (multi-threaded with rayon).
    Cpu,
    /// A wgpu adapter.
    Gpu(Arc<GpuContext>),
}

impl Device {
    /// The device the environment asks for: `AETHER_DEVICE=cpu|gpu|auto` (default
    /// auto) and, for GPUs, [`GpuOptions::from_env`]. Auto takes the best adapter
    /// (discrete over integrated over CPU emulation) and falls back to the CPU
    /// path with one `[aether]` warning when there is none.
    pub fn best() -> Result<Self> {
        Self::with_preference(device_preference_from_env()?, &GpuOptions::from_env()?)
    }

    /// The best GPU adapter allowed by the environment, or [`AetherError::NoAdapter`].
    pub fn gpu() -> Result<Self> {
        Self::with_preference(DevicePreference::Gpu, &GpuOptions::from_env()?)
    }

    /// Device selection with explicit settings instead of the environment.
    pub fn with_preference(preference: DevicePreference, options: &GpuOptions) -> Result<Self> {
        if preference == DevicePreference::Cpu {
            return Ok(Self::Cpu);
        }
        match GpuContext::new(options)? {
            Some(ctx) => Ok(Self::Gpu(ctx)),
            // A named adapter that is absent is an error even in auto mode: the user
            // asked for that hardware, and silently training on the CPU would hide it.
            None if preference == DevicePreference::Gpu || options.adapter_filter.is_some() => {
                Err(AetherError::NoAdapter {
                    filter: options.adapter_filter.clone(),
                })
            }
            None => {
                warn_once(
                    "no-adapter",
                    "no GPU adapter found; running on the CPU path (set AETHER_DEVICE=cpu to silence)",
                );
                Ok(Self::Cpu)
            }
        }
    }

    /// aether on a wgpu device the application already has (to render with
    /// it, or to share it with other GPU work), with the environment's
    /// [`GpuOptions::from_env`] (its `AETHER_ADAPTER` does not apply). See
    /// [`GpuContext::from_wgpu`] for what is checked and what aether installs
    /// on the device; a device that cannot run aether's kernels is an
    /// [`AetherError::DeviceRequirement`] naming the missing limit.
    pub fn from_wgpu(
        adapter: &wgpu::Adapter,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
    ) -> Result<Self> {
        let options = GpuOptions::from_env()?;
        GpuContext::from_wgpu(adapter, device, queue, &options).map(Self::Gpu)
    }

    /// The GPU context, if this is a GPU device.
    pub fn gpu_context(&self) -> Option<&Arc<GpuContext>> {
        match self {
            Self::Cpu => None,
            Self::Gpu(ctx) => Some(ctx),
        }
    }

    /// Short name for logs: `cpu` or the adapter name.
    pub fn name(&self) -> String {
        match self {
            Self::Cpu => "cpu".to_owned(),
            Self::Gpu(ctx) => ctx.caps().adapter_name.clone(),
        }
    }

    /// True when both handles refer to the same device.
    pub fn same_as(&self, other: &Device) -> bool {
        match (self, other) {
            (Self::Cpu, Self::Cpu) => true,
            (Self::Gpu(a), Self::Gpu(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}
