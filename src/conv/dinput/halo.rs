//! dinput's halo kernel: for a stride-1, undilated conv, dX is the forward of
//! the transposed conv, dy convolved with the filter flipped and its channels
//! swapped. On the cooperative-matrix variant the forward's halo kernel
//! (src/conv/forward/halo.rs) runs that conv, its MMAs reading a staged tile of dy
//! instead of the residue-class gather's per-tap staging. It reads the filter
//! flipped (shaders/conv/dinput/flip_pair.wgsl): written by the same backward's
//! dweight reduce where a layer asks for it, else by a small dispatch of its
//! own first (shaders/conv/dinput/flip_filter.wgsl).

use std::sync::Arc;

use crate::conv::forward::halo::Narrow;
use crate::conv::gemm::{ConvKernel, GEMM_RUN, GemmRuns, IM2COL};
use crate::conv::operands::buf;
use crate::conv::plan::ConvLaunchPlan;
use crate::conv::shape::{ConvParams, ConvShapeMeta, Padding};
use crate::conv::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::error::Result;
use crate::gpu::{GpuContext, PipelineKey, flat_grid};
use crate::tensor::{DType, Shape, Tensor};

/// Environment variable for comparison runs: `0` turns dinput's halo kernel
/// off (the residue-class GEMM runs); any other value warns once and keeps it.
/// Its blocks follow the forward's rule (and `AETHER_FORWARD_HALO`, which pins
/// them or, at `0`, turns this kernel off too).
pub const DINPUT_HALO_ENV: &str = "AETHER_DINPUT_HALO";

/// The transposed conv's kernel: the forward's halo core over dy's bindings.
const KERNEL: ConvKernel = ConvKernel {
    name: "conv_dinput_halo",
    parts: &[
        IM2COL,
        include_str!("../../../shaders/conv/dinput/halo.wgsl"),
    ],
    gemm: Some(GemmRuns {
        a: "x",
        b: "w",
        along_k: [true, false],
        fits: |m| [m.c_in % GEMM_RUN == 0, m.c_out % GEMM_RUN == 0],
        // No bias: the accumulators start from zero.
        direct_c: None,
    }),
    f32_inputs: &[],
};

/// The flip of one u32 pair of the filter, shared by flip_filter.wgsl and
/// dweight's reduce (dweight_reduce_flip.wgsl).
pub(crate) const FLIP_PAIR: &str = include_str!("../../../shaders/conv/dinput/flip_pair.wgsl");
const FLIP_FILTER: &str = include_str!("../../../shaders/conv/dinput/flip_filter.wgsl");
const FLIP_WORKGROUP: u32 = 256;

/// The conv whose forward is `meta`'s input gradient: dy's shape in, the
/// filter flipped, channels swapped, padded `R - 1 - top` above (likewise
/// the other sides), so its output is dX's shape. `None` for strides or
/// dilations above 1, and for paddings over `R - 1` (input positions no
/// filter tap reaches).
pub(crate) fn transposed(meta: &ConvShapeMeta) -> Option<ConvShapeMeta> {
    if (meta.stride_h, meta.stride_w, meta.dil_h, meta.dil_w) != (1, 1, 1, 1) {
        return None;
    }
    // Stride 1: h_out = h + top + bottom - r + 1, so the transposed conv's
    // bottom padding is what brings dy's height back to h.
    let top = (meta.r - 1).checked_sub(meta.pad_top)?;
    let left = (meta.s - 1).checked_sub(meta.pad_left)?;
    let bottom = (meta.h + meta.r - 1).checked_sub(meta.h_out + top)?;
    let right = (meta.w + meta.s - 1).checked_sub(meta.w_out + left)?;
    let params = ConvParams {
        c_out: meta.c_in,
        filter: (meta.r, meta.s),
        stride: (1, 1),
        padding: Padding::Explicit {
            top,
            bottom,
            left,
            right,
        },
        dilation: (1, 1),
    };
    let t = ConvShapeMeta::new([meta.n, meta.h_out, meta.w_out, meta.c_out], &params).ok()?;
    debug_assert_eq!((t.h_out, t.w_out), (meta.h, meta.w));
    Some(t)
}

/// `gemm`, dinput's plan for `meta`, with the halo kernel where it is on, fits
/// the transposed conv and compiles (a compile failure has warned once, and
/// the residue-class GEMM runs).
pub(crate) fn with_dinput_halo(
    ctx: &GpuContext,
    gemm: ConvLaunchPlan,
    meta: &ConvShapeMeta,
    tuning: &ConvTuning,
) -> ConvLaunchPlan {
    match tuning.get(DINPUT_HALO_ENV) {
        Some(text) if text.trim() == "0" => return gemm,
        Some(text) => {
            warn_once(
                &format!("dinput-halo-env:{text}"),
                &format!(
                    "{DINPUT_HALO_ENV}={text:?} is not 0 (off): dinput's halo kernel stays on"
                ),
            );
        }
        None => {}
    }
    let Some(t) = transposed(meta) else {
        return gemm;
    };
    let halo = gemm.with_halo(&t, ctx.caps(), tuning, Narrow::DINPUT);
    let compiles = || {
        KERNEL.pipeline(ctx, &halo, &t).is_some()
            && ctx
                .pipelines()
                .get_or_create(&flip_key(), "main", flip_source)
                .is_some()
    };
    if halo != gemm && compiles() {
        halo
    } else {
        gemm
    }
}

fn flip_key() -> PipelineKey {
    PipelineKey::new("conv_flip_filter", "portable")
}

fn flip_source() -> std::borrow::Cow<'static, str> {
    format!("{FLIP_PAIR}\n{FLIP_FILTER}").into()
}

/// Records `meta`'s input gradient into `dx` with `plan`'s halo kernel: the
/// transposed conv of f16 `dy` with `flipped`, the flipped filter of the f16
/// weights `w` where the dweight reduce wrote it, else flipped here first.
pub(crate) fn dispatch(
    ctx: &Arc<GpuContext>,
    plan: &ConvLaunchPlan,
    meta: &ConvShapeMeta,
    dy: &Tensor,
    (w, flipped): (&Tensor, Option<&Tensor>),
    dx: &Tensor,
) -> Result<()> {
    let t = transposed(meta).expect("a planned halo kernel has a transposed conv");
    let wt = match flipped {
        Some(wt) => wt.clone(),
        None => flip_filter(ctx, w, meta)?,
    };
    let pipeline = KERNEL
        .pipeline(ctx, plan, &t)
        .expect("planned halo kernel compiled");
    ctx.dispatch(
        "conv_dinput",
        &pipeline,
        &[buf(dy), buf(&wt), buf(dx)],
        bytemuck::bytes_of(&(meta.n as u32)),
        plan.workgroups,
    )
}

/// The flipped filter's dims: `[R, S, C_out, C_in]`.
pub(crate) fn flipped_dims(meta: &ConvShapeMeta) -> [usize; 4] {
    [meta.r, meta.s, meta.c_out, meta.c_in]
}

/// `wt[R * S - 1 - tap, c_out, c_in] = w[tap, c_in, c_out]`, f16.
pub(crate) fn flip_filter(
    ctx: &Arc<GpuContext>,
    w: &Tensor,
    meta: &ConvShapeMeta,
) -> Result<Tensor> {
    w.expect_dtype("conv2d_dinput flipped weight", DType::F16)?;
    let pipeline = ctx.pipelines().require(&flip_key(), "main", flip_source)?;
    let wt = Tensor::uninit_gpu(ctx, Shape::new(flipped_dims(meta))?, DType::F16)?;
    let limit = ctx.caps().limits.max_compute_workgroups_per_dimension;
    let (grid, row_stride) = flat_grid(wt.numel() / 2, FLIP_WORKGROUP, limit);
    // flip_filter.wgsl's Params: taps, c_in, c_out, row_stride.
    let taps = (meta.r * meta.s) as u32;
    let params = [taps, meta.c_in as u32, meta.c_out as u32, row_stride];
    ctx.dispatch(
        "conv_dinput_flip",
        &pipeline,
        &[buf(w), buf(&wt)],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(wt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_conv_maps_dy_back_to_dx() {
        // Asymmetric padding and filter: 3x5, padded 2 / 0 / 1 / 3.
        let params = ConvParams {
            padding: Padding::Explicit {
                top: 2,
                bottom: 0,
                left: 1,
                right: 3,
            },
            ..ConvParams {
                filter: (3, 5),
                ..ConvParams::new(24, 3, Padding::Valid)
            }
        };
        let meta = ConvShapeMeta::new([2, 9, 11, 16], &params).unwrap();
        let t = transposed(&meta).unwrap();
        assert_eq!(
            [t.h, t.w, t.c_in, t.c_out],
            [meta.h_out, meta.w_out, 24, 16]
        );
        assert_eq!([t.h_out, t.w_out], [9, 11]);
        assert_eq!([t.pad_top, t.pad_left], [0, 3]);
        // Padding past the filter leaves input rows no tap reaches.
        let wide = ConvParams::new(
            8,
            3,
            Padding::Explicit {
                top: 3,
                bottom: 0,
                left: 0,
                right: 0,
            },
        );
        assert!(transposed(&ConvShapeMeta::new([1, 8, 8, 8], &wide).unwrap()).is_none());
        let strided = ConvParams {
            stride: (2, 1),
            ..ConvParams::new(8, 3, Padding::Same)
        };
        assert!(transposed(&ConvShapeMeta::new([1, 8, 8, 8], &strided).unwrap()).is_none());
    }
}
