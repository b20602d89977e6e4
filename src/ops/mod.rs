//! Elementwise operations shared by the layers.

pub mod activation;
pub mod arith;
pub mod augment;
pub mod batchnorm;
pub mod concat;
pub mod dropout;
pub mod loss;
pub mod pool;
mod relu;

pub use relu::relu;

use crate::error::{AetherError, Result};
use crate::tensor::{DType, Tensor};

/// How a backward stores its input gradient (BatchNorm's, a max pool's) and,
/// on the GPU, the loss scaler's state whose overflow flag an f16 one raises
/// where it saturates, as the scaler's own check of that gradient would
/// (shaders/ops/batchnorm_grad_flag.wgsl, pool_grad_flag.wgsl; the model then
/// skips the check).
#[derive(Clone, Copy)]
pub(crate) struct DxStorage<'a> {
    pub dtype: DType,
    pub saturation_flag: Option<&'a Tensor>,
}

impl<'a> DxStorage<'a> {
    pub fn plain(dtype: DType) -> Self {
        Self {
            dtype,
            saturation_flag: None,
        }
    }

    /// The scaler to flag, checked to be on `like`'s device.
    pub fn flag_beside(&self, op: &'static str, like: &Tensor) -> Result<Option<&'a Tensor>> {
        match self.saturation_flag {
            Some(scaler) if !scaler.device().same_as(&like.device()) => {
                Err(AetherError::DeviceMismatch {
                    op,
                    a: like.device().name(),
                    b: scaler.device().name(),
                })
            }
            flag => Ok(flag),
        }
    }
}

/// Whether an op asked to store a result (`what`: "output", "dx as") as
/// `dtype` stores f16: false for F32, and for anything but F32 and F16 a
/// typed error naming `op` and `shape`.
pub(crate) fn stores_f16(
    op: &'static str,
    shape: &[usize],
    what: &str,
    dtype: DType,
) -> Result<bool> {
    match dtype {
        DType::F32 => Ok(false),
        DType::F16 => Ok(true),
        other => Err(AetherError::InvalidShape {
            op,
            shape: shape.to_vec(),
            reason: format!("{what} {other:?}: F32 or F16"),
        }),
    }
}

/// The GPU kernels count and index a tensor's elements in u32: one with more
/// is refused (reachable only where the binding limit passes 16 GiB).
pub(crate) fn require_u32_elements(op: &'static str, t: &Tensor) -> Result<()> {
    if u32::try_from(t.numel()).is_err() {
        return Err(AetherError::InvalidShape {
            op,
            shape: t.dims().to_vec(),
            reason: "more elements than a u32 index can address".into(),
        });
    }
    Ok(())
}
