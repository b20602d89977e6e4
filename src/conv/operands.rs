//! Checks and conversions of the tensors a conv kernel takes.

use std::borrow::Cow;

use super::plan::ConvVariant;
use crate::error::{AetherError, Result};
use crate::gpu::GpuSlice;
use crate::tensor::{DType, Tensor};

/// Checks that `t` has exactly `dims`, naming `what` in the error.
pub(crate) fn expect_dims(op: &'static str, t: &Tensor, dims: &[usize]) -> Result<()> {
    if t.dims() == dims {
        Ok(())
    } else {
        Err(AetherError::ShapeMismatch {
            op,
            expected: dims.to_vec(),
            actual: t.dims().to_vec(),
        })
    }
}

/// `t` in the operand type of `variant`: f32 inputs are cast to f16 for the
/// f16 variants, saturating at +-65504 as every f32 -> f16 conversion of aether
/// does (an overflow to inf would come out of the conv as inf or NaN); an f16
/// tensor cannot feed the f32 variant, and u32 tensors feed none.
pub(crate) fn gpu_operand(op: &'static str, t: &Tensor, variant: ConvVariant) -> Result<Tensor> {
    match (t.dtype(), variant.f16_operands()) {
        (DType::F32, true) => super::cast::cast_f16(t, true),
        (DType::F16, true) | (DType::F32, false) => Ok(t.clone()),
        (dtype, _) => Err(AetherError::InvalidShape {
            op,
            shape: t.dims().to_vec(),
            reason: format!("variant {} cannot take {dtype:?} operands", variant.name()),
        }),
    }
}

/// Declines `variant` for an operand of type `dtype` (shape `dims`) it cannot
/// take: an f16 operand (a layer's f16 weight shadow) only feeds the f16
/// variants. Types, not tensors: plans are made ahead of a step too.
pub(crate) fn accepts_dtype(variant: ConvVariant, dtype: DType, dims: &[usize]) -> Result<()> {
    if dtype == DType::F16 && !variant.f16_operands() {
        return Err(AetherError::InvalidShape {
            op: "conv operand",
            shape: dims.to_vec(),
            reason: format!("variant {} needs F32 operands, got F16", variant.name()),
        });
    }
    Ok(())
}

/// The values of a host tensor as f32 (f16 storage is widened).
pub(crate) fn host_values(t: &Tensor) -> Result<Cow<'_, [f32]>> {
    match t.host_f32() {
        Some(v) => Ok(Cow::Borrowed(v)),
        None => t.to_vec_f32().map(Cow::Owned),
    }
}

/// The GPU buffer of an operand already checked to be on the GPU.
pub(crate) fn buf(t: &Tensor) -> GpuSlice<'_> {
    t.gpu_slice().expect("operand checked to be on the GPU")
}

/// Checks that all tensors are on `first`'s device.
pub(crate) fn same_device(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    let first = tensors[0].device();
    match tensors.iter().find(|t| !t.device().same_as(&first)) {
        None => Ok(()),
        Some(other) => Err(AetherError::DeviceMismatch {
            op,
            a: first.name(),
            b: other.device().name(),
        }),
    }
}
