//! Planning a network's convs on every core before its first step.
//!
//! A conv's plan compiles its pipelines on first use, so a first step compiles
//! every conv kernel of the network one after another on the thread that
//! records it (ResNet-18's first step took 4.1 s on an H100, nearly all of it
//! in some 40 conv pipelines). [`prepare_convs`] makes the same plans for the
//! step's convs, each direction a task, on as many threads as there are
//! cores; the plans land in the layers' [`ConvPlans`] and the pipelines in
//! the context's cache, where the step then finds them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::dinput::plan_dinput;
use super::dweight::{compile_reduce, plan_dweight};
use super::forward::plan_forward;
use super::plan::{ConvDirection, ConvPlans};
use super::shape::ConvShapeMeta;
use crate::error::{AetherError, Result};
use crate::gpu::GpuContext;
use crate::tensor::DType;

/// What one conv layer's step will ask of the kernels.
pub struct ConvWork<'a> {
    /// The layer's plan cache, which the step reads.
    pub plans: &'a ConvPlans,
    /// The conv's geometry, batch included.
    pub meta: ConvShapeMeta,
    /// The forward's input type (f16 where the layer before hands f16 over).
    pub input: DType,
    /// The weights' operand type (the f16 shadow on the f16 variants).
    pub weights: DType,
    /// The backward's operand type, where the step trains; `None` for a
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

    /// Makes the plan of `direction` (compiling its pipelines), or finds it made.
    fn plan(&self, ctx: &GpuContext, direction: ConvDirection) -> Result<()> {
        let operands = self.backward.unwrap_or(self.weights);
        match direction {
            ConvDirection::Forward => {
                plan_forward(ctx, self.plans, &self.meta, self.input, self.weights).map(|_| ())
            }
            ConvDirection::DWeight => {
                plan_dweight(ctx, self.plans, &self.meta, operands, operands)?;
                if self.input_grad {
                    // The dinput task knows which reduce runs.
                    return Ok(());
                }
                compile_reduce(ctx, self.plans, &self.meta, operands, false)
            }
            ConvDirection::DInput => {
                let plan = plan_dinput(ctx, self.plans, &self.meta, self.weights)?;
                // The reduce also flips the filter for the f16 halo kernel
                // (as `Conv2d::backward` asks of `conv2d_dweight_into`).
                let flip = plan.halo.is_some() && self.weights == DType::F16;
                compile_reduce(ctx, self.plans, &self.meta, operands, flip)
            }
        }
    }
}

/// Makes the plans of every conv in `work`, spread over the machine's cores
/// (at most `threads`); the first error, if any, once all have run. A plan
/// already made is found, not made again, so calling this before every step
/// costs a lookup per direction.
pub fn prepare_convs(ctx: &GpuContext, work: &[ConvWork<'_>], threads: usize) -> Result<()> {
    let tasks: Vec<(&ConvWork<'_>, ConvDirection)> = work
        .iter()
        .flat_map(|w| w.directions().into_iter().map(move |d| (w, d)))
        .collect();
    let threads = threads.min(tasks.len());
    if threads <= 1 {
        return tasks.iter().try_for_each(|(w, d)| w.plan(ctx, *d));
    }
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<AetherError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some((w, d)) = tasks.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(err) = w.plan(ctx, *d) {
                        first_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(err);
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(err) => Err(err),
        None => Ok(()),
    }
}
