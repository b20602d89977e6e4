//! Geometry, launch planning and the compile options shared by the conv kernels.
//!
//! Layout conventions: activations are NHWC; weights are `[R, S, C_in, C_out]`,
//! i.e. the GEMM operand `W[K, C_out]` with K ordered `(r, s, c_in)`.

use crate::error::{AetherError, Result};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::coop::CoopBlock;
use super::dweight_halo::{self, DWeightHalo};
use super::halo::{HaloBlock, Narrow, forward_pin, warn_pin_declined};
use crate::diagnostics::warn_once;
use crate::gpu::{GpuCapabilities, GpuContext, GpuSlice, PipelineKey, coop_translates_to};
use crate::tensor::{DType, Tensor};

/// How the input is padded before the filter slides over it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Padding {
    /// `(f - 1) / 2` on each side of each spatial dimension (Aether-ML's "same").
    Same,
    /// No padding.
    Valid,
    /// Explicit `top, bottom, left, right`.
    Explicit {
        top: usize,
        bottom: usize,
        left: usize,
        right: usize,
    },
}

/// Everything about a convolution except the data: filter, stride, padding, dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ConvParams {
    pub c_out: usize,
    /// Filter `(R, S)`: height and width.
    pub filter: (usize, usize),
    pub stride: (usize, usize),
    pub padding: Padding,
    pub dilation: (usize, usize),
}

impl ConvParams {
    /// A square `filter x filter` convolution with stride 1, no dilation.
    pub fn new(c_out: usize, filter: usize, padding: Padding) -> Self {
        Self {
            c_out,
            filter: (filter, filter),
            stride: (1, 1),
            padding,
            dilation: (1, 1),
        }
    }
}

/// The single place where convolution geometry is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvShapeMeta {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub r: usize,
    pub s: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub pad_top: usize,
    pub pad_left: usize,
    pub dil_h: usize,
    pub dil_w: usize,
    pub h_out: usize,
    pub w_out: usize,
    /// GEMM rows: `N * H_out * W_out`.
    pub m: usize,
    /// GEMM reduction length of the forward pass: `R * S * C_in`.
    pub k: usize,
}

/// A [`ConvShapeMeta`] without the batch size: what pipelines are keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvShapeKey {
    pub h: usize,
    pub w: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub r: usize,
    pub s: usize,
    pub stride: (usize, usize),
    pub pad: (usize, usize),
    pub dilation: (usize, usize),
}

impl ConvShapeMeta {
    /// Geometry of `params` applied to an NHWC `input` shape; a typed error for
    /// zero sizes or an empty output.
    pub fn new(input: [usize; 4], params: &ConvParams) -> Result<Self> {
        let [n, h, w, c_in] = input;
        let (r, s) = params.filter;
        let (stride_h, stride_w) = params.stride;
        let (dil_h, dil_w) = params.dilation;
        let invalid = |reason: String| AetherError::InvalidShape {
            op: "conv2d",
            shape: input.to_vec(),
            reason,
        };
        if [
            n,
            h,
            w,
            c_in,
            params.c_out,
            r,
            s,
            stride_h,
            stride_w,
            dil_h,
            dil_w,
        ]
        .contains(&0)
        {
            return Err(invalid(format!(
                "sizes, channels, filter {:?}, stride {:?} and dilation {:?} must all be >= 1 \
                 (c_out {})",
                params.filter, params.stride, params.dilation, params.c_out
            )));
        }
        let (pad_top, pad_bottom, pad_left, pad_right) = match params.padding {
            Padding::Same => ((r - 1) / 2, (r - 1) / 2, (s - 1) / 2, (s - 1) / 2),
            Padding::Valid => (0, 0, 0, 0),
            Padding::Explicit {
                top,
                bottom,
                left,
                right,
            } => (top, bottom, left, right),
        };
        // Every size reaches the kernels as a 32-bit index, so anything past
        // i32::MAX is refused up front; below it the arithmetic here cannot
        // overflow a 64-bit usize, and the products are checked.
        let index_limit = i32::MAX as usize;
        let geometry = [
            ("height", h),
            ("width", w),
            ("input channels", c_in),
            ("output channels", params.c_out),
            ("filter height", r),
            ("filter width", s),
            ("stride height", stride_h),
            ("stride width", stride_w),
            ("dilation height", dil_h),
            ("dilation width", dil_w),
            ("padding top", pad_top),
            ("padding bottom", pad_bottom),
            ("padding left", pad_left),
            ("padding right", pad_right),
        ];
        if let Some((name, value)) = geometry.iter().find(|(_, v)| *v > index_limit) {
            return Err(invalid(format!(
                "{name} {value} exceeds the kernels' 32-bit index range ({index_limit})"
            )));
        }
        let span_h = dil_h * (r - 1) + 1;
        let span_w = dil_w * (s - 1) + 1;
        let padded_h = h + pad_top + pad_bottom;
        let padded_w = w + pad_left + pad_right;
        if padded_h < span_h || padded_w < span_w {
            return Err(invalid(format!(
                "filter {:?} (dilation {:?}) is larger than the padded input {padded_h}x{padded_w}: \
                 the output would be empty",
                params.filter, params.dilation
            )));
        }
        let h_out = (padded_h - span_h) / stride_h + 1;
        let w_out = (padded_w - span_w) / stride_w + 1;
        let product = |values: &[usize]| {
            values
                .iter()
                .try_fold(1usize, |acc, &v| acc.checked_mul(v))
                .filter(|&p| p <= index_limit)
        };
        let fits = [
            &[span_h][..],
            &[span_w],
            &[n, h_out, w_out, params.c_out],
            &[r, s, c_in, params.c_out],
            &[n, h, w, c_in],
        ]
        .iter()
        .all(|values| product(values).is_some());
        if !fits {
            return Err(invalid(
                "exceeds the 2^31 element range of the kernels' indices".into(),
            ));
        }
        Ok(Self {
            n,
            h,
            w,
            c_in,
            c_out: params.c_out,
            r,
            s,
            stride_h,
            stride_w,
            pad_top,
            pad_left,
            dil_h,
            dil_w,
            h_out,
            w_out,
            m: n * h_out * w_out,
            k: r * s * c_in,
        })
    }

    pub fn key(&self) -> ConvShapeKey {
        ConvShapeKey {
            h: self.h,
            w: self.w,
            c_in: self.c_in,
            c_out: self.c_out,
            r: self.r,
            s: self.s,
            stride: (self.stride_h, self.stride_w),
            pad: (self.pad_top, self.pad_left),
            dilation: (self.dil_h, self.dil_w),
        }
    }

    pub fn input_dims(&self) -> [usize; 4] {
        [self.n, self.h, self.w, self.c_in]
    }

    pub fn output_dims(&self) -> [usize; 4] {
        [self.n, self.h_out, self.w_out, self.c_out]
    }

    pub fn weight_dims(&self) -> [usize; 4] {
        [self.r, self.s, self.c_in, self.c_out]
    }

    /// The WGSL `override` constants every conv kernel reads its geometry from
    /// (declared in [`SHADER_PRELUDE`]); the batch size is a runtime parameter.
    pub fn shape_constants(&self) -> [(&'static str, u32); 14] {
        let c = |v: usize| v as u32;
        [
            ("H", c(self.h)),
            ("W", c(self.w)),
            ("C_IN", c(self.c_in)),
            ("C_OUT", c(self.c_out)),
            ("R", c(self.r)),
            ("S", c(self.s)),
            ("STRIDE_H", c(self.stride_h)),
            ("STRIDE_W", c(self.stride_w)),
            ("PAD_TOP", c(self.pad_top)),
            ("PAD_LEFT", c(self.pad_left)),
            ("DIL_H", c(self.dil_h)),
            ("DIL_W", c(self.dil_w)),
            ("H_OUT", c(self.h_out)),
            ("W_OUT", c(self.w_out)),
        ]
    }
}

/// A kernel implementation, in the planner's order of preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvVariant {
    /// Cooperative-matrix f16 x f16 -> f32 with square tiles of this size
    /// (8 or 16, from `cooperative_matrix_properties()`).
    Coop { tile: u32 },
    /// Tiled GEMM reading f16 operands, accumulating in f32.
    PortableF16,
    /// Tiled GEMM in f32, for adapters without SHADER_F16.
    PortableF32,
}

impl ConvVariant {
    pub fn name(self) -> &'static str {
        match self {
            Self::Coop { tile: 16 } => "coop16",
            Self::Coop { .. } => "coop8",
            Self::PortableF16 => "portable_f16",
            Self::PortableF32 => "portable_f32",
        }
    }

    /// Whether operands are stored as f16.
    pub fn f16_operands(self) -> bool {
        !matches!(self, Self::PortableF32)
    }

    /// The variants this adapter offers, best first.
    pub fn candidates(caps: &GpuCapabilities) -> Vec<Self> {
        let mut out = Vec::new();
        if caps.shader_f16 {
            // The coop core's workgroup is whole subgroups: their size must be
            // fixed. The backend's shader language must have the matrices.
            if let Some(tile) = caps.coop_f16_f32_tile()
                && caps.subgroup_size.is_some_and(|(min, max)| min == max)
                && coop_translates_to(caps.backend, tile)
            {
                out.push(Self::Coop { tile });
            }
            out.push(Self::PortableF16);
        }
        out.push(Self::PortableF32);
        out
    }
}

/// The portable kernels' output tile: `PORTABLE_TILE x PORTABLE_TILE` per
/// workgroup of 16x16 threads, each thread computing 4x4 outputs.
pub const PORTABLE_TILE: u32 = 64;
/// The reduction depth staged through workgroup memory per iteration.
pub const PORTABLE_TILE_K: u32 = 16;

/// A decided launch: computed once per (layer, shape) and cached by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvLaunchPlan {
    pub variant: ConvVariant,
    pub tile_m: u32,
    pub tile_n: u32,
    pub tile_k: u32,
    pub workgroups: [u32; 3],
    /// The coop core's block (coop variants only).
    pub coop: Option<CoopBlock>,
    /// The forward's halo kernel, which then runs instead of the coop core.
    pub halo: Option<HaloBlock>,
    /// dweight's halo kernel, which then runs instead of the coop core.
    pub dweight_halo: Option<DWeightHalo>,
    /// Number of independent slices of the reduction (dweight only; 1 elsewhere).
    pub split_k: u32,
}

/// The three GEMM directions of a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvDirection {
    Forward,
    DWeight,
    DInput,
}

impl ConvDirection {
    /// How deep this direction's GEMM reduces for `meta`: the filter taps
    /// times input channels (forward), the output positions (dweight), the
    /// taps times output channels (dinput; a strided conv's residue classes
    /// reach fewer taps).
    pub fn reduction_depth(self, meta: &ConvShapeMeta) -> usize {
        match self {
            Self::Forward => meta.k,
            Self::DWeight => meta.m,
            Self::DInput => meta.r * meta.s * meta.c_out,
        }
    }
}

/// One conv kernel: its name, the WGSL parts after the prelude, for a GEMM its
/// run operands (then the variant's GEMM core is appended), and the inputs it
/// can read as f32 where the variant's operands are f16.
pub(crate) struct ConvKernel {
    pub name: &'static str,
    pub parts: &'static [&'static str],
    pub gemm: Option<GemmRuns>,
    /// GEMM operand bindings the pipeline can read as f32 tensors where the
    /// variant's operands are f16 (converting while staging, so no cast
    /// dispatch runs before it).
    pub f32_inputs: &'static [&'static str],
}

/// The bindings a GEMM kernel reads A and B from, the axis their runs of
/// [`GEMM_RUN`] consecutive elements go along, and when the coop core may load
/// them in runs: a shape whose channel counts keep every run inside one
/// contiguous, aligned span.
pub(crate) struct GemmRuns {
    pub a: &'static str,
    pub b: &'static str,
    /// Whether A's and B's runs go along the reduction axis (else along M / N).
    pub along_k: [bool; 2],
    pub fits: fn(&ConvShapeMeta) -> [bool; 2],
    /// Where the coop core may store C's tiles straight from its
    /// accumulators; `None` where C always goes out element by element.
    pub direct_c: Option<DirectC>,
}

/// A GEMM kernel whose C the coop core can store a tile at a time, where
/// every block lies wholly inside C: the binding C lives in, the bias binding
/// added to it (the forward's), and C's `[rows, cols]` where, at tile `t`, C
/// is one row-major span (rows `c_row_stride()` apart from `c_index`, WGSL
/// functions of the kernel) that the kernel stores this way, else `None`.
pub(crate) struct DirectC {
    pub c: &'static str,
    pub bias: Option<&'static str>,
    pub span: fn(&ConvShapeMeta, usize) -> Option<[usize; 2]>,
}

/// Elements per run load in the coop core (`GROUP` in coop_gemm.wgsl).
pub(crate) const GEMM_RUN: usize = 8;

/// WGSL reading GEMM operand binding `name`: its element type `{name}_elem`,
/// `{name}_at(i)` (element i as an `operand`, widened to f32) and
/// `{name}_run(offset)` (the 8 elements from `offset` as a `Run`, zeros where
/// `offset` is -1: padding). Either way an f32 tensor read by an f16 variant
/// is rounded to f16 first, so the variant's operands are f16 whatever the
/// storage (what `Layer::rounds_input_to_f16` promises the model).
/// `f32_storage` says whether the tensor holds f32 (else f16). A `vectorized`
/// binding (coop kernels whose runs fit, so every run offset is a multiple of
/// 8) is declared as vec4s, so a run is two 8-byte (f16) or 16-byte (f32)
/// loads; the pool sizes every buffer in 256-byte granules, so the vector view
/// covers the whole tensor. With `saturate` (f32 storage read by an f16
/// variant) each value saturates at +-65504 before the rounding, NaN kept, as
/// every f32 -> f16 conversion of aether does: an overflow to inf would come
/// out of the conv as inf or NaN.
fn operand_reader(name: &str, f32_storage: bool, vectorized: bool, saturate: bool) -> String {
    let scalar = if f32_storage { "f32" } else { "operand" };
    let (sat, sat4) = if saturate {
        ("saturate_f16", "saturate_f16_4")
    } else {
        ("", "")
    };
    let (elem, at, run) = if vectorized {
        (
            format!("vec4<{scalar}>"),
            format!("return f32(operand({sat}({name}[i >> 2u][i & 3u])));"),
            format!(
                "let q = u32(offset) >> 2u;
    return Run(vec4<operand>({sat4}({name}[q])), vec4<operand>({sat4}({name}[q + 1u])));"
            ),
        )
    } else {
        (
            scalar.to_owned(),
            format!("return f32(operand({sat}({name}[i])));"),
            format!(
                "var run: Run;
    for (var j = 0u; j < 8u; j++) {{
        run[j / 4u][j % 4u] = operand({name}_at(u32(offset) + j));
    }}
    return run;"
            ),
        )
    };
    format!(
        "alias {name}_elem = {elem};

fn {name}_at(i: u32) -> f32 {{
    {at}
}}

fn {name}_run(offset: i32) -> Run {{
    if (offset < 0) {{
        return Run();
    }}
    {run}
}}
"
    )
}

/// A run of [`GEMM_RUN`] operands as the coop core stages them.
const RUN_TYPE: &str = "alias Run = array<vec4<operand>, 2>;

// An f32 value bound for an f16 operand saturates at +-65504 (infinities
// too), NaN kept, judged from the bits: a float comparison may lose a NaN.
fn saturate_f16_4(x: vec4<f32>) -> vec4<f32> {
    let b = bitcast<vec4<u32>>(x);
    let magnitude = b & vec4(0x7fffffffu);
    let keep = magnitude > vec4(0x7f800000u) | magnitude <= vec4(0x477fe000u);
    return bitcast<vec4<f32>>(select((b & vec4(0x80000000u)) | vec4(0x477fe000u), b, keep));
}

fn saturate_f16(x: f32) -> f32 {
    return saturate_f16_4(vec4(x)).x;
}
";

impl ConvKernel {
    /// C's `[rows, cols]` where this kernel's coop core stores tiles
    /// straight into C at `tile` for `meta` (given blocks that tile it);
    /// `None` where C goes out through scratch.
    pub(crate) fn direct_span(&self, meta: &ConvShapeMeta, tile: u32) -> Option<[usize; 2]> {
        let direct = self.gemm.as_ref()?.direct_c.as_ref()?;
        (direct.span)(meta, tile as usize)
    }

    /// The compiled pipeline of this kernel for `plan` and `meta`'s geometry;
    /// `None` when it failed to compile (the cache has warned).
    pub fn pipeline(
        &self,
        ctx: &GpuContext,
        plan: &ConvLaunchPlan,
        meta: &ConvShapeMeta,
    ) -> Option<Arc<wgpu::ComputePipeline>> {
        self.pipeline_reading(ctx, plan, meta, &[])
    }

    /// The pipeline reading as f32 those of `f32_inputs` whose tensors are f32
    /// (`inputs_f32`, in the same order) where `plan`'s variant takes f16
    /// operands, or the plain pipeline should that one fail to compile (it has
    /// warned); with whether the f32 reads were kept. Planning and dispatch both
    /// ask this, so the pipeline a plan is checked with is the one it runs.
    pub fn pipeline_for_inputs(
        &self,
        ctx: &GpuContext,
        plan: &ConvLaunchPlan,
        meta: &ConvShapeMeta,
        inputs_f32: &[bool],
    ) -> Option<(Arc<wgpu::ComputePipeline>, bool)> {
        let reads: Vec<bool> = inputs_f32
            .iter()
            .map(|&f32_tensor| f32_tensor && plan.variant.f16_operands())
            .collect();
        if reads.contains(&true)
            && let Some(pipeline) = self.pipeline_reading(ctx, plan, meta, &reads)
        {
            return Some((pipeline, true));
        }
        self.pipeline(ctx, plan, meta).map(|p| (p, false))
    }

    /// [`Self::pipeline`] reading the inputs flagged in `f32_reads` (in the
    /// order of `f32_inputs`; missing flags are false) as f32.
    fn pipeline_reading(
        &self,
        ctx: &GpuContext,
        plan: &ConvLaunchPlan,
        meta: &ConvShapeMeta,
        f32_reads: &[bool],
    ) -> Option<Arc<wgpu::ComputePipeline>> {
        let variant = plan.variant;
        let f32_read = |i: usize| f32_reads.get(i).copied().unwrap_or(false);
        let mut key = pipeline_key(self.name, variant, meta);
        // A halo kernel's own name: its compile failure is announced apart
        // from the GEMM core's, which then runs in its place.
        key.variant = plan.kernel_name();
        if !self.f32_inputs.is_empty() {
            let mask = (0..self.f32_inputs.len()).fold(0, |m, i| m | u32::from(f32_read(i)) << i);
            key.source_constants.push(("F32_INPUTS", mask));
        }
        let subgroup = ctx.caps().subgroup_size.map_or(0, |(_, max)| max);
        let (fits, direct_c) = match (&self.gemm, plan.coop) {
            (Some(runs), Some(_)) if let Some(halo) = plan.halo => {
                key.source_constants.push(("HALO", 1));
                key.source_constants.extend(halo.constants(subgroup));
                ((runs.fits)(meta), None)
            }
            (Some(runs), Some(_)) if let Some(halo) = plan.dweight_halo => {
                key.source_constants.push(("HALO", 2));
                key.source_constants.extend(halo.constants(subgroup, meta));
                ((runs.fits)(meta), None)
            }
            (Some(runs), Some(block)) => {
                let fits = (runs.fits)(meta);
                let run = |fits: bool| if fits { GEMM_RUN as u32 } else { 1 };
                key = key.with("RUN_A", run(fits[0])).with("RUN_B", run(fits[1]));
                key.source_constants.extend(block.constants(subgroup));
                // Whole blocks only: naga requires the matrix stores in
                // uniform control flow, so no tile may be skipped.
                let direct = (runs.direct_c.as_ref())
                    .filter(|_| block.stores_directly(self.direct_span(meta, block.tile)));
                key.source_constants
                    .push(("DIRECT_C", u32::from(direct.is_some())));
                (fits, direct)
            }
            _ => ([false; 2], None),
        };
        // The source is only built on a cache miss: this runs on every dispatch.
        ctx.pipelines().get_or_create(&key, "main", || {
            let mut parts: Vec<&str> = Vec::new();
            let (readers, core);
            if let Some(runs) = &self.gemm {
                let f32_storage = |name: &str| {
                    !variant.f16_operands()
                        || self
                            .f32_inputs
                            .iter()
                            .position(|&input| input == name)
                            .is_some_and(f32_read)
                };
                let saturate = |name: &str| variant.f16_operands() && f32_storage(name);
                readers = RUN_TYPE.to_owned()
                    + &operand_reader(runs.a, f32_storage(runs.a), fits[0], saturate(runs.a))
                    + &operand_reader(runs.b, f32_storage(runs.b), fits[1], saturate(runs.b));
                parts.push(&readers);
                parts.extend(self.parts);
                core = match (plan.halo, plan.dweight_halo, plan.coop) {
                    (Some(halo), _, _) => {
                        let bias = runs.direct_c.as_ref().and_then(|direct| direct.bias);
                        Cow::Owned(halo.core_source(FORWARD_HALO, subgroup, bias))
                    }
                    (None, Some(halo), _) => {
                        Cow::Owned(halo.core_source(DWEIGHT_HALO, subgroup, meta))
                    }
                    (None, None, Some(block)) => {
                        Cow::Owned(block.core_source(COOP_GEMM, subgroup, runs.along_k, direct_c))
                    }
                    (None, None, None) => Cow::Borrowed(PORTABLE_GEMM),
                };
                parts.push(&core);
            } else {
                parts.extend(self.parts);
            }
            shader_source(variant, &parts).into()
        })
    }
}

/// A plan as [`ConvPlans::summary`] reports it: direction, shape, plan.
pub type PlannedLaunch = (ConvDirection, ConvShapeMeta, ConvLaunchPlan);

/// Launch plans of one layer, computed once per (context, direction, shape)
/// and reused.
/// A forced variant pins every plan to it (for tests and comparison runs).
#[derive(Default)]
pub struct ConvPlans {
    forced: Option<ConvVariant>,
    plans: Mutex<HashMap<(u64, ConvDirection, ConvShapeMeta), ConvLaunchPlan>>,
}

impl ConvPlans {
    pub fn new() -> Self {
        Self::default()
    }

    /// Plans that only ever use `variant`.
    pub fn forcing(variant: ConvVariant) -> Self {
        Self {
            forced: Some(variant),
            plans: Mutex::default(),
        }
    }

    /// The variants to try, best first.
    pub(crate) fn candidates(&self, caps: &GpuCapabilities) -> Vec<ConvVariant> {
        match self.forced {
            Some(v) => vec![v],
            None => ConvVariant::candidates(caps),
        }
    }

    /// The cached plan for `(direction, meta)` on `ctx`, or the one `plan`
    /// makes now. Plans are kept per context: one made for another adapter
    /// (or the same adapter with other options) may not compile here.
    pub(crate) fn get_or_plan(
        &self,
        ctx: &GpuContext,
        direction: ConvDirection,
        meta: &ConvShapeMeta,
        plan: impl FnOnce() -> Result<ConvLaunchPlan>,
    ) -> Result<ConvLaunchPlan> {
        let key = (ctx.id(), direction, *meta);
        if let Some(p) = self
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(*p);
        }
        let made = plan()?;
        self.plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, made);
        Ok(made)
    }

    /// The plans made so far with the shapes (batch included) they were made
    /// for, for logs and profiles ("which kernel variants are in use").
    pub fn summary(&self) -> Vec<PlannedLaunch> {
        let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.iter().map(|((_, d, m), p)| (*d, *m, *p)).collect()
    }
}

/// The plan of the first candidate variant that accepts the shape and compiles.
/// `plan_variant` declines a shape by returning an error (its message is the
/// reason); a decline that leads to a later variant is announced once.
/// `inputs_f32` says which of the kernel's `f32_inputs` are f32 tensors (see
/// [`ConvKernel::pipeline_for_inputs`]).
pub(crate) fn plan_first(
    ctx: &GpuContext,
    plans: &ConvPlans,
    kernel: &ConvKernel,
    meta: &ConvShapeMeta,
    inputs_f32: &[bool],
    mut plan_variant: impl FnMut(ConvVariant) -> Result<ConvLaunchPlan>,
) -> Result<ConvLaunchPlan> {
    let mut declined: Vec<String> = Vec::new();
    // Shape declines are announced here; compile failures were already announced
    // by the pipeline cache.
    let mut shape_declines = Vec::new();
    for variant in plans.candidates(ctx.caps()) {
        let plan = match plan_variant(variant) {
            Ok(plan) => plan,
            // A malformed tuning variable is the user's error, not a shape
            // the variant declines.
            Err(err @ AetherError::InvalidEnv { .. }) => return Err(err),
            Err(reason) => {
                shape_declines.push(format!("{} declined: {reason}", variant.name()));
                declined.push(format!("{} declined: {reason}", variant.name()));
                continue;
            }
        };
        if kernel
            .pipeline_for_inputs(ctx, &plan, meta, inputs_f32)
            .is_none()
        {
            declined.push(format!("{} failed to compile", variant.name()));
            continue;
        }
        if !shape_declines.is_empty() {
            warn_once(
                &format!("decline:{}:{:?}", kernel.name, meta.key()),
                &format!(
                    "{} on {:?}: using {} because {}",
                    kernel.name,
                    meta.key(),
                    variant.name(),
                    shape_declines.join("; ")
                ),
            );
        }
        return Ok(plan);
    }
    Err(AetherError::NoKernelVariant {
        kernel: kernel.name,
        adapter: ctx.caps().adapter_name.clone(),
        reasons: declined.join("; "),
    })
}

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

/// Declines `variant` for an operand it cannot take: an f16 tensor (a layer's
/// f16 weight shadow) only feeds the f16 variants.
pub(crate) fn accepts_operand(variant: ConvVariant, t: &Tensor) -> Result<()> {
    if t.dtype() == DType::F16 && !variant.f16_operands() {
        return Err(AetherError::InvalidShape {
            op: "conv operand",
            shape: t.dims().to_vec(),
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

/// Refuses, where the driver cuts loops short
/// ([`GpuCapabilities::loop_iteration_limit`]: lavapipe), a portable GEMM
/// whose invocations would loop past the limit: `turns` row tiles each, and
/// `tiles` reduction steps in each (a Dense layer of 2^20 inputs on lavapipe
/// summed 65535 of its 65536 steps and returned that, with no error).
pub(crate) fn check_gemm_loops(
    ctx: &GpuContext,
    direction: ConvDirection,
    turns: usize,
    tiles: usize,
) -> Result<()> {
    let iterations = (turns * (tiles + 1)) as u64;
    match ctx.caps().loop_iteration_limit() {
        Some(limit) if iterations >= limit => Err(AetherError::TooLarge {
            what: format!(
                "{direction:?} conv: {turns} row tile(s) of {tiles} reduction steps, {iterations} \
                 loop iterations an invocation on {:?}, whose driver stops invocations after \
                 {limit}",
                ctx.caps().adapter_name
            ),
            bytes: iterations,
            limit,
        }),
        _ => Ok(()),
    }
}

impl ConvLaunchPlan {
    /// The plan of `variant`'s GEMM over a `rows x cols` output with `z` slices
    /// (split-K 1), run by `kernel` on `meta`; an error (a decline) when the
    /// grid exceeds the adapter's limit of workgroups, except the portable
    /// kernel's rows, whose workgroups take turns past it.
    pub(crate) fn gemm(
        direction: ConvDirection,
        ctx: &GpuContext,
        variant: ConvVariant,
        [rows, cols, z]: [usize; 3],
        (kernel, meta): (&ConvKernel, &ConvShapeMeta),
    ) -> Result<Self> {
        let coop = match variant {
            ConvVariant::Coop { tile } => Some(CoopBlock::choose(
                tile,
                direction,
                [rows, cols, direction.reduction_depth(meta)],
                ctx.caps(),
                kernel.direct_span(meta, tile),
            )?),
            _ => None,
        };
        let (tile_m, tile_n, tile_k) = coop
            .map_or((PORTABLE_TILE, PORTABLE_TILE, PORTABLE_TILE_K), |b| {
                b.dims()
            });
        let limit = ctx.caps().limits.max_compute_workgroups_per_dimension as usize;
        let mut grid = [
            rows.div_ceil(tile_m as usize),
            cols.div_ceil(tile_n as usize),
            z,
        ];
        // The portable kernel's workgroups take turns over row tiles past the
        // limit (portable_gemm.wgsl); the coop core's take one block each.
        if coop.is_none() {
            grid[0] = grid[0].min(limit);
        }
        if let Some(&too_many) = grid.iter().find(|&&g| g > limit) {
            return Err(AetherError::TooManyWorkgroups {
                what: format!("{direction:?} conv: grid {grid:?} of {tile_m}x{tile_n} blocks"),
                workgroups: too_many as u64,
                limit: limit as u64,
            });
        }
        // dweight splits its reduction to fit (dweight.rs); the others cannot.
        if coop.is_none() && direction != ConvDirection::DWeight {
            let turns = rows.div_ceil(tile_m as usize).div_ceil(grid[0].max(1));
            let depth = direction.reduction_depth(meta);
            check_gemm_loops(ctx, direction, turns, depth.div_ceil(tile_k as usize))?;
        }
        Ok(Self {
            variant,
            tile_m,
            tile_n,
            tile_k,
            workgroups: grid.map(|g| g as u32),
            coop,
            halo: None,
            dweight_halo: None,
            split_k: 1,
        })
    }

    /// The variant's name, with "+halo" where a halo kernel runs.
    pub fn kernel_name(&self) -> &'static str {
        let halo = self.halo.is_some() || self.dweight_halo.is_some();
        match (halo, self.variant) {
            (true, ConvVariant::Coop { tile: 16 }) => "coop16+halo",
            (true, _) => "coop8+halo",
            (false, variant) => variant.name(),
        }
    }

    /// This plan with the forward's halo kernel where it fits `meta` (a coop
    /// plan only), outputs narrower than a tile taken as `narrow` says, else
    /// unchanged.
    pub(crate) fn with_halo(
        self,
        meta: &ConvShapeMeta,
        caps: &GpuCapabilities,
        narrow: Narrow,
    ) -> Self {
        let Some(block) = self.coop else {
            return self;
        };
        match HaloBlock::fit(block.tile, meta, caps, narrow) {
            Ok(halo) => Self {
                halo: Some(halo),
                workgroups: halo.grid(meta).map(|g| g as u32),
                ..self
            },
            Err(why) => {
                let kernel = format!("the halo kernel at tile {}", block.tile);
                warn_pin_declined(forward_pin(), &kernel, meta, &why);
                self
            }
        }
    }

    /// This plan with dweight's halo kernel where it fits `meta` and its
    /// partial sums fit one storage binding (a coop plan only), else
    /// unchanged.
    pub(crate) fn with_dweight_halo(self, meta: &ConvShapeMeta, caps: &GpuCapabilities) -> Self {
        let Some(block) = self.coop else {
            return self;
        };
        let halo = match DWeightHalo::fit(block.tile, meta, caps) {
            Ok(halo) => halo,
            Err(why) => {
                let kernel = format!("dweight's halo kernel at tile {}", block.tile);
                warn_pin_declined(dweight_halo::pin(), &kernel, meta, &why);
                return self;
            }
        };
        let partial_bytes = halo.slices as usize * DWeightHalo::partial_rows(meta) * meta.c_out * 4;
        if partial_bytes as u64 > caps.limits.max_storage_buffer_binding_size {
            return self;
        }
        Self {
            workgroups: halo.grid(meta),
            split_k: halo.slices,
            dweight_halo: Some(halo),
            ..self
        }
    }
}

/// Geometry constants and index helpers shared by every conv shader, prepended
/// to each kernel's source.
pub const SHADER_PRELUDE: &str = include_str!("../../shaders/conv/prelude.wgsl");
/// The implicit im2col gather shared by forward and dweight.
pub(crate) const IM2COL: &str = include_str!("../../shaders/conv/im2col.wgsl");
/// The tiled-GEMM core shared by the portable kernels.
pub(crate) const PORTABLE_GEMM: &str = include_str!("../../shaders/conv/portable_gemm.wgsl");
/// The cooperative-matrix GEMM core (constants and generated pieces filled in by [`CoopBlock`]).
pub(crate) const COOP_GEMM: &str = include_str!("../../shaders/conv/coop_gemm.wgsl");
/// The forward's halo kernel, in place of the GEMM core where [`HaloBlock`] fits.
pub(crate) const FORWARD_HALO: &str = include_str!("../../shaders/conv/forward_halo.wgsl");
/// dweight's halo kernel, in place of the GEMM core where [`DWeightHalo`] fits.
pub(crate) const DWEIGHT_HALO: &str = include_str!("../../shaders/conv/dweight_halo.wgsl");

/// Full WGSL for a kernel: `enable` lines for the variant, the operand type
/// alias, the prelude, then the kernel's own parts.
pub fn shader_source(variant: ConvVariant, parts: &[&str]) -> String {
    let mut src = String::new();
    if variant.f16_operands() {
        src.push_str("enable f16;\n");
    }
    if matches!(variant, ConvVariant::Coop { .. }) {
        src.push_str("enable wgpu_cooperative_matrix;\n");
    }
    let operand = if variant.f16_operands() { "f16" } else { "f32" };
    src.push_str(&format!("alias operand = {operand};\n"));
    src.push_str(SHADER_PRELUDE);
    for part in parts {
        src.push('\n');
        src.push_str(part);
    }
    src
}

/// The pipeline key of a conv kernel: kernel, variant and shape constants.
pub fn pipeline_key(
    kernel: &'static str,
    variant: ConvVariant,
    meta: &ConvShapeMeta,
) -> PipelineKey {
    let mut key = PipelineKey::new(kernel, variant.name());
    key.constants.extend(meta.shape_constants());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_padding_keeps_size_for_odd_filters_and_stride_divides() {
        let m = ConvShapeMeta::new([2, 9, 7, 3], &ConvParams::new(8, 3, Padding::Same)).unwrap();
        assert_eq!((m.h_out, m.w_out, m.m, m.k), (9, 7, 2 * 9 * 7, 27));
        let p = ConvParams {
            stride: (2, 1),
            filter: (5, 3),
            ..ConvParams::new(4, 1, Padding::Valid)
        };
        let m = ConvShapeMeta::new([1, 11, 6, 2], &p).unwrap();
        assert_eq!((m.h_out, m.w_out), (4, 4));
    }

    #[test]
    fn empty_output_and_zero_sizes_are_errors() {
        let e =
            ConvShapeMeta::new([1, 2, 2, 3], &ConvParams::new(4, 5, Padding::Valid)).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        assert!(ConvShapeMeta::new([1, 4, 4, 0], &ConvParams::new(4, 3, Padding::Same)).is_err());
        assert!(ConvShapeMeta::new([1, 4, 4, 2], &ConvParams::new(0, 3, Padding::Same)).is_err());
    }

    #[test]
    fn key_leaves_batch_out() {
        let p = ConvParams::new(8, 3, Padding::Same);
        let a = ConvShapeMeta::new([1, 8, 8, 3], &p).unwrap();
        let b = ConvShapeMeta::new([7, 8, 8, 3], &p).unwrap();
        assert_eq!(a.key(), b.key());
        assert_ne!(a, b);
    }
}
