//! Input gradient: `dX` as a gather over the filter taps that reach each input
//! position, one residue class of `(h + pad) mod stride` per dispatch slice. Every
//! element of dX is written once: no atomics and no zero-fill. Stride-1 convs
//! on the cooperative-matrix variant run the halo kernel (`dinput::halo`) where
//! it fits.

pub(crate) mod halo;

use std::sync::Arc;

use rayon::prelude::*;

use crate::conv::cpu::{Mat, col2im_add_image, gemm, rows_per_image};
use crate::conv::gemm::{ConvKernel, DirectC, GEMM_RUN, GemmRuns};
use crate::conv::operands::{
    accepts_dtype, buf, expect_dims, gpu_operand, host_values, same_device,
};
use crate::conv::plan::{ConvDirection, ConvLaunchPlan, ConvPlans, plan_first};
use crate::conv::shape::{ConvParams, ConvShapeMeta};
use crate::conv::tuning::ConvTuning;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::tensor::{DType, Shape, Tensor};
use halo::with_dinput_halo;

const KERNEL: ConvKernel = ConvKernel {
    name: "conv_dinput",
    parts: &[include_str!("../../../shaders/conv/dinput/dinput.wgsl")],
    gemm: Some(GemmRuns {
        a: "dy",
        b: "w",
        along_k: [true, true],
        fits: |m| [m.c_out % GEMM_RUN == 0; 2],
        // With stride 1 there is one residue class: its rows are dX's pixels.
        // Direct stores measured faster for dX up to 2 tiles wide and on very
        // wide GEMMs, slower at 4 tiles (docs/lab/perf-notes.md, entries 40, 62).
        direct_c: Some(DirectC {
            c: "dx",
            bias: None,
            span: |m, t| {
                ((m.stride_h, m.stride_w) == (1, 1) && m.c_in <= 2 * t)
                    .then_some([m.n * m.h * m.w, m.c_in])
            },
        }),
    }),
    f32_inputs: &[],
};

/// `dX[N, H, W, C_in]` of a convolution with weights `w[R, S, C_in, C_out]` whose
/// output gradient is `dy`; `input_dims` is the forward input's NHWC shape.
/// On the GPU, f32 `dy` is clipped to +-65504 and cast for the f16 variants.
pub fn conv2d_dinput(
    dy: &Tensor,
    w: &Tensor,
    input_dims: [usize; 4],
    params: &ConvParams,
    plans: &ConvPlans,
) -> Result<Tensor> {
    conv2d_dinput_flipped(dy, w, None, input_dims, params, plans)
}

/// Where dinput of `dy` and f16 `w` runs the halo kernel, an uninitialised
/// tensor for its flipped filter, for the same backward's dweight reduce to
/// write (`conv2d_dweight_into`) and [`conv2d_dinput_flipped`] to read; else
/// `None` (dinput takes `w` as it is, or flips it itself).
pub(crate) fn flipped_filter_target(
    dy: &Tensor,
    w: &Tensor,
    input_dims: [usize; 4],
    params: &ConvParams,
    plans: &ConvPlans,
) -> Result<Option<Tensor>> {
    let meta = ConvShapeMeta::new(input_dims, params)?;
    let Some(ctx) = dy.gpu_context() else {
        return Ok(None);
    };
    if w.dtype() != DType::F16 || halo_plan(ctx, &meta, w, plans)?.is_none() {
        return Ok(None);
    }
    let dims = halo::flipped_dims(&meta);
    Tensor::uninit_gpu(ctx, Shape::new(dims)?, DType::F16).map(Some)
}

/// dinput's plan for `meta` with weights of type `w`, made (and its pipelines
/// compiled) on first use with `tuning` (`None`: the context's, see
/// [`ConvPlans::get_or_plan`]).
pub(crate) fn plan_dinput(
    ctx: &GpuContext,
    plans: &ConvPlans,
    meta: &ConvShapeMeta,
    w: DType,
    tuning: Option<&ConvTuning>,
) -> Result<ConvLaunchPlan> {
    plans.get_or_plan(ctx, ConvDirection::DInput, meta, tuning, |tuning| {
        // The largest residue class has ceil(H / stride) x ceil(W / stride) rows per image.
        let class_rows = meta.n * meta.h.div_ceil(meta.stride_h) * meta.w.div_ceil(meta.stride_w);
        let classes = meta.stride_h * meta.stride_w;
        let gemm = plan_first(ctx, plans, &KERNEL, meta, &[], |variant| {
            accepts_dtype(variant, w, &meta.weight_dims())?;
            ConvLaunchPlan::gemm(
                ConvDirection::DInput,
                ctx,
                variant,
                [class_rows, meta.c_in, classes],
                (&KERNEL, meta),
                tuning,
            )
        })?;
        Ok(with_dinput_halo(ctx, gemm, meta, tuning))
    })
}

/// dinput's plan for `meta` where it runs the halo kernel, the one that reads
/// a flipped filter; else `None`.
fn halo_plan(
    ctx: &Arc<GpuContext>,
    meta: &ConvShapeMeta,
    w: &Tensor,
    plans: &ConvPlans,
) -> Result<Option<ConvLaunchPlan>> {
    let plan = plan_dinput(ctx, plans, meta, w.dtype(), None)?;
    Ok(plan.halo.is_some().then_some(plan))
}

/// The flipped filter dinput's halo kernel reads (`[R, S, C_out, C_in]`, f16),
/// made from the weights `w` now, where dinput's plan for this shape runs that
/// kernel; else `None`. [`conv2d_dinput`] flips the filter in a dispatch of its
/// own each call; a caller that runs dinput again and again with the same
/// weights passes this to [`conv2d_dinput_flipped`] instead, as a training
/// step's dweight reduce writes it once per backward.
pub fn dinput_flipped_filter(
    w: &Tensor,
    input_dims: [usize; 4],
    params: &ConvParams,
    plans: &ConvPlans,
) -> Result<Option<Tensor>> {
    let meta = ConvShapeMeta::new(input_dims, params)?;
    expect_dims("conv2d_dinput weight", w, &meta.weight_dims())?;
    let Some(ctx) = w.gpu_context() else {
        return Ok(None);
    };
    let Some(plan) = halo_plan(ctx, &meta, w, plans)? else {
        return Ok(None);
    };
    let w_op = gpu_operand("conv2d_dinput weight", w, plan.variant)?;
    halo::flip_filter(ctx, &w_op, &meta).map(Some)
}

/// [`conv2d_dinput`] of the weights `w` with their `flipped` filter for the
/// halo kernel, made by [`dinput_flipped_filter`] (or, in a layer's
/// backward, written by its dweight reduce); with `None`, or
/// where the halo kernel does not run, as [`conv2d_dinput`]. `flipped` must
/// come from these weights.
pub fn conv2d_dinput_flipped(
    dy: &Tensor,
    w: &Tensor,
    flipped: Option<&Tensor>,
    input_dims: [usize; 4],
    params: &ConvParams,
    plans: &ConvPlans,
) -> Result<Tensor> {
    let meta = ConvShapeMeta::new(input_dims, params)?;
    expect_dims("conv2d_dinput dvalues", dy, &meta.output_dims())?;
    expect_dims("conv2d_dinput weight", w, &meta.weight_dims())?;
    same_device("conv2d_dinput", &[dy, w])?;
    let Some(ctx) = dy.gpu_context() else {
        let dx = dinput_cpu(&meta, &host_values(dy)?, &host_values(w)?);
        return Tensor::from_f32(input_dims.to_vec(), dx, &dy.device());
    };
    let plan = plan_dinput(ctx, plans, &meta, w.dtype(), None)?;
    let dy_op = gpu_operand("conv2d_dinput dvalues", dy, plan.variant)?;
    let w_op = gpu_operand("conv2d_dinput weight", w, plan.variant)?;
    let dx = Tensor::uninit_gpu(ctx, Shape::new(input_dims)?, DType::F32)?;
    if plan.halo.is_some() {
        if let Some(wt) = flipped {
            expect_dims(
                "conv2d_dinput flipped weight",
                wt,
                &halo::flipped_dims(&meta),
            )?;
        }
        halo::dispatch(ctx, &plan, &meta, &dy_op, (&w_op, flipped), &dx)?;
        return Ok(dx);
    }
    let pipeline = KERNEL
        .pipeline(ctx, &plan, &meta)
        .expect("planned variant compiled");
    ctx.dispatch(
        "conv_dinput",
        &pipeline,
        &[buf(&dy_op), buf(&w_op), buf(&dx)],
        bytemuck::bytes_of(&(meta.n as u32)),
        plan.workgroups,
    )?;
    Ok(dx)
}

/// The CPU reference: per image, `dcol = dY x W^T` then col2im, images in parallel.
pub fn dinput_cpu(meta: &ConvShapeMeta, dy: &[f32], w: &[f32]) -> Vec<f32> {
    let rows = rows_per_image(meta);
    let image_in = meta.h * meta.w * meta.c_in;
    let mut dx = vec![0.0; meta.n * image_in];
    dx.par_chunks_mut(image_in)
        .zip(dy.par_chunks(rows * meta.c_out))
        .for_each_init(
            || vec![0.0; rows * meta.k],
            |col, (dx_img, dy_img)| {
                gemm(
                    &Mat::new(dy_img, rows, meta.c_out),
                    &Mat::t(w, meta.k, meta.c_out),
                    col,
                    false,
                );
                col2im_add_image(meta, col, dx_img);
            },
        );
    dx
}
