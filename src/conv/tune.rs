//! Measured plans: each conv direction's plan chosen by timing its candidates
//! on the adapter, at the step's own shape.
//!
//! The planner's rules (the coop block in `gemm::coop`, where the halo kernels
//! run, dweight's split of its reduction) were fitted by sweeps on a few
//! shapes. Where the options ask ([`GpuOptions::tune_convs`]), the first step
//! of a shape times the rule's plan beside the plans that other tunings make
//! (the GEMM core instead of a halo kernel, other blocks and splits, stacked
//! or unstacked halo tiles) and keeps the fastest: in the context for this
//! process, and in a file beside the pipeline cache for the next one on the
//! same adapter and driver, which then plans without timing. Tuning overrides
//! set in [`GpuOptions::conv_tuning`] win: nothing is timed where any is set.
//!
//! [`GpuOptions::tune_convs`]: crate::gpu::GpuOptions::tune_convs
//! [`GpuOptions::conv_tuning`]: crate::gpu::GpuOptions::conv_tuning

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::dinput::conv2d_dinput;
use super::dinput::halo::DINPUT_HALO_ENV;
use super::dweight::halo::DWEIGHT_HALO_ENV;
use super::dweight::{SPLIT_ENV, conv2d_dweight};
use super::forward::conv2d_forward;
use super::forward::halo::{GROUPS_ENV, HALO_ENV, STACK_ENV};
use super::gemm::coop::BLOCK_ENV;
use super::plan::{ConvDirection, ConvLaunchPlan, ConvPlans};
use super::prepare::ConvWork;
use super::shape::ConvShapeMeta;
use super::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};
use crate::gpu::GpuContext;
use crate::tensor::{DType, Shape, Tensor};

/// GEMM-core blocks timed beside the rule's (`SG_MxSG_NxTMxTNxKT`): the
/// blocks the rule picks for other shapes.
const BLOCKS: [&str; 5] = [
    "4x4x2x2x2",
    "8x2x2x1x2",
    "4x4x2x1x4",
    "2x4x2x2x2",
    "4x2x2x2x2",
];
/// Calls of a candidate timed back to back, and the rounds of them (the
/// fastest round counts).
const CALLS: usize = 4;
const ROUNDS: usize = 3;

/// The tunings whose plans are timed beside the rule's (the empty tuning)
/// for `direction`. A tuning that makes the rule's plan again, or one of
/// another variant, is not timed.
pub fn candidates(direction: ConvDirection) -> Vec<ConvTuning> {
    let tuning = |pairs: &[(&str, &str)]| {
        pairs.iter().fold(ConvTuning::default(), |t, (var, value)| {
            t.set(var, *value).expect("a tuning variable")
        })
    };
    let mut list = vec![ConvTuning::default()];
    let (halo_off, more): (&str, Vec<Vec<(&str, &str)>>) = match direction {
        ConvDirection::Forward => (
            HALO_ENV,
            vec![
                vec![(STACK_ENV, "1")],
                vec![(STACK_ENV, "0")],
                vec![(GROUPS_ENV, "0")],
            ],
        ),
        ConvDirection::DInput => (
            DINPUT_HALO_ENV,
            vec![vec![(STACK_ENV, "1")], vec![(STACK_ENV, "0")]],
        ),
        ConvDirection::DWeight => (
            DWEIGHT_HALO_ENV,
            vec![
                vec![(SPLIT_ENV, "1")],
                vec![(SPLIT_ENV, "4")],
                vec![(SPLIT_ENV, "8")],
            ],
        ),
    };
    list.push(tuning(&[(halo_off, "0")]));
    list.extend(more.iter().map(|pairs| tuning(pairs)));
    for block in BLOCKS {
        list.push(tuning(&[(halo_off, "0"), (BLOCK_ENV, block)]));
    }
    list
}

/// The tunings measured fastest, by direction and shape; read from and
/// written to a file beside the pipeline cache.
pub(crate) struct TunedPlans {
    file: Option<PathBuf>,
    chosen: Mutex<Chosen>,
    /// Tunings were kept since the file was last written.
    unsaved: AtomicBool,
}

/// Per direction and shape ([`key`]), each tuning variable's value.
type Chosen = BTreeMap<String, BTreeMap<String, String>>;

impl TunedPlans {
    /// The tunings kept for this adapter and driver in `dir`, if any.
    pub(crate) fn open(dir: Option<&Path>, info: &wgpu::AdapterInfo) -> Self {
        let file = dir.map(|d| d.join(file_name(info)));
        let chosen = file
            .as_deref()
            .and_then(|path| read(path).transpose())
            .unwrap_or(Ok(BTreeMap::new()))
            .unwrap_or_else(|why| {
                warn_once(
                    &format!("tuned-plans:{why}"),
                    &format!("ignoring the measured conv plans: {why}"),
                );
                BTreeMap::new()
            });
        Self {
            file,
            chosen: Mutex::new(chosen),
            unsaved: AtomicBool::new(false),
        }
    }

    /// The tuning measured fastest for `direction` at `meta`, if any.
    pub(crate) fn get(&self, direction: ConvDirection, meta: &ConvShapeMeta) -> Option<ConvTuning> {
        let key = key(direction, meta);
        let chosen = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        let values = chosen.get(&key)?;
        let tuning = values
            .iter()
            .try_fold(ConvTuning::default(), |t, (var, value)| {
                t.set(var, value.as_str())
            });
        match tuning {
            Ok(tuning) => Some(tuning),
            Err(e) => {
                // Measured again, and the entry replaced.
                warn_once(
                    &format!("tuned-plans-entry:{key}"),
                    &format!("ignoring the measured conv plan for {key}: {e}"),
                );
                None
            }
        }
    }

    /// Keeps `tuning` for `direction` at `meta`, in memory until
    /// [`TunedPlans::save`].
    fn keep(&self, direction: ConvDirection, meta: &ConvShapeMeta, tuning: &ConvTuning) {
        let values = tuning
            .values()
            .map(|(var, value)| (var.to_owned(), value.to_owned()))
            .collect();
        self.chosen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(direction, meta), values);
        self.unsaved.store(true, Ordering::Relaxed);
    }

    /// Writes the file, whole (replacing the old one only once written), if
    /// anything was kept since it was last written.
    pub(crate) fn save(&self) {
        let Some(path) = &self.file else {
            return;
        };
        if !self.unsaved.swap(false, Ordering::Relaxed) {
            return;
        }
        let chosen = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = serde_json::to_vec_pretty(&*chosen).expect("strings serialise");
        let written = match path.parent() {
            Some(dir) => std::fs::create_dir_all(dir).map_err(|source| AetherError::Io {
                action: "create the cache directory",
                path: dir.to_path_buf(),
                source,
            }),
            None => Ok(()),
        }
        .and_then(|()| crate::io::write_atomic(path, &bytes));
        if let Err(e) = written {
            warn_once(
                &format!("tuned-plans-write:{}", path.display()),
                &format!("the measured conv plans stay in memory only: {e}"),
            );
        }
    }
}

/// The file of an adapter's measured plans: its name, vendor, device and
/// driver (another driver may rank the candidates differently).
fn file_name(info: &wgpu::AdapterInfo) -> String {
    let text = format!(
        "{}-{:x}-{:x}-{}-{}",
        info.name, info.vendor, info.device, info.driver, info.driver_info
    );
    let safe: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("conv-plans-{safe}.json")
}

fn read(path: &Path) -> Result<Option<Chosen>, String> {
    match crate::io::read_regular(path, 16 << 20) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The file's key of `direction` at `meta`: the geometry, and the batch
/// rounded up to a power of two (the best plan depends on how many blocks
/// there are, but an epoch's last partial batch or an evaluation batch
/// should not each be measured again). A tuning is a set of knobs, not a
/// plan: the planner applies it to the exact shape.
fn key(direction: ConvDirection, meta: &ConvShapeMeta) -> String {
    format!(
        "{direction:?} batch {} {}x{}x{} to {} filter {}x{} stride {}x{} pad {}x{} dilation {}x{}",
        meta.n.next_power_of_two(),
        meta.h,
        meta.w,
        meta.c_in,
        meta.c_out,
        meta.r,
        meta.s,
        meta.stride_h,
        meta.stride_w,
        meta.pad_top,
        meta.pad_left,
        meta.dil_h,
        meta.dil_w
    )
}

/// Times each candidate of `work`'s `direction` (a tuning and the plan it
/// made, the rule's first) at its shape, and keeps the fastest's tuning in
/// `ctx` (written to its file by [`TunedPlans::save`]). A candidate that
/// fails to run is left out; where none runs, that is announced, nothing is
/// kept, and the rule plans.
pub(crate) fn choose(
    ctx: &Arc<GpuContext>,
    work: &ConvWork<'_>,
    direction: ConvDirection,
    candidates: &[(ConvTuning, ConvLaunchPlan)],
) {
    let mut best: Option<(f64, &ConvTuning)> = None;
    let mut failures = Vec::new();
    for (tuning, plan) in candidates {
        match time(ctx, work, direction, plan) {
            Ok(nanos) if best.is_none_or(|(fastest, _)| nanos < fastest) => {
                best = Some((nanos, tuning));
            }
            Ok(_) => {}
            Err(e) => failures.push(e.to_string()),
        }
    }
    let Some((_, chosen)) = best else {
        // Nothing kept: a later process measures again.
        warn_once(
            &format!("tune:{direction:?}:{:?}", work.meta.key()),
            &format!(
                "no candidate plan of the {direction:?} conv on {:?} could be timed; the \
                 planner's rule stays: {}",
                work.meta.key(),
                failures.join("; ")
            ),
        );
        return;
    };
    ctx.tuned_plans().keep(direction, &work.meta, chosen);
}

/// GPU nanoseconds of one call of `direction` with `plan` on `work`'s shape
/// (the fastest of [`ROUNDS`] rounds of [`CALLS`] calls back to back), on
/// scratch operands; wall time where the adapter has no timestamps.
fn time(
    ctx: &Arc<GpuContext>,
    work: &ConvWork<'_>,
    direction: ConvDirection,
    plan: &ConvLaunchPlan,
) -> Result<f64> {
    let meta = &work.meta;
    let plans = ConvPlans::with_plan(ctx, direction, meta, *plan);
    let scratch = |dims: [usize; 4], dtype| Tensor::uninit_gpu(ctx, Shape::new(dims)?, dtype);
    let operands = work.backward.unwrap_or(work.weights);
    let call: Box<dyn Fn() -> Result<()>> = match direction {
        ConvDirection::Forward => {
            let x = scratch(meta.input_dims(), work.input)?;
            let w = scratch(meta.weight_dims(), work.weights)?;
            let bias = Tensor::uninit_gpu(ctx, Shape::new([meta.c_out])?, DType::F32)?;
            Box::new(move || conv2d_forward(&x, &w, &bias, &work.params, &plans).map(|_| ()))
        }
        ConvDirection::DWeight => {
            let x = scratch(meta.input_dims(), work.input)?;
            let dy = scratch(meta.output_dims(), operands)?;
            Box::new(move || conv2d_dweight(&x, &dy, &work.params, &plans).map(|_| ()))
        }
        ConvDirection::DInput => {
            let dy = scratch(meta.output_dims(), operands)?;
            let w = scratch(meta.weight_dims(), work.weights)?;
            let dims = meta.input_dims();
            Box::new(move || conv2d_dinput(&dy, &w, dims, &work.params, &plans).map(|_| ()))
        }
    };
    // A first call outside the timing: buffers and bind groups made.
    call()?;
    ctx.wait_idle()?;
    let mut fastest = f64::INFINITY;
    for _ in 0..ROUNDS {
        let nanos = if ctx.caps().timestamps {
            ctx.timed_span(|| (0..CALLS).try_for_each(|_| call()))?.1
        } else {
            let start = Instant::now();
            (0..CALLS).try_for_each(|_| call())?;
            ctx.wait_idle()?;
            start.elapsed().as_secs_f64() * 1e9
        };
        fastest = fastest.min(nanos / CALLS as f64);
    }
    // A span that timed nothing (or a clock that did not move) says nothing
    // of the candidate: it must not win.
    if fastest.is_finite() && fastest > 0.0 {
        Ok(fastest)
    } else {
        Err(AetherError::Gpu {
            during: "timing a conv plan",
            message: format!("{direction:?} on {:?} timed {fastest} ns", meta.key()),
        })
    }
}
