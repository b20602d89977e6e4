//! f32 -> f16 casts for the conv operands, bit-exact with `half::f16::from_f32`.
//!
//! `conv_backward_cast_fp16` writes both fp16 operands of the backward pass in one
//! dispatch: dvalues clipped to +-65504 (NaN passes, +-inf clamps, like `xp.clip`)
//! and inputs cast unclipped. If that kernel fails to compile, the two-dispatch
//! fallback (the single-tensor cast twice) is used after one `[aether]` warning.

use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use crate::error::{AetherError, Result};
use crate::gpu::{GpuContext, GpuSlice, PipelineKey, flat_grid};
use crate::tensor::{DType, Shape, Tensor};

const F16_BITS: &str = include_str!("../../shaders/common/f16_bits.wgsl");
const BACKWARD_CAST: &str = include_str!("../../shaders/conv/cast/backward_cast.wgsl");
const CAST: &str = include_str!("../../shaders/conv/cast/cast.wgsl");
const FLAG: &str = include_str!("../../shaders/conv/cast/saturation_flag.wgsl");
const UNFLAGGED: &str = include_str!("../../shaders/conv/cast/saturation_unflagged.wgsl");
const WORKGROUP: u32 = 256;
/// Elements per invocation: two 16-byte loads of f32, one 16-byte store of f16.
/// Pooled buffers come in 256-byte granules, so the last group's vector loads
/// and store stay inside the buffers; elements past the tensor are written as 0.
const GROUP: usize = 8;

/// `xp.clip(x, -65504, 65504)`: NaN stays NaN, infinities clamp.
pub fn clip_f16_range(x: f32) -> f32 {
    if x.is_nan() {
        x
    } else {
        x.clamp(-65504.0, 65504.0)
    }
}

fn require_f32(op: &'static str, t: &Tensor) -> Result<()> {
    t.expect_dtype(op, DType::F32)
}

/// `x` as f16, clipped to +-65504 first when `clip` is set.
pub fn cast_f16(x: &Tensor, clip: bool) -> Result<Tensor> {
    cast_f16_from(x, clip, None, Tensor::uninit_gpu)
}

/// [`cast_f16`] for a result kept across calls (a weight's f16 shadow), in a
/// new buffer rather than a recycled one (see [`Tensor::uninit_gpu_kept`]).
pub(crate) fn cast_f16_kept(x: &Tensor, clip: bool) -> Result<Tensor> {
    cast_f16_from(x, clip, None, Tensor::uninit_gpu_kept)
}

/// An output gradient `dy` as f16, clipped, in the dispatch that also raises
/// the loss scaler's overflow flag (word 2 of its `scaler` state, on the same
/// GPU) where a value saturates f16, as the scaler's own check of `dy` would.
pub(crate) fn cast_f16_flagging(dy: &Tensor, scaler: &Tensor) -> Result<Tensor> {
    if !dy.device().same_as(&scaler.device()) {
        return Err(AetherError::DeviceMismatch {
            op: "cast_f16 with a saturation flag",
            a: dy.device().name(),
            b: scaler.device().name(),
        });
    }
    cast_f16_from(dy, true, Some(scaler), Tensor::uninit_gpu)
}

fn cast_f16_from(
    x: &Tensor,
    clip: bool,
    scaler: Option<&Tensor>,
    alloc: fn(&Arc<GpuContext>, Shape, DType) -> Result<Tensor>,
) -> Result<Tensor> {
    require_f32("cast_f16", x)?;
    if let Some(data) = x.host_f32() {
        let prepare = if clip {
            clip_f16_range
        } else {
            std::convert::identity
        };
        let out = data
            .par_iter()
            .map(|&v| f16::from_f32(prepare(v)))
            .collect();
        return Tensor::from_f16(x.dims().to_vec(), out, &x.device());
    }
    let ctx = x.gpu_context().expect("non-host tensor is on a GPU");
    let (variant, flag) = match scaler {
        Some(_) => ("flagging", FLAG),
        None => ("portable", UNFLAGGED),
    };
    let key = PipelineKey::new("cast_f16", variant).with("CLIP", u32::from(clip));
    let pipeline = ctx
        .pipelines()
        .require(&key, "main", || [F16_BITS, flag, CAST].concat().into())?;
    let out = alloc(ctx, x.shape().clone(), DType::F16)?;
    let (grid, row_stride) = group_grid(ctx, x.numel().div_ceil(GROUP));
    let params = [x.numel() as u32, row_stride];
    let mut buffers = vec![gpu(x), gpu(&out)];
    buffers.extend(scaler.map(gpu));
    ctx.dispatch(
        "cast_f16",
        &pipeline,
        &buffers,
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(out)
}

/// The fp16 operands of a conv backward pass: `(clip(dvalues) as f16,
/// clip(inputs) as f16)`, both saturating as the forward's operands do.
pub fn conv_backward_cast_fp16(dvalues: &Tensor, inputs: &Tensor) -> Result<(Tensor, Tensor)> {
    require_f32("conv_backward_cast_fp16", dvalues)?;
    require_f32("conv_backward_cast_fp16", inputs)?;
    if !dvalues.device().same_as(&inputs.device()) {
        return Err(AetherError::DeviceMismatch {
            op: "conv_backward_cast_fp16",
            a: dvalues.device().name(),
            b: inputs.device().name(),
        });
    }
    let Some(ctx) = dvalues.gpu_context() else {
        return Ok((cast_f16(dvalues, true)?, cast_f16(inputs, true)?));
    };
    let key = PipelineKey::new("conv_backward_cast_fp16", "fused");
    let Some(pipeline) = ctx
        .pipelines()
        .get_or_create(&key, "main", || [F16_BITS, BACKWARD_CAST].concat().into())
    else {
        // The pipeline cache has warned once; the two-dispatch path gives identical bits.
        return Ok((cast_f16(dvalues, true)?, cast_f16(inputs, true)?));
    };
    let dvalues_f16 = Tensor::uninit_gpu(ctx, dvalues.shape().clone(), DType::F16)?;
    let inputs_f16 = Tensor::uninit_gpu(ctx, inputs.shape().clone(), DType::F16)?;
    let groups = dvalues.numel().div_ceil(GROUP) + inputs.numel().div_ceil(GROUP);
    let (grid, row_stride) = group_grid(ctx, groups);
    let params = [dvalues.numel() as u32, inputs.numel() as u32, row_stride];
    ctx.dispatch(
        "conv_backward_cast_fp16",
        &pipeline,
        &[
            gpu(dvalues),
            gpu(inputs),
            gpu(&dvalues_f16),
            gpu(&inputs_f16),
        ],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok((dvalues_f16, inputs_f16))
}

/// A grid with one invocation per `groups` group of [`GROUP`] elements.
fn group_grid(ctx: &GpuContext, groups: usize) -> ([u32; 3], u32) {
    flat_grid(
        groups,
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    )
}

fn gpu(t: &Tensor) -> GpuSlice<'_> {
    t.gpu_slice().expect("operand checked to be on the GPU")
}
