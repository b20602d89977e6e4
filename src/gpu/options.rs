//! How a GPU context is chosen and configured, from code or from the environment.

use std::path::PathBuf;

use crate::conv::ConvTuning;
use crate::error::{AetherError, Result};

/// Which device `Device::best()` should produce (`AETHER_DEVICE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevicePreference {
    /// The best hardware adapter, else the CPU path with one `[aether]`
    /// warning; a software adapter (lavapipe) ranks below the CPU path.
    Auto,
    /// Always the CPU path.
    Cpu,
    /// A GPU adapter, software ones included, or an error.
    Gpu,
}

impl DevicePreference {
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "gpu" => Ok(Self::Gpu),
            _ => Err(AetherError::InvalidEnv {
                var: "AETHER_DEVICE",
                value: value.to_owned(),
                expected: "one of cpu, gpu, auto",
            }),
        }
    }
}

/// Settings for creating a [`GpuContext`](super::GpuContext).
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Case-insensitive substring the adapter name must contain (`AETHER_ADAPTER`).
    pub adapter_filter: Option<String>,
    /// Do not use cooperative matrices even when present (`AETHER_DISABLE_COOP=1`).
    pub disable_coop: bool,
    /// Pass kernel parameters in uniform buffers even where the adapter has
    /// immediates (`AETHER_DISABLE_IMMEDIATES=1`): the path adapters without
    /// them take, kept testable.
    pub disable_immediates: bool,
    /// Keep naga's index clamping in every shader (`AETHER_SHADER_CHECKS=1`).
    /// By default it is left out on Vulkan, where the driver's robust buffer
    /// access bounds the buffer reads and writes (see `gpu::pipelines`).
    pub shader_checks: bool,
    /// Where compiled pipelines are persisted (`AETHER_CACHE_DIR`); `None` keeps
    /// them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Fault injection for tests of the fallback paths: kernels named here
    /// (`"kernel"` or `"kernel:variant"`) get invalid WGSL, so they really fail to
    /// compile and the caller's fallback runs.
    pub break_kernels: Vec<String>,
    /// Caps every buffer and storage binding at this many bytes, below the
    /// adapter's own limits: leaves memory to other applications, and lets
    /// tests reach the batch-splitting paths with small tensors.
    pub max_buffer_bytes: Option<u64>,
    /// Fault injection for tests of the allocation-failure path: the device
    /// refuses buffers over this many bytes while aether's own checks keep the
    /// adapter's limits, so such an allocation really fails inside wgpu, in an
    /// error scope, as a driver out of memory would.
    pub fail_allocations_over: Option<u64>,
    /// Keeps every WGSL module the context builds, for
    /// [`PipelineCache::built_shaders`](super::PipelineCache::built_shaders):
    /// the portability test translates them for every backend.
    pub record_shaders: bool,
    /// The conv planner's tuning overrides (sweeps, comparisons): empty by
    /// default; [`GpuOptions::from_env`] takes the `AETHER_*` tuning
    /// variables set in the environment (docs/tuning.md).
    pub conv_tuning: ConvTuning,
    /// Choose each conv's plans by timing the candidates at the first step
    /// of a shape, and keep the fastest beside the pipeline cache
    /// (`AETHER_TUNE_CONVS=1`; off by default: it lengthens that first step
    /// by the candidates' compiles and timings; docs/tuning.md).
    pub tune_convs: bool,
    /// On wgpu's noop backend only (nothing executes; ignored on every real
    /// one): the cooperative-matrix configurations to plan with, which that
    /// backend does not report, so tests can plan, compile and record an
    /// H100's coop kernels at any shape without one.
    #[doc(hidden)]
    pub noop_coop_matrix: Vec<super::CoopMatrixConfig>,
}

impl GpuOptions {
    /// Reads `AETHER_ADAPTER`, `AETHER_DISABLE_COOP`, `AETHER_DISABLE_IMMEDIATES`,
    /// `AETHER_SHADER_CHECKS` and `AETHER_CACHE_DIR`
    /// (default: `<user cache dir>/aether`).
    pub fn from_env() -> Result<Self> {
        let adapter_filter = std::env::var("AETHER_ADAPTER")
            .ok()
            .filter(|s| !s.trim().is_empty());
        let disable_coop = match std::env::var("AETHER_DISABLE_COOP") {
            Err(_) => false,
            Ok(v) => parse_flag("AETHER_DISABLE_COOP", &v)?,
        };
        let disable_immediates = match std::env::var("AETHER_DISABLE_IMMEDIATES") {
            Err(_) => false,
            Ok(v) => parse_flag("AETHER_DISABLE_IMMEDIATES", &v)?,
        };
        let shader_checks = match std::env::var("AETHER_SHADER_CHECKS") {
            Err(_) => false,
            Ok(v) => parse_flag("AETHER_SHADER_CHECKS", &v)?,
        };
        let tune_convs = match std::env::var("AETHER_TUNE_CONVS") {
            Err(_) => false,
            Ok(v) => parse_flag("AETHER_TUNE_CONVS", &v)?,
        };
        let cache_dir = match std::env::var_os("AETHER_CACHE_DIR") {
            Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
            _ => dirs::cache_dir().map(|d| d.join("aether")),
        };
        Ok(Self {
            adapter_filter,
            disable_coop,
            disable_immediates,
            shader_checks,
            cache_dir,
            break_kernels: Vec::new(),
            max_buffer_bytes: None,
            fail_allocations_over: None,
            record_shaders: false,
            conv_tuning: ConvTuning::from_env(),
            tune_convs,
            noop_coop_matrix: Vec::new(),
        })
    }

    /// The limits aether works within on an adapter with `adapter` limits:
    /// those, with buffers capped by [`max_buffer_bytes`](Self::max_buffer_bytes).
    pub fn limits(&self, adapter: wgpu::Limits) -> wgpu::Limits {
        let Some(cap) = self.max_buffer_bytes else {
            return adapter;
        };
        wgpu::Limits {
            max_buffer_size: adapter.max_buffer_size.min(cap),
            max_storage_buffer_binding_size: adapter.max_storage_buffer_binding_size.min(cap),
            ..adapter
        }
    }

    /// The limits the device is requested with: `limits`, lowered further by
    /// [`fail_allocations_over`](Self::fail_allocations_over).
    pub(crate) fn device_limits(&self, limits: &wgpu::Limits) -> wgpu::Limits {
        let mut device = limits.clone();
        if let Some(bytes) = self.fail_allocations_over {
            device.max_buffer_size = device.max_buffer_size.min(bytes);
            device.max_storage_buffer_binding_size =
                device.max_storage_buffer_binding_size.min(bytes);
        }
        device
    }
}

/// `AETHER_DEVICE` from the environment; unset means [`DevicePreference::Auto`].
pub fn device_preference_from_env() -> Result<DevicePreference> {
    match std::env::var("AETHER_DEVICE") {
        Err(_) => Ok(DevicePreference::Auto),
        Ok(v) => DevicePreference::parse(&v),
    }
}

fn parse_flag(var: &'static str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" => Ok(false),
        "1" | "true" | "yes" => Ok(true),
        _ => Err(AetherError::InvalidEnv {
            var,
            value: value.to_owned(),
            expected: "1 or 0",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_preference_parses_known_values_and_rejects_others() {
        assert_eq!(
            DevicePreference::parse("CPU").unwrap(),
            DevicePreference::Cpu
        );
        assert_eq!(
            DevicePreference::parse("gpu").unwrap(),
            DevicePreference::Gpu
        );
        assert_eq!(DevicePreference::parse("").unwrap(), DevicePreference::Auto);
        let err = DevicePreference::parse("cuda").unwrap_err().to_string();
        assert!(
            err.contains("AETHER_DEVICE") && err.contains("cuda"),
            "{err}"
        );
    }

    #[test]
    fn flags_reject_unknown_values() {
        assert!(parse_flag("AETHER_DISABLE_COOP", "1").unwrap());
        assert!(!parse_flag("AETHER_DISABLE_COOP", "0").unwrap());
        assert!(parse_flag("AETHER_DISABLE_COOP", "maybe").is_err());
    }
}
