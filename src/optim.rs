//! Adam and AdamW, updating every parameter of a model with one fused kernel,
//! and the regularization loss of all parameters in one GPU reduction.
//!
//! On the GPU the first step packs the parameters into one buffer and hands
//! each layer a view of its segment (segments start at binding-aligned
//! offsets); from then on one dispatch updates them all in place. Gradients
//! get a packed buffer of the same layout: [`Adam::grad_outputs`] are views of
//! it that a model's layers write their gradients into, so a settled step
//! copies nothing. Where the adapter has f16, the step also writes each
//! updated parameter as f16 into a packed mirror ([`Adam::param_shadows`]),
//! which the conv layers take as their f16 weight operand instead of casting.
//! A parameter or gradient that is not its view (the first step, a loaded
//! checkpoint, a caller's own tensors) is copied into its segment (copies are
//! commands, not kernels). Each parameter carries its own L1/L2 coefficients
//! and whether weight decay applies to it (BatchNorm's parameters are
//! excluded).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::device::Device;
use crate::error::{AetherError, Result, check_hyperparameter};
use crate::gpu::{GpuContext, GpuSlice, PipelineKey, flat_grid};
use crate::tensor::{DType, Shape, Tensor, packed_offsets, view_offsets};

const ADAM: &str = concat!(
    include_str!("../shaders/optim/segments.wgsl"),
    include_str!("../shaders/optim/adam_update.wgsl"),
    include_str!("../shaders/optim/adam.wgsl")
);
/// The Adam step that also writes the f16 mirror of the parameters.
const ADAM_F16: &str = concat!(
    "enable f16;\n",
    include_str!("../shaders/common/f16_bits.wgsl"),
    include_str!("../shaders/optim/segments.wgsl"),
    include_str!("../shaders/optim/adam_update.wgsl"),
    include_str!("../shaders/optim/adam_f16.wgsl")
);
const REGULARIZATION: &str = concat!(
    include_str!("../shaders/optim/segments.wgsl"),
    include_str!("../shaders/optim/regularization.wgsl")
);
const SUM_IN_ORDER: &str = include_str!("../shaders/optim/sum_in_order.wgsl");
const FINITE_CHECK: &str = concat!(
    include_str!("../shaders/optim/segments.wgsl"),
    include_str!("../shaders/optim/finite_check.wgsl")
);
/// The gate's value while every step was finite (finite_check.wgsl).
const GATE_OPEN: u32 = u32::MAX;
const WORKGROUP: u32 = 256;
/// The most values one `sum_in_order` dispatch adds (its one invocation's loop).
const SUM_IN_ORDER_STEP: usize = 1 << 14;

/// One trainable tensor as the optimizer sees it.
pub struct Param<'a> {
    /// Replaced by the updated tensor after a step (on the GPU: a view of the
    /// packed parameters, updated in place by later steps).
    pub value: &'a mut Tensor,
    pub grad: &'a Tensor,
    /// Coefficients of the layer's L1 and L2 penalties on this tensor.
    pub l1: f32,
    pub l2: f32,
    /// Whether decoupled weight decay applies (false for BatchNorm).
    pub decays: bool,
}

/// A parameter's segment of the packed buffers, as the shaders read it.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Segment {
    start: u32,
    end: u32,
    l1: f32,
    l2: f32,
    decays: u32,
}

/// Adam (Kingma & Ba) with optional decoupled weight decay (AdamW).
///
/// A step whose loss or gradients are not finite (Inf or NaN) changes
/// nothing, as PyTorch's GradScaler skips such a step: on the GPU a check
/// recorded before the fused update (in the same submission, read by no host)
/// closes a gate the update reads. The gate stays closed, so every later step
/// changes nothing either, until [`Adam::reopen`] after the host has read
/// [`Adam::skipped_step`]: the parameters and moments stay those from before
/// the first bad step.
pub struct Adam {
    pub learning_rate: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub epsilon: f32,
    /// Decoupled weight decay per step, `p -= lr * weight_decay * p` (0 for Adam).
    pub weight_decay: f32,
    steps: u32,
    moments: Option<Moments>,
    /// Moments read from a checkpoint ([`Adam::set_state`]), laid out by the
    /// first step that follows.
    restored: Option<AdamState>,
}

/// What [`Adam`] carries from step to step, as a checkpoint saves it: the
/// step count (the bias correction's `t`) and each parameter's first and
/// second moments, in the order the steps take the parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamState {
    pub steps: u32,
    pub m: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

/// First and second moments of every parameter, packed, and the layout they follow.
struct Moments {
    lengths: Vec<usize>,
    /// Element offset of each parameter in the packed buffers, then the total:
    /// end to end on the CPU, at binding-aligned offsets on the GPU.
    offsets: Vec<usize>,
    m: Tensor,
    v: Tensor,
    /// The GPU segment table, uploaded on the first step: an upload flushes the
    /// pending batch, so later steps must not upload anything.
    segments: Option<Tensor>,
    /// The packed parameters on the GPU and a view of each one's segment.
    packed: Option<(Tensor, Vec<Tensor>)>,
    /// The packed gradients on the GPU, laid out as the parameters, and views.
    packed_grads: Option<(Tensor, Vec<Tensor>)>,
    /// The parameters' f16 mirror on an adapter with f16, laid out alike, and views.
    packed_f16: Option<(Tensor, Vec<Tensor>)>,
    /// The first step (counting from 1) whose loss or gradients were not
    /// finite, or [`GATE_OPEN`]: a `[1]` U32 tensor on the parameters'
    /// device, which the GPU's check writes and its update reads, so no step
    /// waits for the host (see [`Adam::skipped_step`]).
    gate: Tensor,
}

impl Adam {
    /// Adam with the usual defaults (beta1 0.9, beta2 0.999, epsilon 1e-7 as in Aether-ML).
    pub fn new(learning_rate: f32) -> Self {
        Self {
            learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-7,
            weight_decay: 0.0,
            steps: 0,
            moments: None,
            restored: None,
        }
    }

    /// AdamW: Adam with decoupled weight decay.
    pub fn adamw(learning_rate: f32, weight_decay: f32) -> Self {
        Self {
            weight_decay,
            ..Self::new(learning_rate)
        }
    }

    /// `Ok` where every hyperparameter is in its range: a finite learning
    /// rate and weight decay of at least 0, betas in [0, 1), a positive finite
    /// epsilon. [`Adam::step`] checks it before it changes anything.
    pub fn validate(&self) -> Result<()> {
        let checks = [
            (
                "Adam learning_rate",
                self.learning_rate,
                "finite and >= 0",
                self.learning_rate >= 0.0 && self.learning_rate.is_finite(),
            ),
            (
                "Adam beta1",
                self.beta1,
                "in [0, 1)",
                (0.0..1.0).contains(&self.beta1),
            ),
            (
                "Adam beta2",
                self.beta2,
                "in [0, 1)",
                (0.0..1.0).contains(&self.beta2),
            ),
            (
                "Adam epsilon",
                self.epsilon,
                "finite and > 0",
                self.epsilon > 0.0 && self.epsilon.is_finite(),
            ),
            (
                "Adam weight_decay",
                self.weight_decay,
                "finite and >= 0",
                self.weight_decay >= 0.0 && self.weight_decay.is_finite(),
            ),
        ];
        for (name, value, expected, valid) in checks {
            check_hyperparameter(name, value, valid, expected)?;
        }
        Ok(())
    }

    /// Drops the moments, their packed buffers and the step count, keeping
    /// the hyperparameters: the next step starts afresh for the parameters
    /// as they are then (rebuilt, or moved to another device).
    pub(crate) fn forget_state(&mut self) {
        self.steps = 0;
        self.moments = None;
        self.restored = None;
    }

    /// The step count and moments, for a checkpoint; `None` before the
    /// first step (nothing to carry). On the GPU this reads the moments back.
    pub fn state(&self) -> Result<Option<AdamState>> {
        let Some(moments) = &self.moments else {
            return Ok(self.restored.clone());
        };
        let unpack = |packed: &Tensor| -> Result<Vec<Vec<f32>>> {
            let all = packed.to_vec_f32()?;
            Ok(moments
                .lengths
                .iter()
                .zip(&moments.offsets)
                .map(|(&len, &at)| all[at..at + len].to_vec())
                .collect())
        };
        Ok(Some(AdamState {
            steps: self.steps,
            m: unpack(&moments.m)?,
            v: unpack(&moments.v)?,
        }))
    }

    /// Continues from `state` (see [`Adam::state`]) instead of a first step:
    /// the next step takes the parameters with these moments and step count,
    /// exactly as the optimizer that saved them would have. The next step
    /// refuses it where the parameters' sizes differ. Every moment must be
    /// finite, and every second moment at least 0.
    pub fn set_state(&mut self, state: AdamState) -> Result<()> {
        let bad = state.m.iter().flatten().any(|x| !x.is_finite())
            || state
                .v
                .iter()
                .flatten()
                .any(|x| !(x.is_finite() && *x >= 0.0))
            || state.m.len() != state.v.len()
            || state
                .m
                .iter()
                .zip(&state.v)
                .any(|(m, v)| m.len() != v.len());
        if bad {
            return Err(AetherError::InvalidShape {
                op: "Adam::set_state",
                shape: state.m.iter().map(Vec::len).collect(),
                reason: "moments must pair up, be finite, and second moments at least 0".into(),
            });
        }
        self.moments = None;
        self.steps = state.steps;
        self.restored = Some(state);
        Ok(())
    }

    /// Steps taken so far (skipped ones included, until [`Adam::reopen`]).
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// The first step (counting from 1, as [`Adam::steps`]) whose loss or
    /// gradients were not finite, so that it and every step after it changed
    /// nothing; `None` where all were finite. On the GPU this reads the gate
    /// back (a wait for the steps recorded so far).
    pub fn skipped_step(&self) -> Result<Option<u32>> {
        let Some(moments) = &self.moments else {
            return Ok(None);
        };
        let gate = moments.gate.to_vec_u32()?[0];
        Ok((gate != GATE_OPEN).then_some(gate))
    }

    /// Forgets the steps from the first skipped one on (the step count goes
    /// back to the last finite step) and opens the gate, so training can go
    /// on from the parameters as they are. Returns how many steps it took
    /// back (0 where none was skipped).
    pub fn reopen(&mut self) -> Result<u32> {
        let Some(first) = self.skipped_step()? else {
            return Ok(0);
        };
        let moments = self.moments.as_mut().expect("a step was taken");
        moments.gate = Tensor::from_u32(vec![1], vec![GATE_OPEN], &moments.gate.device())?;
        let taken_back = self.steps - (first - 1);
        self.steps = first - 1;
        Ok(taken_back)
    }

    /// The gate of the last step: `[1]` U32, `u32::MAX` (open)
    /// while every step was finite. A layer whose state moves in the forward
    /// pass (BatchNorm's running statistics) keeps the new state only where
    /// it is open.
    pub fn gate(&self) -> Option<&Tensor> {
        self.moments.as_ref().map(|m| &m.gate)
    }

    /// On the GPU, after the first step: where the parameters' gradients
    /// should be written for the next steps, in the order the step took the
    /// parameters (views of the packed gradient buffer, which the step then
    /// reads without a copy).
    pub fn grad_outputs(&self) -> Option<&[Tensor]> {
        let moments = self.moments.as_ref()?;
        moments
            .packed_grads
            .as_ref()
            .map(|(_, views)| views.as_slice())
    }

    /// On a GPU with f16, after a step: each parameter as the step left it,
    /// rounded to f16, in the order the step took the parameters (views of the
    /// packed mirror the step writes). Valid until a parameter is replaced.
    pub fn param_shadows(&self) -> Option<&[Tensor]> {
        let moments = self.moments.as_ref()?;
        moments
            .packed_f16
            .as_ref()
            .map(|(_, views)| views.as_slice())
    }

    /// Updates every parameter from its gradient; all must be f32 on one
    /// device. A gradient that is not finite skips the step (see [`Adam`]).
    pub fn step(&mut self, params: &mut [Param]) -> Result<()> {
        self.step_with_loss(params, None)
    }

    /// [`Adam::step`], skipped also where `loss` (a `[1]` F32 tensor on the
    /// parameters' device) is not finite.
    pub fn step_with_loss(&mut self, params: &mut [Param], loss: Option<&Tensor>) -> Result<()> {
        self.validate()?;
        let lengths: Vec<usize> = params.iter().map(|p| p.value.numel()).collect();
        for p in params.iter() {
            check_param(p)?;
        }
        let Some(first) = params.first() else {
            return Ok(());
        };
        let device = first.value.device();
        if let Some(other) = params.iter().find(|p| !p.value.device().same_as(&device)) {
            return Err(AetherError::DeviceMismatch {
                op: "Adam::step (all parameters on one device)",
                a: device.name(),
                b: other.value.device().name(),
            });
        }
        if let Some(loss) = loss
            && (loss.numel() != 1 || loss.dtype() != DType::F32 || !loss.device().same_as(&device))
        {
            return Err(AetherError::InvalidShape {
                op: "Adam::step loss",
                shape: loss.dims().to_vec(),
                reason: format!("must be one F32 value on {}", device.name()),
            });
        }
        match &self.moments {
            Some(m) if m.lengths != lengths => {
                return Err(AetherError::ShapeMismatch {
                    op: "Adam::step (parameter sizes changed since the first step)",
                    expected: m.lengths.clone(),
                    actual: lengths,
                });
            }
            Some(m) if !m.m.device().same_as(&device) => {
                return Err(AetherError::DeviceMismatch {
                    op: "Adam::step",
                    a: m.m.device().name(),
                    b: device.name(),
                });
            }
            Some(_) => {}
            None => {
                let offsets: Vec<usize> = match &device {
                    Device::Cpu => packed_offsets(lengths.iter().copied(), 1),
                    Device::Gpu(ctx) => {
                        let shapes: Vec<Shape> =
                            params.iter().map(|p| p.value.shape().clone()).collect();
                        view_offsets(ctx, &shapes)
                    }
                };
                let total = *offsets.last().expect("offsets end with the total");
                let restored = self.restored.take();
                if let Some(r) = &restored {
                    let saved: Vec<usize> = r.m.iter().map(Vec::len).collect();
                    if saved != lengths {
                        self.restored = restored;
                        return Err(AetherError::ShapeMismatch {
                            op: "Adam::step (parameter sizes of the restored state)",
                            expected: saved,
                            actual: lengths,
                        });
                    }
                }
                let packed = |which: fn(&AdamState) -> &Vec<Vec<f32>>| {
                    let mut flat = vec![0.0; total];
                    if let Some(r) = &restored {
                        for (values, &at) in which(r).iter().zip(&offsets) {
                            flat[at..at + values.len()].copy_from_slice(values);
                        }
                    }
                    Tensor::from_f32(vec![total], flat, &device)
                };
                let (m, v) = (packed(|r| &r.m)?, packed(|r| &r.v)?);
                self.moments = Some(Moments {
                    lengths: lengths.clone(),
                    offsets,
                    m,
                    v,
                    segments: None,
                    packed: None,
                    packed_grads: None,
                    packed_f16: None,
                    gate: Tensor::from_u32(vec![1], vec![GATE_OPEN], &device)?,
                });
            }
        }
        self.steps += 1;
        let t = self.steps as i32;
        let lr_t =
            self.learning_rate * (1.0 - self.beta2.powi(t)).sqrt() / (1.0 - self.beta1.powi(t));
        let decay_lr = self.learning_rate * self.weight_decay;
        let moments = self.moments.as_mut().expect("initialised above");
        match &device {
            Device::Cpu => self.step_cpu(params, loss, lr_t, decay_lr),
            Device::Gpu(ctx) => {
                let hyper = [self.beta1, self.beta2, self.epsilon];
                step_gpu(ctx, params, moments, loss, t as u32, lr_t, decay_lr, hyper)
            }
        }
    }

    fn step_cpu(
        &mut self,
        params: &mut [Param],
        loss: Option<&Tensor>,
        lr_t: f32,
        decay_lr: f32,
    ) -> Result<()> {
        let (b1, b2, eps) = (self.beta1, self.beta2, self.epsilon);
        let step = self.steps;
        let moments = self.moments.as_mut().expect("initialised");
        let mut finite = true;
        for value in loss
            .iter()
            .map(|l| l.to_vec_f32())
            .chain(params.iter().map(|p| p.grad.to_vec_f32()))
        {
            finite &= value?.iter().all(|v| v.is_finite());
        }
        let gate = moments.gate.to_vec_u32()?[0];
        if gate != GATE_OPEN || !finite {
            let first = if gate == GATE_OPEN { step } else { gate };
            moments.gate = Tensor::from_u32(vec![1], vec![first], &Device::Cpu)?;
            return Ok(());
        }
        let mut m = moments.m.to_vec_f32()?;
        let mut v = moments.v.to_vec_f32()?;
        for (p, &offset) in params.iter_mut().zip(&moments.offsets) {
            let grad = p.grad.to_vec_f32()?;
            let mut value = p.value.to_vec_f32()?;
            for (j, (w, &g)) in value.iter_mut().zip(&grad).enumerate() {
                let i = offset + j;
                let g = g + p.l1 * sign(*w) + 2.0 * p.l2 * *w;
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                if p.decays {
                    *w -= decay_lr * *w;
                }
                *w -= lr_t * m[i] / (v[i].sqrt() + eps);
            }
            *p.value = Tensor::from_f32(p.value.dims().to_vec(), value, &Device::Cpu)?;
        }
        let total = m.len();
        moments.m = Tensor::from_f32(vec![total], m, &Device::Cpu)?;
        moments.v = Tensor::from_f32(vec![total], v, &Device::Cpu)?;
        Ok(())
    }
}

/// WGSL's `sign`: 0 at 0 (Rust's `signum` gives 1).
fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

fn check_param(p: &Param) -> Result<()> {
    if p.value.dtype() != DType::F32 || p.grad.dtype() != DType::F32 {
        return Err(AetherError::InvalidShape {
            op: "Adam::step",
            shape: p.value.dims().to_vec(),
            reason: "parameters and gradients must be F32".into(),
        });
    }
    if p.value.dims() != p.grad.dims() {
        return Err(AetherError::ShapeMismatch {
            op: "Adam::step gradient",
            expected: p.value.dims().to_vec(),
            actual: p.grad.dims().to_vec(),
        });
    }
    if !p.value.device().same_as(&p.grad.device()) {
        return Err(AetherError::DeviceMismatch {
            op: "Adam::step",
            a: p.value.device().name(),
            b: p.grad.device().name(),
        });
    }
    Ok(())
}

/// The segment table of tensors `(len, l1, l2, decays)` starting at `starts`.
fn segments(
    items: impl Iterator<Item = (usize, f32, f32, bool)>,
    starts: &[usize],
) -> Vec<Segment> {
    items
        .zip(starts)
        .map(|((len, l1, l2, decays), &start)| Segment {
            start: start as u32,
            end: (start + len) as u32,
            l1,
            l2,
            decays: u32::from(decays),
        })
        .collect()
}

/// Segments of tensors packed end to end.
fn contiguous_segments(items: impl Iterator<Item = (usize, f32, f32, bool)>) -> Vec<Segment> {
    let items: Vec<_> = items.collect();
    let starts = packed_offsets(items.iter().map(|&(len, ..)| len), 1);
    segments(items.into_iter(), &starts)
}

fn pipeline(
    ctx: &GpuContext,
    kernel: &'static str,
    source: &'static str,
) -> Result<Arc<wgpu::ComputePipeline>> {
    ctx.pipelines()
        .require(&PipelineKey::new(kernel, "portable"), "main", || {
            source.into()
        })
}

fn gpu_buf(t: &Tensor) -> GpuSlice<'_> {
    t.gpu_slice().expect("checked to be on the GPU")
}

/// Records a copy of f32 tensor `t` into `flat` at byte `offset`.
fn copy_into(ctx: &GpuContext, t: &Tensor, flat: &Tensor, offset: u64) {
    let (src, dst) = (gpu_buf(t), gpu_buf(flat));
    ctx.copy_buffer_region(
        src.buffer,
        src.offset,
        dst.buffer,
        offset,
        t.numel() as u64 * 4,
    );
}

/// Packs `tensors` end to end into one flat f32 tensor with buffer copies.
fn pack(ctx: &Arc<GpuContext>, tensors: &[&Tensor]) -> Result<Tensor> {
    let offsets = packed_offsets(tensors.iter().map(|t| t.numel()), 1);
    let total = *offsets.last().expect("offsets end with the total");
    let flat = Tensor::uninit_gpu(ctx, Shape::new([total])?, DType::F32)?;
    for (t, &offset) in tensors.iter().zip(&offsets) {
        copy_into(ctx, t, &flat, offset as u64 * 4);
    }
    Ok(flat)
}

#[allow(clippy::too_many_arguments)]
fn step_gpu(
    ctx: &Arc<GpuContext>,
    params: &mut [Param],
    moments: &mut Moments,
    loss: Option<&Tensor>,
    step: u32,
    lr_t: f32,
    decay_lr: f32,
    [beta1, beta2, eps]: [f32; 3],
) -> Result<()> {
    let offsets = &moments.offsets;
    let total = *offsets.last().expect("offsets end with the total");
    let byte_offset = |i: usize| offsets[i] as u64 * 4;
    if moments.packed.is_none() {
        let shapes: Vec<Shape> = params.iter().map(|p| p.value.shape().clone()).collect();
        moments.packed = Some(Tensor::gpu_views(ctx, &shapes, DType::F32)?);
        moments.packed_grads = Some(Tensor::gpu_views(ctx, &shapes, DType::F32)?);
        if ctx.caps().shader_f16 {
            moments.packed_f16 = Some(Tensor::gpu_views(ctx, &shapes, DType::F16)?);
        }
    }
    let (flat_params, views) = moments.packed.as_ref().expect("packed above");
    // Each parameter should be its own view; one that is not (the first step,
    // or a tensor the model replaced) is copied into its segment and replaced
    // by the view.
    for (i, p) in params.iter_mut().enumerate() {
        if !p.value.is_view_at(flat_params, byte_offset(i)) {
            copy_into(ctx, p.value, flat_params, byte_offset(i));
            *p.value = views[i].clone();
        }
    }
    let (flat_grads, _) = moments.packed_grads.as_ref().expect("packed above");
    for (i, p) in params.iter().enumerate() {
        if !p.grad.is_view_at(flat_grads, byte_offset(i)) {
            copy_into(ctx, p.grad, flat_grads, byte_offset(i));
        }
    }
    let seg_tensor = match &moments.segments {
        Some(t) => t.clone(),
        None => {
            let segs = segments(
                params
                    .iter()
                    .map(|p| (p.value.numel(), p.l1, p.l2, p.decays)),
                offsets,
            );
            let t = segment_tensor(ctx, &segs)?;
            moments.segments = Some(t.clone());
            t
        }
    };
    let (grid, row_stride) = flat_grid(
        total,
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    // The check closes the gate before the update reads it: a dispatch
    // cannot wait for all of its own workgroups, so it is one of its own.
    let check = [
        total as u32,
        row_stride,
        params.len() as u32,
        step,
        u32::from(loss.is_some()),
    ];
    ctx.dispatch(
        "adam_finite_check",
        &*pipeline(ctx, "adam_finite_check", FINITE_CHECK)?,
        &[
            gpu_buf(flat_grads),
            gpu_buf(&seg_tensor),
            gpu_buf(loss.unwrap_or(flat_grads)),
            gpu_buf(&moments.gate),
        ],
        bytemuck::cast_slice(&check),
        grid,
    )?;
    let uniform = [
        total as u32,
        row_stride,
        params.len() as u32,
        lr_t.to_bits(),
        beta1.to_bits(),
        beta2.to_bits(),
        eps.to_bits(),
        decay_lr.to_bits(),
    ];
    // Should the mirror's kernel fail to compile (the cache has warned), the
    // step runs without it and the layers cast their weights themselves.
    let mirror_kernel = moments.packed_f16.as_ref().and_then(|_| {
        ctx.pipelines()
            .get_or_create(&PipelineKey::new("adam", "f16_mirror"), "main", || {
                ADAM_F16.into()
            })
    });
    if mirror_kernel.is_none() {
        moments.packed_f16 = None;
    }
    let mut buffers = vec![
        gpu_buf(flat_grads),
        gpu_buf(flat_params),
        gpu_buf(&moments.m),
        gpu_buf(&moments.v),
        gpu_buf(&seg_tensor),
        gpu_buf(&moments.gate),
    ];
    let kernel = match (mirror_kernel, &moments.packed_f16) {
        (Some(kernel), Some((mirror, _))) => {
            buffers.push(gpu_buf(mirror));
            kernel
        }
        _ => pipeline(ctx, "adam", ADAM)?,
    };
    ctx.dispatch(
        "adam",
        &kernel,
        &buffers,
        bytemuck::cast_slice(&uniform),
        grid,
    )
}

/// The segment table as a GPU tensor (u32 words: Segment is five 4-byte fields).
fn segment_tensor(ctx: &Arc<GpuContext>, segs: &[Segment]) -> Result<Tensor> {
    let words: Vec<u32> = bytemuck::cast_slice(segs).to_vec();
    Tensor::from_u32(vec![words.len()], words, &Device::Gpu(Arc::clone(ctx)))
}

/// `sum(l1 * |p| + l2 * p^2)` over `(tensor, l1, l2)` triples, as a `[1]` tensor on
/// the tensors' device, computed by one deterministic reduction over all of them.
pub fn regularization_loss(terms: &[(&Tensor, f32, f32)]) -> Result<Tensor> {
    let Some(&(first, _, _)) = terms.first() else {
        return Err(AetherError::InvalidShape {
            op: "regularization_loss",
            shape: vec![],
            reason: "no parameters given".into(),
        });
    };
    let device = first.device();
    if let Some((t, _, _)) = terms
        .iter()
        .find(|(t, _, _)| !t.device().same_as(&device) || t.dtype() != DType::F32)
    {
        return Err(AetherError::InvalidShape {
            op: "regularization_loss",
            shape: t.dims().to_vec(),
            reason: format!("every term must be F32 on {}", device.name()),
        });
    }
    let Device::Gpu(ctx) = &device else {
        let mut total = 0.0f32;
        for (t, l1, l2) in terms {
            for &p in t.host_f32().expect("checked F32 on the CPU") {
                total += l1 * p.abs() + l2 * p * p;
            }
        }
        return Tensor::from_f32(vec![1], vec![total], &device);
    };
    let tensors: Vec<&Tensor> = terms.iter().map(|(t, _, _)| *t).collect();
    let flat = pack(ctx, &tensors)?;
    let segs = contiguous_segments(terms.iter().map(|(t, l1, l2)| (t.numel(), *l1, *l2, false)));
    let seg_tensor = segment_tensor(ctx, &segs)?;
    let total = flat.numel();
    let (grid, _) = flat_grid(
        total,
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    let groups = (grid[0] * grid[1]) as usize;
    let partials = Tensor::uninit_gpu(ctx, Shape::new([groups])?, DType::F32)?;
    ctx.dispatch(
        "regularization_partial",
        &*pipeline(ctx, "regularization_partial", REGULARIZATION)?,
        &[gpu_buf(&flat), gpu_buf(&seg_tensor), gpu_buf(&partials)],
        bytemuck::cast_slice(&[total as u32, segs.len() as u32]),
        grid,
    )?;
    let out = Tensor::uninit_gpu(ctx, Shape::new([1])?, DType::F32)?;
    // In order, in dispatches of at most SUM_IN_ORDER_STEP additions, the
    // total carried in `out` between them (lavapipe stops an invocation after
    // 65535 loop iterations).
    for first in (0..groups).step_by(SUM_IN_ORDER_STEP) {
        let end = (first + SUM_IN_ORDER_STEP).min(groups);
        ctx.dispatch(
            "sum_in_order",
            &*pipeline(ctx, "sum_in_order", SUM_IN_ORDER)?,
            &[gpu_buf(&partials), gpu_buf(&out)],
            bytemuck::cast_slice(&[first as u32, end as u32]),
            [1, 1, 1],
        )?;
    }
    Ok(out)
}
