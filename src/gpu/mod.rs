//! The wgpu side of aether: context, capabilities, pipeline cache, buffer pool
//! and batched submission.

mod batch;
mod bind_groups;
mod caps;
mod context;
mod faults;
mod grid;
mod host_write;
mod options;
mod pipelines;
mod pool;
mod slice;

pub use batch::KernelTime;
pub use caps::{
    CoopMatrixConfig, GpuCapabilities, REQUIRED_LIMITS, RequiredLimit, coop_translates_to,
    with_required_limits,
};
pub use context::GpuContext;
#[doc(hidden)]
pub use grid::flat_grid;
pub(crate) use host_write::{in_jobs, write_f32s};
pub use options::{DevicePreference, GpuOptions, device_preference_from_env};
// Kernel plumbing: public for the tests, benches and examples that launch
// kernels of their own.
#[doc(hidden)]
pub use pipelines::{BuiltShader, PipelineCache, PipelineKey};
#[doc(hidden)]
pub use pool::{BufferPool, PoolStats, PooledBuffer};
#[doc(hidden)]
pub use slice::GpuSlice;
