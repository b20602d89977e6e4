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

impl DxStorage<'_> {
    pub fn plain(dtype: DType) -> Self {
        Self {
            dtype,
            saturation_flag: None,
        }
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
