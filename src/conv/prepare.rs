//! Planning a network's convs on every core before its first step.
//!
//! A conv's plan compiles its pipelines on first use, so a first step compiles
//! every conv kernel of the network one after another on the thread that
//! records it (ResNet-18's first step took 4.1 s on an H100, nearly all of it
//! in some 40 conv pipelines). [`prepare_convs`] makes the same plans for the
//! step's convs, each direction a task, on as many threads as there are
//! cores; the plans land in the layers' [`ConvPlans`] and the pipelines in
//! the context's cache, where the step then finds them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::dinput::plan_dinput;
use super::dweight::{compile_reduce, plan_dweight};
use super::forward::plan_forward;
use super::plan::{ConvDirection, ConvLaunchPlan, ConvPlans};
use super::shape::{ConvParams, ConvShapeMeta};
use super::tune;
use super::tuning::ConvTuning;
use crate::diagnostics::quietly;
use crate::error::{AetherError, Result};
use crate::gpu::GpuContext;
use crate::tensor::DType;

/// What one conv layer's step will ask of the kernels.
pub struct ConvWork<'a> {
    /// The layer's plan cache, which the step reads.
    pub plans: &'a ConvPlans,
    /// The conv's geometry, batch included, and its parameters.
    pub meta: ConvShapeMeta,
    pub params: ConvParams,
    /// The input's type (f16 where the layer before hands f16 over), as the
    /// forward and dweight read it.
    pub input: DType,
    /// The weights' operand type (the f16 shadow on the f16 variants).
    pub weights: DType,
    /// The type of the output gradient as the backward's kernels take it
    /// (cast to f16 on the f16 variants), where the step trains; `None` for a
    /// forward alone.
    pub backward: Option<DType>,
    /// Whether the backward computes the input gradient (dinput).
    pub input_grad: bool,
}

impl ConvWork<'_> {
    /// The directions the step runs.
    fn directions(&self) -> Vec<ConvDirection> {
        let mut directions = vec![ConvDirection::Forward];
        if self.backward.is_some() {
            directions.push(ConvDirection::DWeight);
            if self.input_grad {
                directions.push(ConvDirection::DInput);
            }
        }
        directions
    }

    /// Makes the plan of `direction` with the context's tuning (compiling its
    /// pipelines), or finds it made.
    fn plan(&self, ctx: &GpuContext, direction: ConvDirection) -> Result<()> {
        let plan = self.plan_with(ctx, self.plans, direction, None)?;
        let flip = match direction {
            ConvDirection::Forward => return Ok(()),
            // The dinput task knows which reduce runs.
            ConvDirection::DWeight if self.input_grad => return Ok(()),
            ConvDirection::DWeight => false,
            // The reduce also flips the filter for the f16 halo kernel (as
            // `Conv2d::backward` asks of `conv2d_dweight_into`).
            ConvDirection::DInput => plan.halo.is_some() && self.weights == DType::F16,
        };
        compile_reduce(
            ctx,
            self.plans,
            &self.meta,
            self.dweight_operands(),
            flip,
            None,
        )
    }

    /// The types of dweight's operands (input, output gradient).
    fn dweight_operands(&self) -> [DType; 2] {
        [self.input, self.backward.unwrap_or(self.weights)]
    }

    /// The plan of `direction` with `tuning` (`None`: the context's), made
    /// into `plans` (compiling its kernel), or found there.
    fn plan_with(
        &self,
        ctx: &GpuContext,
        plans: &ConvPlans,
        direction: ConvDirection,
        tuning: Option<&ConvTuning>,
    ) -> Result<ConvLaunchPlan> {
        let meta = &self.meta;
        match direction {
            ConvDirection::Forward => {
                plan_forward(ctx, plans, meta, self.input, self.weights, tuning)
            }
            ConvDirection::DWeight => {
                let [x, dy] = self.dweight_operands();
                plan_dweight(ctx, plans, meta, x, dy, tuning)
            }
            ConvDirection::DInput => plan_dinput(ctx, plans, meta, self.weights, tuning),
        }
    }

    /// The distinct plans that [`tune::candidates`] make for `direction`, each
    /// with its tuning and compiled, the rule's first; those of another
    /// variant than the rule's are left out, and the candidates' own
    /// declines and compile failures are not announced (the rule's are).
    fn candidate_plans(
        &self,
        ctx: &GpuContext,
        direction: ConvDirection,
    ) -> Vec<(ConvTuning, ConvLaunchPlan)> {
        let mut found: Vec<(ConvTuning, ConvLaunchPlan)> = Vec::new();
        for (i, tuning) in tune::candidates(direction).into_iter().enumerate() {
            let scratch = ConvPlans::new();
            let make = || {
                let plan = self.plan_with(ctx, &scratch, direction, Some(&tuning))?;
                if direction == ConvDirection::DWeight {
                    let operands = self.dweight_operands();
                    compile_reduce(ctx, &scratch, &self.meta, operands, false, Some(&tuning))?;
                }
                Ok::<_, AetherError>(plan)
            };
            let made = if i == 0 { make() } else { quietly(make) };
            let Ok(plan) = made else {
                continue;
            };
            let other_variant = found
                .first()
                .is_some_and(|(_, r)| r.variant != plan.variant);
            if !other_variant && found.iter().all(|(_, p)| *p != plan) {
                found.push((tuning, plan));
            }
        }
        found
    }
}

/// Makes the plans of every conv in `work`, spread over the machine's cores
/// (at most `threads`); the first error, if any, once all have run. A plan
/// already made is found, not made again, so calling this before every step
/// costs a lookup per direction.
///
/// Where the context measures plans ([`GpuContext::tunes_convs`]), each
/// direction not yet measured at its shape has its candidates compiled on all
/// cores first, then timed one direction at a time ([`tune`]).
pub fn prepare_convs(ctx: &Arc<GpuContext>, work: &[ConvWork<'_>], threads: usize) -> Result<()> {
    let tasks: Vec<(&ConvWork<'_>, ConvDirection)> = work
        .iter()
        .flat_map(|w| w.directions().into_iter().map(move |d| (w, d)))
        .collect();
    if ctx.tunes_convs() {
        let untuned: Vec<_> = tasks
            .iter()
            .filter(|(w, d)| {
                ctx.tuned_plans().get(*d, &w.meta).is_none() && !w.plans.has(ctx, *d, &w.meta)
            })
            .collect();
        let candidates = on_threads(&untuned, threads, |(w, d)| w.candidate_plans(ctx, *d));
        for ((w, d), candidates) in untuned.iter().zip(candidates) {
            if candidates.len() > 1 {
                tune::choose(ctx, w, *d, &candidates);
            }
        }
        // One write for all the tunings this step measured.
        ctx.tuned_plans().save();
    }
    on_threads(&tasks, threads, |(w, d)| w.plan(ctx, *d))
        .into_iter()
        .collect()
}

/// `f` of each item, in order, computed on at most `threads` threads taking
/// the items in turn.
fn on_threads<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads.min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else {
                        break;
                    };
                    let result = f(item);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item taken"))
        .collect()
}
