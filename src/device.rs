//! Where tensors live and kernels run: the pure-Rust CPU path or one GPU adapter.

use std::sync::Arc;

use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};
use crate::gpu::{DevicePreference, GpuContext, GpuOptions, device_preference_from_env};

/// What [`Device::with_preference`] runs on, given the best adapter found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    /// Open the best adapter.
    Adapter,
    /// The CPU path: there is no adapter, and none was demanded.
    CpuNoAdapter,
    /// The CPU path: the best adapter is a software one, and none was demanded.
    CpuOverSoftware,
    /// [`AetherError::NoAdapter`]: a GPU was demanded and none fits.
    NoAdapter,
}

/// The ranking rule. A GPU is demanded by `AETHER_DEVICE=gpu` or by naming an
/// adapter (`AETHER_ADAPTER`): the user asked for that hardware, and silently
/// training on the CPU would hide its absence. Otherwise a software adapter
/// (wgpu's [`DeviceType::Cpu`](wgpu::DeviceType::Cpu): lavapipe, llvmpipe,
/// SwiftShader) ranks below the CPU path, which ran the CIFAR-10 example 63x
/// faster than lavapipe on the same 2 cores (issue 38).
fn choose(
    preference: DevicePreference,
    adapter_named: bool,
    best: Option<wgpu::DeviceType>,
) -> Choice {
    let demanded = preference == DevicePreference::Gpu || adapter_named;
    match best {
        None if demanded => Choice::NoAdapter,
        None => Choice::CpuNoAdapter,
        Some(wgpu::DeviceType::Cpu) if !demanded => Choice::CpuOverSoftware,
        Some(_) => Choice::Adapter,
    }
}

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
    /// auto) and, for GPUs, [`GpuOptions::from_env`]. Auto takes the best
    /// hardware adapter (discrete over integrated) and otherwise the CPU path,
    /// with one `[aether]` line saying why: a software adapter (lavapipe,
    /// llvmpipe, SwiftShader) runs a model many times slower than the CPU path,
    /// so auto never picks one; `AETHER_DEVICE=gpu` or `AETHER_ADAPTER` still do.
    ///
    /// ```
    /// // Reads AETHER_DEVICE; with it unset, a GPU if there is one, else the CPU path.
    /// let device = aether::Device::best()?;
    /// println!("training on {}", device.name());
    /// # Ok::<(), aether::AetherError>(())
    /// ```
    pub fn best() -> Result<Self> {
        Self::with_preference(device_preference_from_env()?, &GpuOptions::from_env()?)
    }

    /// The best GPU adapter allowed by the environment, software ones included,
    /// or [`AetherError::NoAdapter`].
    pub fn gpu() -> Result<Self> {
        Self::with_preference(DevicePreference::Gpu, &GpuOptions::from_env()?)
    }

    /// Device selection with explicit settings instead of the environment.
    pub fn with_preference(preference: DevicePreference, options: &GpuOptions) -> Result<Self> {
        if preference == DevicePreference::Cpu {
            return Ok(Self::Cpu);
        }
        let adapter = GpuContext::best_adapter(options);
        let info = adapter.as_ref().map(|a| a.get_info());
        let choice = choose(
            preference,
            options.adapter_filter.is_some(),
            info.as_ref().map(|i| i.device_type),
        );
        match (choice, adapter) {
            (Choice::Adapter, Some(adapter)) => {
                Ok(Self::Gpu(GpuContext::with_adapter(adapter, options)?))
            }
            (Choice::CpuOverSoftware, _) => {
                let name = info.map(|i| i.name).unwrap_or_default();
                warn_once(
                    "software-adapter",
                    &format!(
                        "the only adapter is a software one ({name}), slower than the CPU path; \
                         running on the CPU path (AETHER_DEVICE=gpu takes the adapter, \
                         AETHER_DEVICE=cpu silences this)"
                    ),
                );
                Ok(Self::Cpu)
            }
            (Choice::CpuNoAdapter, _) => {
                warn_once(
                    "no-adapter",
                    "no GPU adapter found; running on the CPU path (set AETHER_DEVICE=cpu to silence)",
                );
                Ok(Self::Cpu)
            }
            (Choice::NoAdapter | Choice::Adapter, _) => Err(AetherError::NoAdapter {
                filter: options.adapter_filter.clone(),
            }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::DeviceType;

    #[test]
    fn auto_ranks_a_software_adapter_below_the_cpu_path() {
        let auto = DevicePreference::Auto;
        assert_eq!(
            choose(auto, false, Some(DeviceType::Cpu)),
            Choice::CpuOverSoftware
        );
        for hardware in [
            DeviceType::DiscreteGpu,
            DeviceType::IntegratedGpu,
            DeviceType::VirtualGpu,
            DeviceType::Other,
        ] {
            assert_eq!(choose(auto, false, Some(hardware)), Choice::Adapter);
        }
        assert_eq!(choose(auto, false, None), Choice::CpuNoAdapter);
    }

    #[test]
    fn a_demanded_gpu_takes_a_software_adapter_or_fails() {
        let gpu = DevicePreference::Gpu;
        assert_eq!(choose(gpu, false, Some(DeviceType::Cpu)), Choice::Adapter);
        assert_eq!(choose(gpu, false, None), Choice::NoAdapter);
        // A named adapter is demanded hardware even in auto mode.
        let auto = DevicePreference::Auto;
        assert_eq!(choose(auto, true, Some(DeviceType::Cpu)), Choice::Adapter);
        assert_eq!(choose(auto, true, None), Choice::NoAdapter);
    }
}
