//! The one error type of the crate: every fallible public call returns [`Result`].

use std::path::PathBuf;

/// Errors aether reports instead of panicking or producing garbage.
#[derive(Debug, thiserror::Error)]
pub enum AetherError {
    /// An environment variable holds a value aether does not understand.
    #[error("environment variable {var}={value:?} is not valid: expected {expected}")]
    InvalidEnv {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A hyperparameter outside the range its formula allows (NaN included),
    /// refused before it can train a model into NaNs or into a file that
    /// cannot be loaded back.
    #[error("{name} = {value} is not valid: expected {expected}")]
    InvalidHyperparameter {
        name: &'static str,
        value: f32,
        expected: &'static str,
    },
    /// A GPU was demanded (explicitly or by `AETHER_DEVICE=gpu`) but none fits.
    #[error("no GPU adapter available{}", filter.as_ref().map(|f| format!(" matching AETHER_ADAPTER={f:?}")).unwrap_or_default())]
    NoAdapter { filter: Option<String> },
    /// The adapter refused to create a device.
    #[error("could not create a device on adapter {adapter:?}: {source}")]
    RequestDevice {
        adapter: String,
        #[source]
        source: wgpu::RequestDeviceError,
    },
    /// A device cannot run aether's kernels: it lacks a capability or was
    /// requested with a limit below [`REQUIRED_LIMITS`](crate::gpu::REQUIRED_LIMITS).
    #[error(
        "the device on adapter {adapter:?} cannot run aether: {requirement} is {actual}, aether needs {needed}"
    )]
    DeviceRequirement {
        adapter: String,
        requirement: &'static str,
        needed: String,
        actual: String,
    },
    /// A tensor's data length does not match its shape.
    #[error("tensor of shape {shape:?} needs {expected} elements, got {actual}")]
    DataLength {
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    /// Two shapes that must agree do not.
    #[error("{op}: shape {actual:?} does not match expected {expected:?}")]
    ShapeMismatch {
        op: &'static str,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    /// A shape is unusable (zero-sized dimension, wrong rank, too large).
    #[error("{op}: invalid shape {shape:?}: {reason}")]
    InvalidShape {
        op: &'static str,
        shape: Vec<usize>,
        reason: String,
    },
    /// Operands live on different devices.
    #[error("{op}: operands are on different devices ({a} and {b})")]
    DeviceMismatch {
        op: &'static str,
        a: String,
        b: String,
    },
    /// A buffer is larger than the adapter can bind.
    #[error("{what} needs {bytes} bytes, more than the adapter's limit of {limit} bytes")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    /// A dispatch needs more workgroups along one dimension than the adapter
    /// launches.
    #[error(
        "{what} needs {workgroups} workgroups along one dimension, more than the adapter's limit of {limit}"
    )]
    TooManyWorkgroups {
        what: String,
        workgroups: u64,
        limit: u64,
    },
    /// A kernel has no variant that compiled on this adapter.
    #[error("kernel {kernel}: no variant usable on adapter {adapter:?}: {reasons}")]
    NoKernelVariant {
        kernel: &'static str,
        adapter: String,
        reasons: String,
    },
    /// The GPU failed while running or reading back work.
    #[error("GPU error during {during}: {message}")]
    Gpu {
        during: &'static str,
        message: String,
    },
    /// The GPU device is gone (driver reset, GPU removed, device destroyed):
    /// nothing more runs on it and the tensors on it are lost. Files already
    /// written, such as checkpoints, are untouched.
    #[error("GPU device lost during {during}: {reason}")]
    DeviceLost {
        during: &'static str,
        reason: String,
    },
    /// The GPU could not allocate a buffer: out of memory, or a size the driver
    /// refuses.
    #[error("could not allocate {what} ({bytes} bytes) on the GPU: {message}")]
    Allocation {
        what: String,
        bytes: u64,
        message: String,
    },
    /// A model file that cannot be used: truncated, malformed, another
    /// architecture, or a tensor of the wrong shape (named in `reason`).
    #[error("model file {path}: {reason}", path = path.display())]
    ModelFile { path: PathBuf, reason: String },
    /// A model used before `configure` / `finalize`, or configured inconsistently.
    #[error("model: {0}")]
    Model(String),
    /// Training diverged: the loss of step `step` (counting from 1) is not
    /// finite. That step and every later one changed nothing; the model keeps
    /// its state from before it.
    #[error(
        "non-finite loss {loss} at step {step} (epoch {epoch}): training stopped; the model \
         keeps its state from before that step"
    )]
    NonFiniteLoss { step: u64, epoch: usize, loss: f32 },
    /// A training step whose loss or gradients were not finite, where the
    /// loss value is not at hand (a gradient overflowed, or the step came from
    /// `train_batch` / `train_tensors`): that step and every later one
    /// changed nothing; the model keeps its state from before it.
    #[error(
        "non-finite loss or gradient at step {step}: the step and the {later} after it changed \
         nothing; the model keeps its state from before it"
    )]
    NonFiniteStep { step: u64, later: u64 },
    /// A parameter group ([`crate::optim::ParamGroup`]) names a parameter
    /// of a layer that is not trainable ([`crate::Model::set_trainable`]):
    /// the group would set a learning rate nothing uses.
    #[error("parameter group {group} names {param}, which is frozen (set_trainable false)")]
    FrozenParameter { group: usize, param: String },
    /// A dataset file that cannot be used: missing, truncated, malformed, or a
    /// record with a bad label (`record` counts from 0).
    #[error(
        "dataset file {path}{}: {reason}",
        record.map(|r| format!(", record {r}")).unwrap_or_default(),
        path = path.display()
    )]
    Dataset {
        path: PathBuf,
        record: Option<usize>,
        reason: String,
    },
    /// File system trouble, with the path involved.
    #[error("{action} {path}: {source}", path = path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Shorthand used across the crate.
pub type Result<T, E = AetherError> = std::result::Result<T, E>;

/// `Ok` where `valid`, else [`AetherError::InvalidHyperparameter`] naming
/// `name`, its `value` and the `expected` range.
pub(crate) fn check_hyperparameter(
    name: &'static str,
    value: f32,
    valid: bool,
    expected: &'static str,
) -> Result<()> {
    if valid {
        Ok(())
    } else {
        Err(AetherError::InvalidHyperparameter {
            name,
            value,
            expected,
        })
    }
}
