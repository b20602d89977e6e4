//! Launch planning: the kernel variants an adapter offers, the plan each
//! direction decides for a shape, and the per-layer cache of plans.

use std::collections::HashMap;
use std::sync::Mutex;

use super::direct::DirectConv;
use super::forward::halo::{HaloBlock, Narrow, forward_pin, warn_pin_declined};
use super::gemm::ConvKernel;
use super::gemm::coop::CoopBlock;
use super::shape::ConvShapeMeta;
use super::tuning::ConvTuning;
use crate::conv::dweight::halo::{self as dweight_halo, DWeightHalo};
use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};
use crate::gpu::{GpuCapabilities, GpuContext, coop_translates_to};

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
    /// The direct kernel (forward or dweight), which then runs instead of a
    /// GEMM core.
    pub direct: Option<DirectConv>,
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

    /// Plans holding `plan` for `direction` at `meta` on `ctx`, as if made
    /// there (for timing a candidate through the kernels' own entry points).
    pub(crate) fn with_plan(
        ctx: &GpuContext,
        direction: ConvDirection,
        meta: &ConvShapeMeta,
        plan: ConvLaunchPlan,
    ) -> Self {
        let plans = Self::new();
        plans
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ctx.id(), direction, *meta), plan);
        plans
    }

    /// Whether the plan for `direction` at `meta` on `ctx` is made.
    pub(crate) fn has(
        &self,
        ctx: &GpuContext,
        direction: ConvDirection,
        meta: &ConvShapeMeta,
    ) -> bool {
        self.plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&(ctx.id(), direction, *meta))
    }

    /// The variants to try, best first.
    pub(crate) fn candidates(&self, caps: &GpuCapabilities) -> Vec<ConvVariant> {
        match self.forced {
            Some(v) => vec![v],
            None => ConvVariant::candidates(caps),
        }
    }

    /// The cached plan for `(direction, meta)` on `ctx`, or the one `plan`
    /// makes now with `tuning`, or where `None` the context's
    /// ([`GpuContext::plan_tuning`], looked up only on a miss: a cached plan
    /// costs one lookup). Plans are kept per context: one made for another
    /// adapter (or the same adapter with other options) may not compile here.
    pub(crate) fn get_or_plan(
        &self,
        ctx: &GpuContext,
        direction: ConvDirection,
        meta: &ConvShapeMeta,
        tuning: Option<&ConvTuning>,
        plan: impl FnOnce(&ConvTuning) -> Result<ConvLaunchPlan>,
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
        let made = match tuning {
            Some(tuning) => plan(tuning)?,
            None => plan(&ctx.plan_tuning(direction, meta))?,
        };
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
        tuning: &ConvTuning,
    ) -> Result<Self> {
        let coop = match variant {
            ConvVariant::Coop { tile } => Some(CoopBlock::choose(
                tile,
                direction,
                [rows, cols, direction.reduction_depth(meta)],
                ctx.caps(),
                tuning,
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
        // limit (gemm/portable.wgsl); the coop core's take one block each.
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
            direct: None,
            split_k: 1,
        })
    }

    /// The variant's name, with "+halo" where a halo kernel runs, "+direct"
    /// where a direct kernel does.
    pub fn kernel_name(&self) -> &'static str {
        if self.direct.is_some() {
            return match self.variant {
                ConvVariant::Coop { tile: 16 } => "coop16+direct",
                ConvVariant::Coop { .. } => "coop8+direct",
                ConvVariant::PortableF16 => "portable_f16+direct",
                ConvVariant::PortableF32 => "portable_f32+direct",
            };
        }
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
        tuning: &ConvTuning,
        narrow: Narrow,
    ) -> Self {
        let Some(block) = self.coop else {
            return self;
        };
        match HaloBlock::fit(block.tile, meta, caps, tuning, narrow) {
            Ok(halo) => Self {
                halo: Some(halo),
                workgroups: halo.grid(meta).map(|g| g as u32),
                ..self
            },
            Err(why) => {
                let kernel = format!("the halo kernel at tile {}", block.tile);
                warn_pin_declined(forward_pin(tuning), &kernel, meta, &why);
                self
            }
        }
    }

    /// This forward plan with the direct kernel where it fits `meta` (any
    /// variant), else unchanged.
    pub(crate) fn with_direct(
        self,
        meta: &ConvShapeMeta,
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
    ) -> Self {
        match DirectConv::fit(ConvDirection::Forward, meta, caps, tuning) {
            Ok(direct) => Self {
                direct: Some(direct),
                workgroups: direct.grid(meta, caps.limits.max_compute_workgroups_per_dimension),
                ..self
            },
            Err(_) => self,
        }
    }

    /// This plan with dweight's halo kernel where it fits `meta` and its
    /// partial sums fit one storage binding (a coop plan only), else
    /// unchanged.
    pub(crate) fn with_dweight_halo(
        self,
        meta: &ConvShapeMeta,
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
    ) -> Self {
        let Some(block) = self.coop else {
            return self;
        };
        let halo = match DWeightHalo::fit(block.tile, meta, caps, tuning) {
            Ok(halo) => halo,
            Err(why) => {
                let kernel = format!("dweight's halo kernel at tile {}", block.tile);
                warn_pin_declined(dweight_halo::pin(tuning), &kernel, meta, &why);
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
