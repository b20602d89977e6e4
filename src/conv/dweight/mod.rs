//! Weight gradient: `dW[K, C_out] = im2col(X)^T x dY`, with `dbias = sum(dY)`
//! fused into the same GEMM (a row of ones) and split-K over the M reduction.
//! Slices are summed by a second pass in a fixed order, so two runs on the same
//! inputs give bit-identical weights on every backend (no float atomics).

// The halo kernel of stride-1 convs: public for the tests and benches.
#[doc(hidden)]
pub mod halo;

use rayon::prelude::*;

use crate::conv::cast::conv_backward_cast_fp16;
use crate::conv::cpu::{Mat, gemm, im2col_image, rows_per_image};
use crate::conv::dinput::halo::{FLIP_PAIR, flipped_dims};
use crate::conv::direct::{DIRECT_THREADS, DirectConv};
use crate::conv::gemm::{ConvKernel, GEMM_RUN, GemmRuns, IM2COL};
use crate::conv::operands::{
    accepts_dtype, buf, expect_dims, gpu_operand, host_values, same_device,
};
use crate::conv::plan::{ConvDirection, ConvLaunchPlan, ConvPlans, check_gemm_loops, plan_first};
use crate::conv::shape::{ConvParams, ConvShapeMeta};
use crate::conv::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};
use crate::gpu::flat_grid;
use crate::gpu::{GpuCapabilities, GpuContext};
use crate::tensor::{DType, Shape, Tensor};
use halo::DWeightHalo;

const KERNEL: ConvKernel = ConvKernel {
    name: "conv_dweight",
    parts: &[
        IM2COL,
        include_str!("../../../shaders/conv/dweight/dweight.wgsl"),
    ],
    gemm: Some(GemmRuns {
        a: "x",
        b: "dy",
        along_k: [false, false],
        fits: |m| [m.c_in % GEMM_RUN == 0, m.c_out % GEMM_RUN == 0],
        // The partial sums have K + 1 rows (the dbias row): never whole blocks.
        direct_c: None,
    }),
    f32_inputs: &["x"],
};
const REDUCE_SLICES: &str = include_str!("../../../shaders/conv/dweight/reduce.wgsl");
const REDUCE: ConvKernel = ConvKernel {
    name: "conv_dweight_reduce",
    parts: &[
        REDUCE_SLICES,
        include_str!("../../../shaders/conv/dweight/reduce_main.wgsl"),
    ],
    gemm: None,
    f32_inputs: &[],
};
/// The reduce that also writes the flipped filter of the same backward's
/// dinput halo kernel (one dispatch fewer than its own flip).
const REDUCE_FLIP: ConvKernel = ConvKernel {
    name: "conv_dweight_reduce_flip",
    parts: &[
        REDUCE_SLICES,
        FLIP_PAIR,
        include_str!("../../../shaders/conv/dweight/reduce_flip.wgsl"),
    ],
    gemm: None,
    f32_inputs: &[],
};
/// Outputs per workgroup of the split-K reduce in lanes mode, and its
/// invocations (`OUTPUTS`, `REDUCE_WORKGROUP` in dweight/reduce.wgsl).
const REDUCE_OUTPUTS: usize = 32;
const REDUCE_WORKGROUP: u32 = 256;
/// The reduce takes an output per invocation (columns mode) rather than
/// spreading each output's slices over a workgroup's lanes where each
/// invocation then walks at most this many slices...
const REDUCE_COLUMN_SPLITS: usize = 32;
/// ...and the outputs fill this many invocations a compute unit (4 workgroups
/// of 256): fewer, and the lanes' 8 invocations an output keep the GPU
/// busier (run I9: v1's 9k-74k-output reduces ran 10% slower in columns).
const REDUCE_COLUMN_OUTPUTS_PER_UNIT: usize = 1024;
/// Images per partial sum on the CPU path: a fixed grouping keeps the CPU result
/// independent of the thread count.
const CPU_IMAGES_PER_PARTIAL: usize = 4;

/// Environment variable for tuning: `K` aims dweight's split of the
/// reduction at K workgroups per compute unit, in the GEMM core and in the
/// halo kernel alike (instead of [`split_k`]'s rule and the halo kernel's 2).
pub const SPLIT_ENV: &str = "AETHER_DWEIGHT_SPLIT";

/// The workgroups per compute unit `AETHER_DWEIGHT_SPLIT` pins, if set to a
/// positive count (anything else warns once and keeps the rule).
pub(crate) fn pinned_split_per_unit(tuning: &ConvTuning) -> Option<u32> {
    let text = tuning.get(SPLIT_ENV)?;
    match text.trim().parse::<u32>() {
        Ok(per_unit) if per_unit > 0 => Some(per_unit),
        _ => {
            warn_once(
                &format!("dweight-split:{text}"),
                &format!(
                    "{SPLIT_ENV}={text:?} is not a positive count of workgroups per compute \
                     unit: dweight's split keeps its rule"
                ),
            );
            None
        }
    }
}

/// The seed's split-K rule: aim for `(4 if the 2-D grid is one workgroup else 2)`
/// workgroups per compute unit (or what [`SPLIT_ENV`] pins), never more slices
/// than reduction tiles. Aiming higher grows the reduce pass more than it
/// speeds the GEMM (docs/lab/perf-notes.md).
pub fn split_k(grid2d: u32, reduction_tiles: u32, compute_units: u32, tuning: &ConvTuning) -> u32 {
    let per_unit = pinned_split_per_unit(tuning).unwrap_or(if grid2d == 1 { 4 } else { 2 });
    (per_unit * compute_units / grid2d.max(1)).clamp(1, reduction_tiles.max(1))
}

/// `(dW[R, S, C_in, C_out], dbias[C_out])` of a convolution of NHWC `x` whose
/// output gradient is `dy`. On the GPU, f32 operands go through the fused
/// backward cast (dy clipped to +-65504) for the f16 variants.
pub fn conv2d_dweight(
    x: &Tensor,
    dy: &Tensor,
    params: &ConvParams,
    plans: &ConvPlans,
) -> Result<(Tensor, Tensor)> {
    conv2d_dweight_into(x, dy, params, plans, None, None).map(|(dw, db, _)| (dw, db))
}

/// [`conv2d_dweight`]; on the GPU, writing `dW` and `dbias` into `outputs`
/// when given (a layer's segments of the optimizer's packed gradients), and
/// with `flip = (w, wt)` the flipped filter of the f16 weights `w` into `wt`
/// (see [`super::dinput::flipped_filter_target`]) in the reduce's dispatch.
/// The flag says whether `wt` was written: not on the CPU, nor where that
/// reduce failed to compile (the pipeline cache has warned).
pub(crate) fn conv2d_dweight_into(
    x: &Tensor,
    dy: &Tensor,
    params: &ConvParams,
    plans: &ConvPlans,
    outputs: Option<&(Tensor, Tensor)>,
    flip: Option<(&Tensor, &Tensor)>,
) -> Result<(Tensor, Tensor, bool)> {
    let meta = ConvShapeMeta::new(x.shape().nhwc("conv2d_dweight input")?, params)?;
    expect_dims("conv2d_dweight dvalues", dy, &meta.output_dims())?;
    same_device("conv2d_dweight", &[x, dy])?;
    if let Some((dw, db)) = outputs {
        dw.expect_output_for("conv2d_dweight dW output", &meta.weight_dims(), x)?;
        db.expect_output_for("conv2d_dweight dbias output", &[meta.c_out], x)?;
    }
    let Some(ctx) = x.gpu_context() else {
        let (dw, db) = dweight_cpu(&meta, &host_values(x)?, &host_values(dy)?);
        let device = x.device();
        return Ok((
            Tensor::from_f32(meta.weight_dims().to_vec(), dw, &device)?,
            Tensor::from_f32(vec![meta.c_out], db, &device)?,
            false,
        ));
    };
    let plan = plan_dweight(ctx, plans, &meta, x.dtype(), dy.dtype(), None)?;
    // An f32 input is read as f32 and converted while staging (saturating,
    // as the cast would): no cast dispatch. Should that pipeline fail to
    // compile (announced), the input is cast.
    let (pipeline, read_f32) = KERNEL
        .pipeline_for_inputs(ctx, &plan, &meta, &[x.dtype() == DType::F32])
        .expect("planned variant compiled");
    let flip = match flip {
        Some((w, wt)) => {
            w.expect_dtype("conv2d_dweight weight to flip", DType::F16)?;
            wt.expect_dtype("conv2d_dweight flipped weight", DType::F16)?;
            expect_dims("conv2d_dweight weight to flip", w, &meta.weight_dims())?;
            expect_dims("conv2d_dweight flipped weight", wt, &flipped_dims(&meta))?;
            REDUCE_FLIP.pipeline(ctx, &plan, &meta).map(|p| (p, w, wt))
        }
        None => None,
    };
    let reduce = match &flip {
        Some((pipeline, ..)) => pipeline.clone(),
        None => REDUCE
            .pipeline(ctx, &plan, &meta)
            .ok_or_else(|| AetherError::NoKernelVariant {
                kernel: REDUCE.name,
                adapter: ctx.caps().adapter_name.clone(),
                reasons: "failed to compile".into(),
            })?,
    };
    let (x_op, dy_op) = match (plan.variant.f16_operands(), x.dtype(), dy.dtype()) {
        (true, DType::F32, _) if read_f32 => (
            x.clone(),
            gpu_operand("conv2d_dweight dvalues", dy, plan.variant)?,
        ),
        (true, DType::F32, DType::F32) => {
            let (dy16, x16) = conv_backward_cast_fp16(dy, x)?;
            (x16, dy16)
        }
        _ => (
            gpu_operand("conv2d_dweight input", x, plan.variant)?,
            gpu_operand("conv2d_dweight dvalues", dy, plan.variant)?,
        ),
    };
    // The halo kernel's slices have more rows (its dbias tiles): the reduce
    // is told the stride, and reads K + 1 rows of each either way.
    let per_slice = (meta.k + 1) * meta.c_out;
    let slice_stride = match plan.dweight_halo {
        Some(_) => DWeightHalo::partial_rows(&meta) * meta.c_out,
        None => per_slice,
    };
    let split = plan.split_k as usize;
    let partial = Tensor::uninit_gpu(ctx, Shape::new([split, slice_stride])?, DType::F32)?;
    let tile_k = plan.tile_k as usize;
    let slice_len = meta.m.div_ceil(tile_k).div_ceil(split) * tile_k;
    ctx.dispatch(
        "conv_dweight",
        &pipeline,
        &[buf(&x_op), buf(&dy_op), buf(&partial)],
        bytemuck::cast_slice(&[meta.n as u32, slice_len as u32]),
        plan.workgroups,
    )?;
    let (dw, db) = match outputs {
        Some((dw, db)) => (dw.clone(), db.clone()),
        None => (
            Tensor::uninit_gpu(ctx, Shape::new(meta.weight_dims())?, DType::F32)?,
            Tensor::uninit_gpu(ctx, Shape::new([meta.c_out])?, DType::F32)?,
        ),
    };
    // Lanes mode: REDUCE_OUTPUTS outputs per workgroup, a "grid row" is
    // `row_stride` workgroups; columns mode: an output per invocation, a grid
    // row `row_stride` invocations.
    let columns = reduce_in_columns(ctx.caps(), split, per_slice);
    let max_groups = ctx.caps().limits.max_compute_workgroups_per_dimension;
    let (grid, row_stride) = match columns {
        true => flat_grid(per_slice, REDUCE_WORKGROUP, max_groups),
        false => flat_grid(per_slice.div_ceil(REDUCE_OUTPUTS), 1, max_groups),
    };
    let mut bindings = vec![buf(&partial), buf(&dw), buf(&db)];
    if let Some((_, w, wt)) = &flip {
        bindings.extend([buf(w), buf(wt)]);
    }
    ctx.dispatch(
        "conv_dweight_reduce",
        &reduce,
        &bindings,
        bytemuck::cast_slice(&[
            split as u32,
            row_stride,
            slice_stride as u32,
            u32::from(columns),
        ]),
        grid,
    )?;
    Ok((dw, db, flip.is_some()))
}

/// Whether dweight's reduce of `split` slices of `outputs` values each takes
/// an output per invocation (columns) on a device with `caps`, rather than
/// spreading each output's slices over lanes (dweight/reduce.wgsl). Public
/// for the tests, which size their shapes to run both.
#[doc(hidden)]
pub fn reduce_in_columns(caps: &GpuCapabilities, split: usize, outputs: usize) -> bool {
    let units = caps.estimated_compute_units() as usize;
    split <= REDUCE_COLUMN_SPLITS && outputs >= REDUCE_COLUMN_OUTPUTS_PER_UNIT * units
}

/// dweight's plan for `meta` with operands of these types, made (and its
/// pipeline compiled) on first use with `tuning` (`None`: the context's, see
/// [`ConvPlans::get_or_plan`]): the split of the reduction over workgroups,
/// and the halo kernel where it fits and compiles.
pub(crate) fn plan_dweight(
    ctx: &GpuContext,
    plans: &ConvPlans,
    meta: &ConvShapeMeta,
    x: DType,
    dy: DType,
    tuning: Option<&ConvTuning>,
) -> Result<ConvLaunchPlan> {
    plans.get_or_plan(ctx, ConvDirection::DWeight, meta, tuning, |tuning| {
        let x_f32 = [x == DType::F32];
        plan_first(ctx, plans, &KERNEL, meta, &x_f32, |variant| {
            accepts_dtype(variant, x, &meta.input_dims())?;
            accepts_dtype(variant, dy, &meta.output_dims())?;
            let rows = meta.k + 1;
            let mut plan = ConvLaunchPlan::gemm(
                ConvDirection::DWeight,
                ctx,
                variant,
                [rows, meta.c_out, 1],
                (&KERNEL, meta),
                tuning,
            )?;
            let reduction_tiles = meta.m.div_ceil(plan.tile_k as usize) as u32;
            let mut split = split_k(
                plan.workgroups[0] * plan.workgroups[1],
                reduction_tiles,
                ctx.caps().estimated_compute_units(),
                tuning,
            );
            let max_split = max_split(ctx.caps(), meta);
            split = split.min(max_split as u32);
            // Where the driver cuts loops short (lavapipe), enough slices
            // that each invocation's share of the reduction stays under it.
            if let Some(limit) = ctx.caps().loop_iteration_limit()
                && plan.coop.is_none()
            {
                let turns = rows
                    .div_ceil(plan.tile_m as usize)
                    .div_ceil(plan.workgroups[0].max(1) as usize);
                let per_slice = (limit as usize / 2 / turns.max(1)).max(1);
                let needed = (reduction_tiles as usize).div_ceil(per_slice) as u32;
                split = split.max(needed.min(max_split as u32));
                let tiles = (reduction_tiles as usize).div_ceil(split as usize);
                check_gemm_loops(ctx, ConvDirection::DWeight, turns, tiles)?;
            }
            plan.workgroups[2] = split;
            plan.split_k = split;
            // The direct kernel where it fits and compiles, else the halo
            // kernel where it does; should either fail to compile (the
            // pipeline cache has warned), the GEMM core.
            let compiles = |plan: &ConvLaunchPlan| {
                KERNEL
                    .pipeline_for_inputs(ctx, plan, meta, &x_f32)
                    .is_some()
            };
            if let Some(direct) = with_direct(ctx, meta, plan, tuning)
                && compiles(&direct)
            {
                return Ok(direct);
            }
            let halo = plan.with_dweight_halo(meta, ctx.caps(), tuning);
            Ok(if halo != plan && compiles(&halo) {
                halo
            } else {
                plan
            })
        })
    })
}

/// The most slices whose partial sums (`K + 1` rows of `C_out` each) fit
/// one storage binding.
fn max_split(caps: &GpuCapabilities, meta: &ConvShapeMeta) -> u64 {
    let slice_bytes = ((meta.k + 1) * meta.c_out * 4) as u64;
    (caps.limits.max_storage_buffer_binding_size / slice_bytes).max(1)
}

/// `plan` with the direct kernel where it fits `meta`: a slice of the
/// reduction per workgroup, 4 workgroups a compute unit (or what
/// [`SPLIT_ENV`] pins), and where the driver cuts loops short (lavapipe),
/// enough slices that each invocation's loop stays under it.
fn with_direct(
    ctx: &GpuContext,
    meta: &ConvShapeMeta,
    plan: ConvLaunchPlan,
    tuning: &ConvTuning,
) -> Option<ConvLaunchPlan> {
    let direct = DirectConv::fit(ConvDirection::DWeight, meta, ctx.caps(), tuning).ok()?;
    let rows = direct.rows as usize;
    let chunks = meta.m.div_ceil(rows) as u32;
    let mut split = split_k(1, chunks, ctx.caps().estimated_compute_units(), tuning);
    if let Some(limit) = ctx.caps().loop_iteration_limit() {
        // Each invocation walks a chunk's rows for each of its outputs.
        let outputs = (direct.k as usize + 1) * direct.groups as usize;
        let per_position = outputs.div_ceil(DIRECT_THREADS) as u64 + 1;
        let most = (limit / 2 / per_position).max(rows as u64);
        split = split.max((meta.m as u64).div_ceil(most).min(u64::from(chunks)) as u32);
    }
    let split = split.min(max_split(ctx.caps(), meta) as u32);
    Some(ConvLaunchPlan {
        direct: Some(direct),
        tile_k: direct.rows,
        workgroups: [1, 1, split],
        split_k: split,
        ..plan
    })
}

/// Compiles the reduce that follows dweight's plan for `meta`: the one that
/// also writes the flipped filter where `flip` (the same backward's dinput
/// runs the halo kernel), for [`super::prepare_convs`].
pub(crate) fn compile_reduce(
    ctx: &GpuContext,
    plans: &ConvPlans,
    meta: &ConvShapeMeta,
    [x, dy]: [DType; 2],
    flip: bool,
    tuning: Option<&ConvTuning>,
) -> Result<()> {
    let plan = plan_dweight(ctx, plans, meta, x, dy, tuning)?;
    let reduce = if flip { &REDUCE_FLIP } else { &REDUCE };
    // A failure has been announced; the step meets it again and reports it.
    let _ = reduce.pipeline(ctx, &plan, meta);
    Ok(())
}

/// The CPU reference: per group of images, im2col^T x dY; groups summed in order.
pub fn dweight_cpu(meta: &ConvShapeMeta, x: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let rows = rows_per_image(meta);
    let image_in = meta.h * meta.w * meta.c_in;
    let image_out = rows * meta.c_out;
    let partials: Vec<(Vec<f32>, Vec<f32>)> = x
        .par_chunks(image_in * CPU_IMAGES_PER_PARTIAL)
        .zip(dy.par_chunks(image_out * CPU_IMAGES_PER_PARTIAL))
        .map(|(xs, dys)| {
            let mut col = vec![0.0; rows * meta.k];
            let mut dw = vec![0.0; meta.k * meta.c_out];
            let mut db = vec![0.0; meta.c_out];
            for (x_img, dy_img) in xs.chunks(image_in).zip(dys.chunks(image_out)) {
                im2col_image(meta, x_img, &mut col);
                gemm(
                    &Mat::t(&col, rows, meta.k),
                    &Mat::new(dy_img, rows, meta.c_out),
                    &mut dw,
                    true,
                );
                for row in dy_img.chunks(meta.c_out) {
                    db.iter_mut().zip(row).for_each(|(d, v)| *d += v);
                }
            }
            (dw, db)
        })
        .collect();
    let mut dw = vec![0.0; meta.k * meta.c_out];
    let mut db = vec![0.0; meta.c_out];
    for (pw, pb) in &partials {
        dw.iter_mut().zip(pw).for_each(|(d, v)| *d += v);
        db.iter_mut().zip(pb).for_each(|(d, v)| *d += v);
    }
    (dw, db)
}
