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
use super::direct::DIRECT_ENV;
use super::dweight::halo::DWEIGHT_HALO_ENV;
use super::dweight::{SPLIT_ENV, conv2d_dweight};
use super::forward::conv2d_forward;
use super::forward::halo::{GROUPS_ENV, HALO_ENV, RAGGED_ENV, STACK_ENV};
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
                vec![(RAGGED_ENV, "1")],
            ],
        ),
        ConvDirection::DInput => (
            DINPUT_HALO_ENV,
            vec![
                vec![(STACK_ENV, "1")],
                vec![(STACK_ENV, "0")],
                vec![(RAGGED_ENV, "1")],
            ],
        ),
        ConvDirection::DWeight => (
            DWEIGHT_HALO_ENV,
            vec![
                vec![(SPLIT_ENV, "1")],
                vec![(SPLIT_ENV, "4")],
                vec![(SPLIT_ENV, "8")],
                vec![(RAGGED_ENV, "1")],
            ],
        ),
    };
    list.push(tuning(&[(halo_off, "0")]));
    list.extend(more.iter().map(|pairs| tuning(pairs)));
    for block in BLOCKS {
        list.push(tuning(&[(halo_off, "0"), (BLOCK_ENV, block)]));
    }
    if direction != ConvDirection::DInput {
        // The rule takes a direct kernel wherever it fits: the others time
        // the GEMM cores against it.
        for other in &mut list[1..] {
            *other = std::mem::take(other)
                .set(DIRECT_ENV, "0")
                .expect("a tuning variable");
        }
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
/// The measured plans' file for this adapter and driver and for what was
/// measured: [`candidates_fingerprint`] names the candidates, so a file that
/// another aether wrote (another version, or other candidates, such as a
/// tuning it did not have) is not read, and its shapes are measured again
/// rather than planned from choices among what no longer is.
fn file_name(info: &wgpu::AdapterInfo) -> String {
    plans_file_name(&format!(
        "{}-{:x}-{:x}-{}-{}",
        info.name, info.vendor, info.device, info.driver, info.driver_info
    ))
}

/// [`file_name`] for the adapter and driver described by `text`.
fn plans_file_name(text: &str) -> String {
    let safe: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("conv-plans-{safe}-{:016x}.json", candidates_fingerprint())
}

/// FNV-1a of the crate's version and every direction's candidate tunings:
/// the same in every process of one build (no random hasher state).
fn candidates_fingerprint() -> u64 {
    let directions = [
        ConvDirection::Forward,
        ConvDirection::DWeight,
        ConvDirection::DInput,
    ];
    let text = format!(
        "{} {:?}",
        env!("CARGO_PKG_VERSION"),
        directions.map(candidates)
    );
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
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
/// `ctx` (written to its file by [`TunedPlans::save`]). The candidates take
/// turns, one round of [`CALLS`] calls each per turn over [`ROUNDS`] turns,
/// and each keeps its fastest round: a clock still rising in the first step,
/// or other work on the GPU, then weighs on every candidate alike instead of
/// on whichever was timed first. A candidate that fails to run is left out;
/// where none runs, that is announced, nothing is kept, and the rule plans.
pub(crate) fn choose(
    ctx: &Arc<GpuContext>,
    work: &ConvWork<'_>,
    direction: ConvDirection,
    candidates: &[(ConvTuning, ConvLaunchPlan)],
) {
    let mut failures = Vec::new();
    let mut timed: Vec<(&ConvTuning, Call<'_>, f64)> = Vec::new();
    match Operands::new(ctx, work, direction) {
        Ok(operands) => {
            let operands = Arc::new(operands);
            for (tuning, plan) in candidates {
                let call = operands.clone().call(ctx, work, direction, plan);
                // A first call outside the timing: pipelines, buffers and bind
                // groups made.
                match call().and_then(|()| ctx.wait_idle()) {
                    Ok(()) => timed.push((tuning, call, f64::INFINITY)),
                    Err(e) => failures.push(e.to_string()),
                }
            }
        }
        Err(e) => failures.push(e.to_string()),
    }
    for _ in 0..ROUNDS {
        timed.retain_mut(|(_, call, fastest)| match time_round(ctx, call.as_ref()) {
            Ok(nanos) => {
                *fastest = fastest.min(nanos);
                true
            }
            Err(e) => {
                failures.push(e.to_string());
                false
            }
        });
    }
    // A span that timed nothing (or a clock that did not move) says nothing
    // of the candidate: it must not win.
    for (_, _, fastest) in &timed {
        if !(fastest.is_finite() && *fastest > 0.0) {
            failures.push(format!(
                "{direction:?} on {:?} timed {fastest} ns",
                work.meta.key()
            ));
        }
    }
    let best = timed
        .iter()
        .filter(|(_, _, fastest)| fastest.is_finite() && *fastest > 0.0)
        .min_by(|a, b| a.2.total_cmp(&b.2));
    let Some((chosen, _, _)) = best else {
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

/// One call of a candidate's plan on the shared operands.
type Call<'a> = Box<dyn Fn() -> Result<()> + 'a>;

/// Scratch operands of one direction at `work`'s shape, shared by every
/// candidate timed on it (their values do not matter to the timing).
enum Operands {
    Forward { x: Tensor, w: Tensor, bias: Tensor },
    DWeight { x: Tensor, dy: Tensor },
    DInput { dy: Tensor, w: Tensor },
}

impl Operands {
    fn new(ctx: &Arc<GpuContext>, work: &ConvWork<'_>, direction: ConvDirection) -> Result<Self> {
        let meta = &work.meta;
        let scratch = |dims: &[usize], dtype| Tensor::uninit_gpu(ctx, Shape::new(dims)?, dtype);
        let operands = work.backward.unwrap_or(work.weights);
        Ok(match direction {
            ConvDirection::Forward => Self::Forward {
                x: scratch(&meta.input_dims(), work.input)?,
                w: scratch(&meta.weight_dims(), work.weights)?,
                bias: scratch(&[meta.c_out], DType::F32)?,
            },
            ConvDirection::DWeight => Self::DWeight {
                x: scratch(&meta.input_dims(), work.input)?,
                dy: scratch(&meta.output_dims(), operands)?,
            },
            ConvDirection::DInput => Self::DInput {
                dy: scratch(&meta.output_dims(), operands)?,
                w: scratch(&meta.weight_dims(), work.weights)?,
            },
        })
    }

    /// One call of `direction` with `plan` on these operands.
    fn call<'a>(
        self: Arc<Self>,
        ctx: &Arc<GpuContext>,
        work: &'a ConvWork<'_>,
        direction: ConvDirection,
        plan: &ConvLaunchPlan,
    ) -> Call<'a> {
        let plans = ConvPlans::with_plan(ctx, direction, &work.meta, *plan);
        let params = &work.params;
        let dims = work.meta.input_dims();
        Box::new(move || match self.as_ref() {
            Self::Forward { x, w, bias } => conv2d_forward(x, w, bias, params, &plans).map(|_| ()),
            Self::DWeight { x, dy } => conv2d_dweight(x, dy, params, &plans).map(|_| ()),
            Self::DInput { dy, w } => conv2d_dinput(dy, w, dims, params, &plans).map(|_| ()),
        })
    }
}

/// GPU nanoseconds a call of one round of [`CALLS`] calls of `call` back to
/// back; wall time where the adapter has no timestamps.
fn time_round(ctx: &Arc<GpuContext>, call: &dyn Fn() -> Result<()>) -> Result<f64> {
    let nanos = if ctx.caps().timestamps {
        ctx.timed_span(|| (0..CALLS).try_for_each(|_| call()))?.1
    } else {
        let start = Instant::now();
        (0..CALLS).try_for_each(|_| call())?;
        ctx.wait_idle()?;
        start.elapsed().as_secs_f64() * 1e9
    };
    Ok(nanos / CALLS as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plans file names the candidates it chose among, the same way in
    /// every process: a measured tuning that is no longer a candidate (or a
    /// candidate never measured) means another file.
    #[test]
    fn the_plans_file_names_the_candidates_measured() {
        let name = plans_file_name("NVIDIA H100 80GB HBM3-10de-2330-NVIDIA-580.159.04");
        let fingerprint = format!("-{:016x}.json", candidates_fingerprint());
        let adapter = "conv-plans-NVIDIA_H100_80GB_HBM3_10de_2330_NVIDIA_580_159_04-";
        assert!(name.starts_with(adapter), "{name}");
        assert!(name.ends_with(&fingerprint), "{name}");
        assert_eq!(candidates_fingerprint(), candidates_fingerprint());
    }
}
