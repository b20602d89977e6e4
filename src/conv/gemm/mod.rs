//! The GEMM cores (cooperative-matrix and portable) and how a conv kernel's
//! shader is put together around them: the operand readers, the core, the
//! prelude, and the pipeline key.

pub mod coop;

use std::borrow::Cow;
use std::sync::Arc;

use crate::conv::plan::{ConvLaunchPlan, ConvVariant};
use crate::conv::shape::ConvShapeMeta;
use crate::gpu::{GpuContext, PipelineKey};

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
            (Some(_), _) if let Some(direct) = plan.direct => {
                key.source_constants.extend(direct.constants());
                ([false; 2], None)
            }
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
                    _ if let Some(direct) = plan.direct => Cow::Owned(direct.core_source()),
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

/// Geometry constants and index helpers shared by every conv shader, prepended
/// to each kernel's source.
pub const SHADER_PRELUDE: &str = include_str!("../../../shaders/conv/prelude.wgsl");
/// The implicit im2col gather shared by forward and dweight.
pub(crate) const IM2COL: &str = include_str!("../../../shaders/conv/im2col.wgsl");
/// The tiled-GEMM core shared by the portable kernels.
pub(crate) const PORTABLE_GEMM: &str = include_str!("../../../shaders/conv/gemm/portable.wgsl");
/// The cooperative-matrix GEMM core (constants and generated pieces filled in by [`CoopBlock`]).
pub(crate) const COOP_GEMM: &str = include_str!("../../../shaders/conv/gemm/coop.wgsl");
/// The forward's halo kernel, in place of the GEMM core where [`HaloBlock`](crate::conv::HaloBlock) fits.
pub(crate) const FORWARD_HALO: &str = include_str!("../../../shaders/conv/forward/halo.wgsl");
/// dweight's halo kernel, in place of the GEMM core where [`DWeightHalo`](crate::conv::dweight::halo::DWeightHalo) fits.
pub(crate) const DWEIGHT_HALO: &str = include_str!("../../../shaders/conv/dweight/halo.wgsl");

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
