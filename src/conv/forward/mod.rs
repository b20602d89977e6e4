//! Forward convolution: `Out[M, C_out] = im2col(X)[M, K] x W[K, C_out] + bias`.

// The halo kernel of stride-1 convs: public for the tests and benches.
#[doc(hidden)]
pub mod halo;

use rayon::prelude::*;

use crate::conv::cpu::{Mat, gemm, im2col_image, rows_per_image};
use crate::conv::gemm::{ConvKernel, DirectC, GEMM_RUN, GemmRuns, IM2COL};
use crate::conv::operands::{
    accepts_dtype, buf, expect_dims, gpu_operand, host_values, same_device,
};
use crate::conv::plan::{ConvDirection, ConvLaunchPlan, ConvPlans, plan_first};
use crate::conv::shape::{ConvParams, ConvShapeMeta};
use crate::conv::tuning::ConvTuning;
use crate::error::{AetherError, Result};
use crate::gpu::GpuContext;
use crate::tensor::{DType, Shape, Tensor};
use halo::Narrow;

const KERNEL: ConvKernel = ConvKernel {
    name: "conv_forward",
    parts: &[
        IM2COL,
        include_str!("../../../shaders/conv/forward/forward.wgsl"),
    ],
    gemm: Some(GemmRuns {
        a: "x",
        b: "w",
        along_k: [true, false],
        fits: |m| [m.c_in % GEMM_RUN == 0, m.c_out % GEMM_RUN == 0],
        direct_c: Some(DirectC {
            c: "y",
            bias: Some("bias"),
            // Direct stores measured faster at every width
            // (docs/lab/perf-notes.md, entries 40 and 62).
            span: |m, _| Some([m.m, m.c_out]),
        }),
    }),
    f32_inputs: &["x"],
};

/// Convolves NHWC `x` with `w[R, S, C_in, C_out]` and adds `bias[C_out]`.
/// On the GPU, f32 operands are cast to f16 for the f16 variants.
pub fn conv2d_forward(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    params: &ConvParams,
    plans: &ConvPlans,
) -> Result<Tensor> {
    let meta = ConvShapeMeta::new(x.shape().nhwc("conv2d_forward input")?, params)?;
    expect_dims("conv2d_forward weight", w, &meta.weight_dims())?;
    expect_dims("conv2d_forward bias", bias, &[meta.c_out])?;
    same_device("conv2d_forward", &[x, w, bias])?;
    if bias.dtype() != DType::F32 {
        return Err(AetherError::InvalidShape {
            op: "conv2d_forward bias",
            shape: bias.dims().to_vec(),
            reason: "bias must be F32".into(),
        });
    }
    let Some(ctx) = x.gpu_context() else {
        let out = forward_cpu(
            &meta,
            &host_values(x)?,
            &host_values(w)?,
            &host_values(bias)?,
        );
        return Tensor::from_f32(meta.output_dims().to_vec(), out, &x.device());
    };
    // An f32 input is read as f32 and converted while staging: no cast dispatch.
    // Should that pipeline fail to compile (announced), the input is cast.
    let x_f32 = [x.dtype() == DType::F32];
    let plan = plan_forward(ctx, plans, &meta, x.dtype(), w.dtype(), None)?;
    // The plan was checked with this shape's input dtype; another dtype may need
    // a pipeline that has not been compiled yet, which could still fail.
    let (pipeline, read_f32) = KERNEL
        .pipeline_for_inputs(ctx, &plan, &meta, &x_f32)
        .ok_or_else(|| AetherError::NoKernelVariant {
            kernel: KERNEL.name,
            adapter: ctx.caps().adapter_name.clone(),
            reasons: format!("{} failed to compile", plan.variant.name()),
        })?;
    let x_op = if read_f32 {
        x.clone()
    } else {
        gpu_operand("conv2d_forward input", x, plan.variant)?
    };
    let w_op = gpu_operand("conv2d_forward weight", w, plan.variant)?;
    let out = Tensor::uninit_gpu(ctx, Shape::new(meta.output_dims())?, DType::F32)?;
    ctx.dispatch(
        "conv_forward",
        &pipeline,
        &[buf(&x_op), buf(&w_op), buf(bias), buf(&out)],
        bytemuck::bytes_of(&(meta.n as u32)),
        plan.workgroups,
    )?;
    Ok(out)
}

/// The forward's plan for `meta` with operands of these types, made (and its
/// pipeline compiled) on first use with `tuning` (`None`: the context's, see
/// [`ConvPlans::get_or_plan`]): the direct kernel where it fits (a first
/// conv's few input channels) and compiles, else the halo kernel where it
/// does, else the first GEMM-core variant that does.
pub(crate) fn plan_forward(
    ctx: &GpuContext,
    plans: &ConvPlans,
    meta: &ConvShapeMeta,
    x: DType,
    w: DType,
    tuning: Option<&ConvTuning>,
) -> Result<ConvLaunchPlan> {
    let x_f32 = [x == DType::F32];
    plans.get_or_plan(ctx, ConvDirection::Forward, meta, tuning, |tuning| {
        plan_first(ctx, plans, &KERNEL, meta, &x_f32, |variant| {
            accepts_dtype(variant, x, &meta.input_dims())?;
            accepts_dtype(variant, w, &meta.weight_dims())?;
            let gemm = ConvLaunchPlan::gemm(
                ConvDirection::Forward,
                ctx,
                variant,
                [meta.m, meta.c_out, 1],
                (&KERNEL, meta),
                tuning,
            )?;
            // Should the direct or halo kernel fail to compile (the pipeline
            // cache has warned), the GEMM core.
            let compiles = |plan: &ConvLaunchPlan| {
                KERNEL
                    .pipeline_for_inputs(ctx, plan, meta, &x_f32)
                    .is_some()
            };
            let direct = gemm.with_direct(meta, ctx.caps(), tuning);
            if direct != gemm && compiles(&direct) {
                return Ok(direct);
            }
            let halo = gemm.with_halo(meta, ctx.caps(), tuning, Narrow::FORWARD);
            Ok(if halo != gemm && compiles(&halo) {
                halo
            } else {
                gemm
            })
        })
    })
}

/// The CPU reference: im2col of each image and a GEMM, images in parallel.
pub fn forward_cpu(meta: &ConvShapeMeta, x: &[f32], w: &[f32], bias: &[f32]) -> Vec<f32> {
    let rows = rows_per_image(meta);
    let image_in = meta.h * meta.w * meta.c_in;
    let mut out = vec![0.0; meta.m * meta.c_out];
    out.par_chunks_mut(rows * meta.c_out)
        .zip(x.par_chunks(image_in))
        .for_each_init(
            || vec![0.0; rows * meta.k],
            |col, (out_img, x_img)| {
                im2col_image(meta, x_img, col);
                for row in out_img.chunks_mut(meta.c_out) {
                    row.copy_from_slice(bias);
                }
                gemm(
                    &Mat::new(col, rows, meta.k),
                    &Mat::new(w, meta.k, meta.c_out),
                    out_img,
                    true,
                );
            },
        );
    out
}
