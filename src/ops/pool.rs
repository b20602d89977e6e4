//! Pooling on NHWC f32 tensors, on the CPU and the GPU: max, average and global
//! average, each with its backward pass.
//!
//! Windows only ever see in-bounds elements: padding never wins a max and is not
//! counted in an average, so it needs no fill value. The window of an output is
//! scanned r-major, then s.
//!
//! Max-pool rule (identical on both devices, bit for bit): a candidate replaces
//! the best so far when it is greater, or when it is NaN and the best is not.
//! Ties therefore go to the first element in scan order, and the first NaN in a
//! window is its max: NaN propagates, and its argmax is the NaN's index. The
//! argmax is the flat index into `x` (a U32 tensor shaped like the output).
//!
//! Backward passes are gathers, not scatters: each input element walks the few
//! output windows that cover it in a fixed (oh, ow) order and sums their
//! contributions. No atomics, no zero-fill pass, and the same bits on every run.
//! Global average pooling reduces each (n, c) plane with a fixed lane-and-tree
//! order (one GPU workgroup per plane), so it is deterministic too.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use crate::conv::{Padding, cast_f16};
use crate::error::{AetherError, Result};
use crate::gpu::{GpuContext, GpuSlice, PipelineKey, flat_grid};
use crate::ops::dropout::{SpatialMask, dropout_backward, spatial_dropout_as};
use crate::ops::{DxStorage, stores_f16};
use crate::tensor::{DType, Shape, Tensor};

const MAX_FORWARD: &str = concat!(
    include_str!("../../shaders/ops/pool_common.wgsl"),
    include_str!("../../shaders/ops/pool_max_forward.wgsl")
);
const MAX_BACKWARD: &str = concat!(
    include_str!("../../shaders/ops/pool_common.wgsl"),
    include_str!("../../shaders/ops/pool_max_backward.wgsl")
);
const MAX_FORWARD_DROPOUT: &str = concat!(
    include_str!("../../shaders/ops/pool_common.wgsl"),
    include_str!("../../shaders/ops/philox.wgsl"),
    include_str!("../../shaders/ops/spatial_mask.wgsl"),
    include_str!("../../shaders/ops/pool_mask.wgsl"),
    include_str!("../../shaders/common/f16_bits.wgsl"),
    include_str!("../../shaders/ops/pool_max_forward.wgsl"),
    include_str!("../../shaders/ops/pool_max_forward_dropout.wgsl")
);
/// The tiled backward's prelude: geometry, the dropout's masks, the f16 cast.
macro_rules! tiled_backward {
    ($grad:literal) => {
        concat!(
            include_str!("../../shaders/ops/pool_common.wgsl"),
            include_str!("../../shaders/ops/philox.wgsl"),
            include_str!("../../shaders/ops/spatial_mask.wgsl"),
            include_str!("../../shaders/ops/pool_mask.wgsl"),
            include_str!("../../shaders/common/f16_bits.wgsl"),
            include_str!($grad),
            include_str!("../../shaders/ops/pool_max_backward_tiled.wgsl")
        )
    };
}
const MAX_BACKWARD_TILED: &str = tiled_backward!("../../shaders/ops/pool_grad_unflagged.wgsl");
/// With an f16 dx that raises the loss scaler's saturation flag.
const MAX_BACKWARD_TILED_FLAG: &str = tiled_backward!("../../shaders/ops/pool_grad_flag.wgsl");
const AVG_FORWARD: &str = concat!(
    include_str!("../../shaders/ops/pool_common.wgsl"),
    include_str!("../../shaders/ops/pool_avg_forward.wgsl")
);
const AVG_BACKWARD: &str = concat!(
    include_str!("../../shaders/ops/pool_common.wgsl"),
    include_str!("../../shaders/ops/pool_avg_backward.wgsl")
);
const GLOBAL_AVG_FORWARD: &str = include_str!("../../shaders/ops/pool_global_avg_forward.wgsl");
const GLOBAL_AVG_BACKWARD: &str = include_str!("../../shaders/ops/pool_global_avg_backward.wgsl");

/// Invocations per workgroup of every pooling kernel; also the lane count of the
/// global-average reduction, which the CPU path mirrors.
const WORKGROUP: u32 = 256;

/// Largest element count of any tensor the kernels index (their indices are u32
/// and the argmax must fit one).
const MAX_ELEMENTS: usize = i32::MAX as usize;

/// A pooling window: size `(height, width)`, stride `(down, across)` and padding
/// (`Same` pads `(f - 1) / 2` on each side).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolParams {
    pub filter: (usize, usize),
    pub stride: (usize, usize),
    pub padding: Padding,
}

impl PoolParams {
    /// A square `size x size` window moving `stride` in both directions.
    pub fn new(size: usize, stride: usize, padding: Padding) -> Self {
        Self {
            filter: (size, size),
            stride: (stride, stride),
            padding,
        }
    }
}

/// The checked geometry of one pooling: the single place sizes are computed.
#[derive(Clone, Copy, Debug)]
struct PoolGeometry {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    filter_h: usize,
    filter_w: usize,
    stride_h: usize,
    stride_w: usize,
    pad_top: usize,
    pad_left: usize,
    h_out: usize,
    w_out: usize,
}

impl PoolGeometry {
    /// Whether the windows partition the input: stride equal to the filter and
    /// no padding, so no element is in two windows. Rows or columns left over
    /// past the last window (fewer than a stride) are in none: the backward
    /// writes them as zeros with that last window.
    fn windows_tile_input(&self) -> bool {
        (self.stride_h, self.stride_w) == (self.filter_h, self.filter_w)
            && (self.pad_top, self.pad_left) == (0, 0)
    }

    /// Geometry of pooling an `input` (NHWC) with `p`, or a typed error when a size
    /// is zero, the window does not fit the padded input, or a window would hold
    /// padding only.
    fn new(op: &'static str, input: [usize; 4], p: &PoolParams) -> Result<Self> {
        let [n, h, w, c] = input;
        let (filter_h, filter_w) = p.filter;
        let (stride_h, stride_w) = p.stride;
        let invalid = |reason: String| AetherError::InvalidShape {
            op,
            shape: input.to_vec(),
            reason,
        };
        if [n, h, w, c, filter_h, filter_w, stride_h, stride_w].contains(&0) {
            return Err(invalid(format!(
                "sizes, filter {:?} and stride {:?} must all be >= 1",
                p.filter, p.stride
            )));
        }
        let (pad_top, pad_bottom, pad_left, pad_right) = match p.padding {
            Padding::Same => (
                (filter_h - 1) / 2,
                (filter_h - 1) / 2,
                (filter_w - 1) / 2,
                (filter_w - 1) / 2,
            ),
            Padding::Valid => (0, 0, 0, 0),
            Padding::Explicit {
                top,
                bottom,
                left,
                right,
            } => (top, bottom, left, right),
        };
        // Every size within the kernels' i32 index range before any
        // arithmetic: no sum or product below can overflow, and none is cut
        // short on its way to the GPU's u32 parameters.
        let sizes = [n, h, w, c, filter_h, filter_w, stride_h, stride_w];
        let pads = [pad_top, pad_bottom, pad_left, pad_right];
        if sizes.iter().chain(&pads).any(|&v| v > MAX_ELEMENTS) {
            return Err(invalid(format!(
                "filter {:?}, stride {:?}, padding {:?} or a size exceeds the 2^31 range of \
                 the kernels' indices",
                p.filter, p.stride, p.padding
            )));
        }
        let padded_h = h + pad_top + pad_bottom;
        let padded_w = w + pad_left + pad_right;
        if padded_h < filter_h || padded_w < filter_w {
            return Err(invalid(format!(
                "window {:?} is larger than the padded input {padded_h}x{padded_w}: \
                 the output would be empty",
                p.filter
            )));
        }
        let h_out = (padded_h - filter_h) / stride_h + 1;
        let w_out = (padded_w - filter_w) / stride_w + 1;
        // Window starts grow monotonically, so only the first and the last window
        // along each axis can lie entirely in the padding.
        let padding_only = pad_top >= filter_h
            || pad_left >= filter_w
            || (h_out - 1) * stride_h >= h + pad_top
            || (w_out - 1) * stride_w >= w + pad_left;
        if padding_only {
            return Err(invalid(format!(
                "padding {:?} is so wide that a {:?} window would cover padding only",
                p.padding, p.filter
            )));
        }
        let geometry = Self {
            n,
            h,
            w,
            c,
            filter_h,
            filter_w,
            stride_h,
            stride_w,
            pad_top,
            pad_left,
            h_out,
            w_out,
        };
        let within = |dims: [usize; 4]| {
            dims.iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .is_some_and(|len| len <= MAX_ELEMENTS)
        };
        if !within(geometry.input_dims()) || !within(geometry.output_dims()) {
            return Err(invalid(format!(
                "input or output ({:?}) exceeds the 2^31 element range of the kernels' indices",
                geometry.output_dims()
            )));
        }
        Ok(geometry)
    }

    fn input_dims(&self) -> [usize; 4] {
        [self.n, self.h, self.w, self.c]
    }

    fn output_dims(&self) -> [usize; 4] {
        [self.n, self.h_out, self.w_out, self.c]
    }

    fn input_len(&self) -> usize {
        self.input_dims().iter().product()
    }

    fn output_len(&self) -> usize {
        self.output_dims().iter().product()
    }

    /// Refuses, where `ctx`'s driver cuts loops short
    /// ([`crate::gpu::GpuCapabilities::loop_iteration_limit`]), a window whose
    /// scan (rows, and columns in each row) would pass the limit in one
    /// invocation; the backward's covering windows are no more.
    fn check_loops(&self, op: &'static str, ctx: &GpuContext) -> Result<()> {
        let iterations = (self.filter_h * (self.filter_w + 1)) as u64;
        match ctx.caps().loop_iteration_limit() {
            Some(limit) if iterations >= limit => Err(AetherError::TooLarge {
                what: format!(
                    "{op}: a {}x{} window scans in {iterations} loop iterations an invocation \
                     on {:?}, whose driver stops invocations after {limit}",
                    self.filter_h,
                    self.filter_w,
                    ctx.caps().adapter_name
                ),
                bytes: iterations,
                limit,
            }),
            _ => Ok(()),
        }
    }

    fn input_index(&self, n: usize, r: usize, s: usize, ch: usize) -> usize {
        ((n * self.h + r) * self.w + s) * self.c + ch
    }

    fn output_index(&self, n: usize, oh: usize, ow: usize, ch: usize) -> usize {
        ((n * self.h_out + oh) * self.w_out + ow) * self.c + ch
    }

    /// In-bounds input rows of output row `oh`'s window.
    fn window_rows(&self, oh: usize) -> Range<usize> {
        window_span(oh, self.stride_h, self.pad_top, self.filter_h, self.h)
    }

    /// In-bounds input columns of output column `ow`'s window.
    fn window_cols(&self, ow: usize) -> Range<usize> {
        window_span(ow, self.stride_w, self.pad_left, self.filter_w, self.w)
    }

    /// Number of in-bounds elements in the window of output `(oh, ow)`.
    fn window_count(&self, oh: usize, ow: usize) -> usize {
        self.window_rows(oh).len() * self.window_cols(ow).len()
    }

    /// Output rows whose windows cover input row `ih`.
    fn covering_rows(&self, ih: usize) -> Range<usize> {
        covering_span(ih, self.stride_h, self.pad_top, self.filter_h, self.h_out)
    }

    /// Output columns whose windows cover input column `iw`.
    fn covering_cols(&self, iw: usize) -> Range<usize> {
        covering_span(iw, self.stride_w, self.pad_left, self.filter_w, self.w_out)
    }

    /// The kernels' uniform block (`Params` in pool_common.wgsl) for a launch over
    /// `len` elements.
    fn params(&self, len: usize, row_stride: u32) -> [u32; 20] {
        self.params_with(len, row_stride, [0; 6])
    }

    /// [`Self::params`] with a folded spatial dropout's draw words.
    fn params_with(&self, len: usize, row_stride: u32, draws: [u32; 6]) -> [u32; 20] {
        let [t, scale, k0, k1, step, stream] = draws;
        [
            self.n as u32,
            self.h as u32,
            self.w as u32,
            self.c as u32,
            self.h_out as u32,
            self.w_out as u32,
            self.filter_h as u32,
            self.filter_w as u32,
            self.stride_h as u32,
            self.stride_w as u32,
            self.pad_top as u32,
            self.pad_left as u32,
            len as u32,
            row_stride,
            t,
            scale,
            k0,
            k1,
            step,
            stream,
        ]
    }
}

/// In-bounds positions of output position `o`'s window along one axis
/// (`window_span` in pool_common.wgsl).
fn window_span(o: usize, stride: usize, pad: usize, filter: usize, size: usize) -> Range<usize> {
    let start = o * stride;
    start.saturating_sub(pad)..(start + filter).saturating_sub(pad).min(size)
}

/// Output positions along one axis whose windows cover input position `i`
/// (`covering_span` in pool_common.wgsl).
fn covering_span(
    i: usize,
    stride: usize,
    pad: usize,
    filter: usize,
    size_out: usize,
) -> Range<usize> {
    let hi = ((i + pad) / stride + 1).min(size_out);
    let lo = (i + pad + 1).saturating_sub(filter).div_ceil(stride);
    lo.min(hi)..hi
}

/// The first NaN wins, then strictly greater values: see the module docs.
fn beats(candidate: f32, best: f32) -> bool {
    if best.is_nan() {
        false
    } else {
        candidate.is_nan() || candidate > best
    }
}

/// The operands of a max pool's backward: an f32 `dy` and a U32 `argmax`, both
/// of the output's shape and on one device.
fn check_max_backward(
    op: &'static str,
    dy: &Tensor,
    argmax: &Tensor,
    g: &PoolGeometry,
) -> Result<()> {
    require_f32(op, dy)?;
    argmax.expect_dtype(op, DType::U32)?;
    require_dims(op, dy, &g.output_dims())?;
    require_dims(op, argmax, &g.output_dims())?;
    if !dy.device().same_as(&argmax.device()) {
        return Err(AetherError::DeviceMismatch {
            op,
            a: dy.device().name(),
            b: argmax.device().name(),
        });
    }
    Ok(())
}

fn require_f32(op: &'static str, t: &Tensor) -> Result<()> {
    t.expect_dtype(op, DType::F32)
}

fn require_dims(op: &'static str, t: &Tensor, expected: &[usize]) -> Result<()> {
    if t.dims() == expected {
        Ok(())
    } else {
        Err(AetherError::ShapeMismatch {
            op,
            expected: expected.to_vec(),
            actual: t.dims().to_vec(),
        })
    }
}

fn gpu_buffer(t: &Tensor) -> GpuSlice<'_> {
    t.gpu_slice().expect("operand checked to be on the GPU")
}

/// The GPU context of a tensor that is not on the host.
fn gpu_context(t: &Tensor) -> &Arc<GpuContext> {
    t.gpu_context().expect("non-host tensor is on a GPU")
}

fn pipeline(
    ctx: &GpuContext,
    (kernel, entry): (&'static str, &'static str),
    source: &'static str,
) -> Result<Arc<wgpu::ComputePipeline>> {
    ctx.pipelines()
        .require(&PipelineKey::new(kernel, "portable"), entry, || {
            source.into()
        })
}

/// Records one flat launch of `kernel` (entry point `main`) over `len`
/// elements; `params` builds the uniform block from the grid's row stride.
fn launch_flat(
    ctx: &GpuContext,
    kernel: &'static str,
    source: &'static str,
    buffers: &[GpuSlice<'_>],
    len: usize,
    params: impl FnOnce(u32) -> Vec<u32>,
) -> Result<()> {
    launch_entry(ctx, (kernel, "main"), kernel, source, buffers, len, params)
}

/// [`launch_flat`] of entry point `entry`, as pipeline `key` (kernel and
/// entry), its dispatches labelled `label`.
fn launch_entry(
    ctx: &GpuContext,
    key: (&'static str, &'static str),
    label: &'static str,
    source: &'static str,
    buffers: &[GpuSlice<'_>],
    len: usize,
    params: impl FnOnce(u32) -> Vec<u32>,
) -> Result<()> {
    let pipeline = pipeline(ctx, key, source)?;
    let (grid, row_stride) = flat_grid(
        len,
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    let params = params(row_stride);
    ctx.dispatch(
        label,
        &pipeline,
        buffers,
        bytemuck::cast_slice(&params),
        grid,
    )
}

/// Max pooling of NHWC f32 `x`: the output and, for each output element, the
/// flat index into `x` of its max (a U32 tensor of the same shape). Padding never
/// wins, ties go to the first element in r-major scan order, and a NaN in the
/// window is the max (the first one, if several).
pub fn max_pool2d(x: &Tensor, p: &PoolParams) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    require_f32(OP, x)?;
    let g = PoolGeometry::new(OP, x.shape().nhwc(OP)?, p)?;
    let out_dims = g.output_dims().to_vec();
    if let Some(data) = x.host_f32() {
        let row = g.w_out * g.c;
        let mut values = vec![0.0f32; g.output_len()];
        let mut argmax = vec![0u32; g.output_len()];
        values
            .par_chunks_mut(row)
            .zip(argmax.par_chunks_mut(row))
            .enumerate()
            .for_each(|(row_index, (values, argmax))| {
                let (n, oh) = (row_index / g.h_out, row_index % g.h_out);
                let rows = g.window_rows(oh);
                for ow in 0..g.w_out {
                    let cols = g.window_cols(ow);
                    for ch in 0..g.c {
                        let mut best_index = g.input_index(n, rows.start, cols.start, ch);
                        let mut best = data[best_index];
                        for r in rows.clone() {
                            for s in cols.clone() {
                                let i = g.input_index(n, r, s, ch);
                                if beats(data[i], best) {
                                    best = data[i];
                                    best_index = i;
                                }
                            }
                        }
                        values[ow * g.c + ch] = best;
                        argmax[ow * g.c + ch] = best_index as u32;
                    }
                }
            });
        let device = x.device();
        return Ok((
            Tensor::from_f32(out_dims.clone(), values, &device)?,
            Tensor::from_u32(out_dims, argmax, &device)?,
        ));
    }
    let ctx = gpu_context(x);
    g.check_loops(OP, ctx)?;
    let y = Tensor::uninit_gpu(ctx, Shape::new(out_dims.clone())?, DType::F32)?;
    let argmax = Tensor::uninit_gpu(ctx, Shape::new(out_dims)?, DType::U32)?;
    launch_flat(
        ctx,
        "pool_max_forward",
        MAX_FORWARD,
        &[gpu_buffer(x), gpu_buffer(&y), gpu_buffer(&argmax)],
        g.output_len(),
        |row_stride| g.params(g.output_len(), row_stride).to_vec(),
    )?;
    Ok((y, argmax))
}

/// [`max_pool2d`] with `y` stored as `output`: F32, or F16 for a consumer that
/// rounds its input to f16 anyway (a conv with f16 kernels: saturated at
/// +-65504 and rounded as `half::f16::from_f32`, NaN kept, the values it
/// would have rounded to). On the GPU F16 needs channels in fours.
pub fn max_pool2d_as(x: &Tensor, p: &PoolParams, output: DType) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    if !stores_f16(OP, x.dims(), "output", output)? {
        return max_pool2d(x, p);
    }
    require_f32(OP, x)?;
    let g = PoolGeometry::new(OP, x.shape().nhwc(OP)?, p)?;
    if x.host_f32().is_some() {
        let (y, argmax) = max_pool2d(x, p)?;
        return Ok((cast_f16(&y, true)?, argmax));
    }
    if !g.c.is_multiple_of(4) {
        return Err(AetherError::InvalidShape {
            op: OP,
            shape: x.dims().to_vec(),
            reason: format!("F16 output needs channels in fours, got {}", g.c),
        });
    }
    let ctx = gpu_context(x);
    g.check_loops(OP, ctx)?;
    let y = Tensor::uninit_gpu(ctx, Shape::new(g.output_dims())?, DType::F16)?;
    let argmax = Tensor::uninit_gpu(ctx, Shape::new(g.output_dims())?, DType::U32)?;
    launch_entry(
        ctx,
        ("pool_max_forward_f16", "main_f16"),
        "pool_max_forward",
        MAX_FORWARD_DROPOUT,
        &[gpu_buffer(x), gpu_buffer(&y), gpu_buffer(&argmax)],
        g.output_len() / 4,
        |row_stride| g.params(g.output_len(), row_stride).to_vec(),
    )?;
    Ok((y, argmax))
}

/// Gradient of [`max_pool2d`] with respect to its input of shape `input_dims`:
/// each input element gathers the `dy` of every covering window whose `argmax`
/// is that element, summed in (oh, ow) order.
pub fn max_pool2d_backward(
    dy: &Tensor,
    argmax: &Tensor,
    input_dims: [usize; 4],
    p: &PoolParams,
) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    let g = PoolGeometry::new(OP, input_dims, p)?;
    check_max_backward(OP, dy, argmax, &g)?;
    if let (Some(dy_data), Some(argmax_data)) = (dy.host_f32(), argmax.host_u32()) {
        let mut dx = vec![0.0f32; g.input_len()];
        dx.par_chunks_mut(g.w * g.c)
            .enumerate()
            .for_each(|(row_index, dx_row)| {
                let (n, ih) = (row_index / g.h, row_index % g.h);
                let rows = g.covering_rows(ih);
                for iw in 0..g.w {
                    let cols = g.covering_cols(iw);
                    for ch in 0..g.c {
                        let i = g.input_index(n, ih, iw, ch);
                        let mut sum = 0.0f32;
                        for oh in rows.clone() {
                            for ow in cols.clone() {
                                let o = g.output_index(n, oh, ow, ch);
                                if argmax_data[o] as usize == i {
                                    sum += dy_data[o];
                                }
                            }
                        }
                        dx_row[iw * g.c + ch] = sum;
                    }
                }
            });
        return Tensor::from_f32(input_dims.to_vec(), dx, &dy.device());
    }
    let ctx = gpu_context(dy);
    g.check_loops(OP, ctx)?;
    let dx = Tensor::uninit_gpu(ctx, Shape::new(input_dims.to_vec())?, DType::F32)?;
    // Windows that partition the input: one invocation per window writes all
    // of it and any leftover edge (same bits as the gather); else one per
    // input element gathers.
    let (kernel, source, len) = if g.windows_tile_input() {
        (
            "pool_max_backward_tiled",
            MAX_BACKWARD_TILED,
            g.output_len(),
        )
    } else {
        ("pool_max_backward", MAX_BACKWARD, g.input_len())
    };
    launch_flat(
        ctx,
        kernel,
        source,
        &[gpu_buffer(dy), gpu_buffer(argmax), gpu_buffer(&dx)],
        len,
        |row_stride| g.params(len, row_stride).to_vec(),
    )?;
    Ok(dx)
}

/// The per-sample output `[H_out, W_out, C]` of pooling a per-sample input
/// `[H, W, C]` with `p`, with every check the kernels make (a window of
/// padding only included), so a layer that builds can always run.
pub fn pooled_dims(op: &'static str, input: [usize; 3], p: &PoolParams) -> Result<[usize; 3]> {
    let [h, w, c] = input;
    let g = PoolGeometry::new(op, [1, h, w, c], p)?;
    Ok([g.h_out, g.w_out, g.c])
}

/// Whether pooling NHWC `input` with `p` partitions it into windows (stride
/// equal to the filter, no padding; rows or columns left over at the far edges
/// are in no window): what [`max_pool2d_dropout`] needs.
pub fn windows_tile(input: [usize; 4], p: &PoolParams) -> bool {
    PoolGeometry::new("windows_tile", input, p).is_ok_and(|g| g.windows_tile_input())
}

/// A spatial dropout folded into the max pooling before it (see
/// [`max_pool2d_dropout`]): its rate, seed and step, as
/// [`crate::ops::dropout::spatial_dropout`] takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolDropout {
    pub rate: f32,
    pub seed: u64,
    pub step: u32,
}

impl PoolDropout {
    fn mask(&self, op: &'static str, output_dims: [usize; 4]) -> Result<SpatialMask> {
        SpatialMask::new(op, output_dims, self.rate, self.seed, self.step)
    }
}

/// The geometry of a max pool with a folded dropout: windows that tile the
/// input (the backward writes each window once), and channels in fours for F16.
fn fused_geometry(
    op: &'static str,
    input_dims: [usize; 4],
    p: &PoolParams,
    output: DType,
) -> Result<PoolGeometry> {
    let g = PoolGeometry::new(op, input_dims, p)?;
    let reason = if !g.windows_tile_input() {
        "the windows must partition the input (stride = filter, no padding)".into()
    } else if !matches!(output, DType::F32 | DType::F16) {
        format!("output {output:?}: F32 or F16")
    } else if output == DType::F16 && !g.c.is_multiple_of(4) {
        format!("F16 output needs channels in fours, got {}", g.c)
    } else {
        return Ok(g);
    };
    Err(AetherError::InvalidShape {
        op,
        shape: input_dims.to_vec(),
        reason,
    })
}

/// [`max_pool2d`] followed by [`crate::ops::dropout::spatial_dropout_as`] of
/// its output, in one pass: `(y, argmax)` bit-identical to the two (the mask
/// is not kept: [`max_pool2d_dropout_backward`] draws it again). For windows
/// that partition the input (stride = filter, no padding); `output` F32, or F16 for channels in fours.
pub fn max_pool2d_dropout(
    x: &Tensor,
    p: &PoolParams,
    dropout: &PoolDropout,
    output: DType,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d_dropout";
    require_f32(OP, x)?;
    let g = fused_geometry(OP, x.shape().nhwc(OP)?, p, output)?;
    let mask = dropout.mask(OP, g.output_dims())?;
    if x.host_f32().is_some() {
        let (pooled, argmax) = max_pool2d(x, p)?;
        let (y, _) = spatial_dropout_as(&pooled, dropout.rate, dropout.seed, dropout.step, output)?;
        return Ok((y, argmax));
    }
    let ctx = gpu_context(x);
    g.check_loops(OP, ctx)?;
    let y = Tensor::uninit_gpu(ctx, Shape::new(g.output_dims())?, output)?;
    let argmax = Tensor::uninit_gpu(ctx, Shape::new(g.output_dims())?, DType::U32)?;
    // Four channels an invocation where they come in fours (f16 always does).
    let (key, per_lane) = match output {
        DType::F16 => (("pool_max_forward_dropout_f16", "main_dropout_f16"), 4),
        _ if g.c.is_multiple_of(4) => (("pool_max_forward_dropout4", "main_dropout4"), 4),
        _ => (("pool_max_forward_dropout", "main_dropout"), 1),
    };
    launch_entry(
        ctx,
        key,
        "pool_max_forward",
        MAX_FORWARD_DROPOUT,
        &[gpu_buffer(x), gpu_buffer(&y), gpu_buffer(&argmax)],
        g.output_len() / per_lane,
        |row_stride| {
            g.params_with(g.output_len(), row_stride, mask.draw_words())
                .to_vec()
        },
    )?;
    Ok((y, argmax))
}

/// The gradient of [`max_pool2d_dropout`] with respect to its input of shape
/// `input_dims`: `dy` times the same spatial mask, then [`max_pool2d_backward`],
/// in one pass and bit-identical to the two.
pub fn max_pool2d_dropout_backward(
    dy: &Tensor,
    argmax: &Tensor,
    input_dims: [usize; 4],
    p: &PoolParams,
    dropout: &PoolDropout,
) -> Result<Tensor> {
    const OP: &str = "max_pool2d_dropout_backward";
    let g = fused_geometry(OP, input_dims, p, DType::F32)?;
    check_max_backward(OP, dy, argmax, &g)?;
    let mask = dropout.mask(OP, g.output_dims())?;
    if dy.host_f32().is_some() {
        let mask = Tensor::from_f32(
            g.output_dims().to_vec(),
            mask.host(g.output_len()),
            &dy.device(),
        )?;
        return max_pool2d_backward(&dropout_backward(dy, &mask)?, argmax, input_dims, p);
    }
    let ctx = gpu_context(dy);
    g.check_loops(OP, ctx)?;
    let dx = Tensor::uninit_gpu(ctx, Shape::new(input_dims.to_vec())?, DType::F32)?;
    let (key, per_lane) = if g.c.is_multiple_of(4) {
        (("pool_max_backward_tiled_dropout4", "main_dropout4"), 4)
    } else {
        (("pool_max_backward_tiled_dropout", "main_dropout"), 1)
    };
    launch_entry(
        ctx,
        key,
        "pool_max_backward_tiled",
        MAX_BACKWARD_TILED,
        &[gpu_buffer(dy), gpu_buffer(argmax), gpu_buffer(&dx)],
        g.output_len() / per_lane,
        |row_stride| {
            g.params_with(g.output_len(), row_stride, mask.draw_words())
                .to_vec()
        },
    )?;
    Ok(dx)
}

/// [`max_pool2d_backward`] (after a folded spatial dropout where `dropout`
/// is given: [`max_pool2d_dropout_backward`]) with dx stored as `dx`:
/// `DType::F16` clips it to +-65504 (NaN kept) and rounds it as
/// `half::f16::from_f32`, exactly as a conv with f16 kernels casts the
/// gradient it is given, for a conv before this pool. On the GPU that needs
/// windows that partition the input and channels in fours.
pub fn max_pool2d_backward_as(
    dy: &Tensor,
    argmax: &Tensor,
    input_dims: [usize; 4],
    p: &PoolParams,
    dropout: Option<&PoolDropout>,
    dx: DType,
) -> Result<Tensor> {
    max_pool2d_backward_into(dy, argmax, input_dims, p, dropout, DxStorage::plain(dx))
}

/// [`max_pool2d_backward_as`] with dx stored as `dx_out` says: an f16 one
/// raises the loss scaler's saturation flag where given, on the GPU.
pub(crate) fn max_pool2d_backward_into(
    dy: &Tensor,
    argmax: &Tensor,
    input_dims: [usize; 4],
    p: &PoolParams,
    dropout: Option<&PoolDropout>,
    dx_out: DxStorage<'_>,
) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    if !stores_f16(OP, &input_dims, "dx as", dx_out.dtype)? {
        return match dropout {
            Some(d) => max_pool2d_dropout_backward(dy, argmax, input_dims, p, d),
            None => max_pool2d_backward(dy, argmax, input_dims, p),
        };
    }
    if dy.host_f32().is_some() {
        let f32_out = DxStorage::plain(DType::F32);
        let dx = max_pool2d_backward_into(dy, argmax, input_dims, p, dropout, f32_out)?;
        return cast_f16(&dx, true);
    }
    let g = PoolGeometry::new(OP, input_dims, p)?;
    if !g.windows_tile_input() || !g.c.is_multiple_of(4) {
        return Err(AetherError::InvalidShape {
            op: OP,
            shape: input_dims.to_vec(),
            reason: "dx as F16 needs windows that partition the input and channels in fours".into(),
        });
    }
    check_max_backward(OP, dy, argmax, &g)?;
    let ctx = gpu_context(dy);
    g.check_loops(OP, ctx)?;
    let flag = dx_out.flag_beside(OP, dy)?;
    let dx = Tensor::uninit_gpu(ctx, Shape::new(input_dims.to_vec())?, DType::F16)?;
    let draws = match dropout {
        Some(d) => d.mask(OP, g.output_dims())?.draw_words(),
        None => [0; 6],
    };
    let (kernel, entry) = match (dropout.is_some(), flag.is_some()) {
        (false, false) => ("pool_max_backward_tiled_f16", "main4_f16"),
        (false, true) => ("pool_max_backward_tiled_f16_flag", "main4_f16"),
        (true, false) => ("pool_max_backward_tiled_dropout_f16", "main_dropout4_f16"),
        (true, true) => (
            "pool_max_backward_tiled_dropout_f16_flag",
            "main_dropout4_f16",
        ),
    };
    let source = match flag {
        Some(_) => MAX_BACKWARD_TILED_FLAG,
        None => MAX_BACKWARD_TILED,
    };
    let mut buffers = vec![gpu_buffer(dy), gpu_buffer(argmax), gpu_buffer(&dx)];
    buffers.extend(flag.map(gpu_buffer));
    launch_entry(
        ctx,
        (kernel, entry),
        "pool_max_backward_tiled",
        source,
        &buffers,
        g.output_len() / 4,
        |row_stride| g.params_with(g.output_len(), row_stride, draws).to_vec(),
    )?;
    Ok(dx)
}

/// Average pooling of NHWC f32 `x`: the mean of each window's in-bounds elements
/// (padding is not counted).
pub fn avg_pool2d(x: &Tensor, p: &PoolParams) -> Result<Tensor> {
    const OP: &str = "avg_pool2d";
    require_f32(OP, x)?;
    let g = PoolGeometry::new(OP, x.shape().nhwc(OP)?, p)?;
    let out_dims = g.output_dims().to_vec();
    if let Some(data) = x.host_f32() {
        let mut values = vec![0.0f32; g.output_len()];
        values
            .par_chunks_mut(g.w_out * g.c)
            .enumerate()
            .for_each(|(row_index, values)| {
                let (n, oh) = (row_index / g.h_out, row_index % g.h_out);
                let rows = g.window_rows(oh);
                for ow in 0..g.w_out {
                    let cols = g.window_cols(ow);
                    let count = g.window_count(oh, ow) as f32;
                    for ch in 0..g.c {
                        let mut sum = 0.0f32;
                        for r in rows.clone() {
                            for s in cols.clone() {
                                sum += data[g.input_index(n, r, s, ch)];
                            }
                        }
                        values[ow * g.c + ch] = sum / count;
                    }
                }
            });
        return Tensor::from_f32(out_dims, values, &x.device());
    }
    let ctx = gpu_context(x);
    g.check_loops(OP, ctx)?;
    let y = Tensor::uninit_gpu(ctx, Shape::new(out_dims)?, DType::F32)?;
    launch_flat(
        ctx,
        "pool_avg_forward",
        AVG_FORWARD,
        &[gpu_buffer(x), gpu_buffer(&y)],
        g.output_len(),
        |row_stride| g.params(g.output_len(), row_stride).to_vec(),
    )?;
    Ok(y)
}

/// Gradient of [`avg_pool2d`] with respect to its input of shape `input_dims`:
/// each input element gathers `dy / count` from every window covering it.
pub fn avg_pool2d_backward(dy: &Tensor, input_dims: [usize; 4], p: &PoolParams) -> Result<Tensor> {
    const OP: &str = "avg_pool2d_backward";
    require_f32(OP, dy)?;
    let g = PoolGeometry::new(OP, input_dims, p)?;
    require_dims(OP, dy, &g.output_dims())?;
    if let Some(dy_data) = dy.host_f32() {
        let mut dx = vec![0.0f32; g.input_len()];
        dx.par_chunks_mut(g.w * g.c)
            .enumerate()
            .for_each(|(row_index, dx_row)| {
                let (n, ih) = (row_index / g.h, row_index % g.h);
                let rows = g.covering_rows(ih);
                for iw in 0..g.w {
                    let cols = g.covering_cols(iw);
                    for ch in 0..g.c {
                        let mut sum = 0.0f32;
                        for oh in rows.clone() {
                            for ow in cols.clone() {
                                let count = g.window_count(oh, ow) as f32;
                                sum += dy_data[g.output_index(n, oh, ow, ch)] / count;
                            }
                        }
                        dx_row[iw * g.c + ch] = sum;
                    }
                }
            });
        return Tensor::from_f32(input_dims.to_vec(), dx, &dy.device());
    }
    let ctx = gpu_context(dy);
    g.check_loops(OP, ctx)?;
    let dx = Tensor::uninit_gpu(ctx, Shape::new(input_dims.to_vec())?, DType::F32)?;
    launch_flat(
        ctx,
        "pool_avg_backward",
        AVG_BACKWARD,
        &[gpu_buffer(dy), gpu_buffer(&dx)],
        g.input_len(),
        |row_stride| g.params(g.input_len(), row_stride).to_vec(),
    )?;
    Ok(dx)
}

/// Checks the input dims of a global pooling and returns them.
fn global_dims(op: &'static str, dims: &[usize]) -> Result<[usize; 4]> {
    let [n, h, w, c] = Shape::new(dims.to_vec())
        .map_err(|_| AetherError::InvalidShape {
            op,
            shape: dims.to_vec(),
            reason: "every size must be >= 1".into(),
        })?
        .nhwc(op)?;
    if n * h * w * c > MAX_ELEMENTS {
        return Err(AetherError::InvalidShape {
            op,
            shape: dims.to_vec(),
            reason: "exceeds the 2^31 element range of the kernels' indices".into(),
        });
    }
    Ok([n, h, w, c])
}

/// Lanes that sum one (n, c) plane in the global average pool
/// (`PLANE_LANES` in pool_global_avg_forward.wgsl).
const PLANE_LANES: usize = 16;
/// The most loop iterations one lane of the global average pool runs in one
/// dispatch. lavapipe (llvmpipe) ends every invocation's loops after 65535
/// iterations in all (its loop limiter, shared by all loops of a shader) and
/// silently returned 0.125 for a [1, 1024, 1024, 1] tensor of ones, whose
/// lanes ran 65536; a longer plane takes several dispatches.
const LANE_ITERATIONS: usize = 1 << 14;
/// Planes per workgroup of that kernel (`PLANES_PER_GROUP`).
const PLANES_PER_GROUP: usize = WORKGROUP as usize / PLANE_LANES;

/// Sum of one (n, c) plane in the GPU kernel's order: lane `t` adds elements
/// `t, t + PLANE_LANES, ...` in turn, then a tree with strides
/// `PLANE_LANES / 2 .. 1` adds the lanes.
fn plane_sum(plane: impl Fn(usize) -> f32, hw: usize) -> f32 {
    let mut lanes = [0.0f32; PLANE_LANES];
    for (lane, partial) in lanes.iter_mut().enumerate() {
        for i in (lane..hw).step_by(PLANE_LANES) {
            *partial += plane(i);
        }
    }
    let mut stride = lanes.len() / 2;
    while stride > 0 {
        for lane in 0..stride {
            lanes[lane] += lanes[lane + stride];
        }
        stride /= 2;
    }
    lanes[0]
}

/// Mean over H and W of NHWC f32 `x`: `[N, H, W, C] -> [N, C]`, reduced in a fixed
/// order so two runs give the same bits.
pub fn global_avg_pool(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "global_avg_pool";
    require_f32(OP, x)?;
    let [n, h, w, c] = global_dims(OP, x.dims())?;
    let hw = h * w;
    if let Some(data) = x.host_f32() {
        let values = (0..n * c)
            .into_par_iter()
            .map(|pair| {
                let base = (pair / c) * hw * c + pair % c;
                plane_sum(|i| data[base + i * c], hw) / hw as f32
            })
            .collect();
        return Tensor::from_f32(vec![n, c], values, &x.device());
    }
    let ctx = gpu_context(x);
    let pipeline = pipeline(ctx, ("pool_global_avg_forward", "main"), GLOBAL_AVG_FORWARD)?;
    let y = Tensor::uninit_gpu(ctx, Shape::new(vec![n, c])?, DType::F32)?;
    // PLANES_PER_GROUP (n, c) pairs per workgroup.
    let (grid, row_stride) = flat_grid(
        (n * c).div_ceil(PLANES_PER_GROUP),
        1,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    // Each lane's loop in dispatches of at most LANE_ITERATIONS, the lanes'
    // sums carried between them: the same additions in the same order.
    let per_dispatch = LANE_ITERATIONS * PLANE_LANES;
    let dispatches = hw.div_ceil(per_dispatch);
    let carry_len = if dispatches > 1 {
        n * c * PLANE_LANES
    } else {
        1
    };
    let carry = Tensor::uninit_gpu(ctx, Shape::new([carry_len])?, DType::F32)?;
    for k in 0..dispatches {
        let (first, end) = (k * per_dispatch, ((k + 1) * per_dispatch).min(hw));
        let last = u32::from(k + 1 == dispatches);
        let params = [
            hw as u32,
            c as u32,
            (n * c) as u32,
            row_stride,
            first as u32,
            end as u32,
            last,
        ];
        ctx.dispatch(
            "pool_global_avg_forward",
            &pipeline,
            &[gpu_buffer(x), gpu_buffer(&y), gpu_buffer(&carry)],
            bytemuck::cast_slice(&params),
            grid,
        )?;
    }
    Ok(y)
}

/// Gradient of [`global_avg_pool`] with respect to its input of shape
/// `input_dims`: `dx[n, h, w, c] = dy[n, c] / (H * W)`.
pub fn global_avg_pool_backward(dy: &Tensor, input_dims: [usize; 4]) -> Result<Tensor> {
    const OP: &str = "global_avg_pool_backward";
    require_f32(OP, dy)?;
    let [n, h, w, c] = global_dims(OP, &input_dims)?;
    require_dims(OP, dy, &[n, c])?;
    let hw = h * w;
    if let Some(dy_data) = dy.host_f32() {
        let scale = hw as f32;
        let dx = (0..n * hw * c)
            .into_par_iter()
            .map(|i| dy_data[(i / (hw * c)) * c + i % c] / scale)
            .collect();
        return Tensor::from_f32(input_dims.to_vec(), dx, &dy.device());
    }
    let ctx = gpu_context(dy);
    let dx = Tensor::uninit_gpu(ctx, Shape::new(input_dims.to_vec())?, DType::F32)?;
    let len = n * hw * c;
    launch_flat(
        ctx,
        "pool_global_avg_backward",
        GLOBAL_AVG_BACKWARD,
        &[gpu_buffer(dy), gpu_buffer(&dx)],
        len,
        |row_stride| vec![len as u32, hw as u32, c as u32, row_stride],
    )?;
    Ok(dx)
}
