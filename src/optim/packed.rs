//! What every fused optimizer shares: the parameters' layout in packed
//! buffers, the per-element state (an optimizer's moments or momentum), the
//! non-finite gate, and the step that records the check, the update and the
//! loss scaler's update.
//!
//! On the GPU the first step packs the parameters into one buffer and hands
//! each layer a view of its segment (segments start at binding-aligned
//! offsets); from then on one dispatch updates them all in place. Gradients
//! get a packed buffer of the same layout, whose views the layers write their
//! gradients into, so a settled step copies nothing. Where the adapter has
//! f16, the update also writes each parameter as f16 into a packed mirror,
//! which the conv layers take as their f16 weight operand instead of casting.
//! A parameter or gradient that is not its view (the first step, a loaded
//! checkpoint, a caller's own tensors) is copied into its segment (copies are
//! commands, not kernels).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::scale::LossScaler;
use super::{OptimizerState, Param};
use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::gpu::{GpuContext, GpuSlice, PipelineKey, flat_grid};
use crate::tensor::{DType, Shape, Tensor, packed_offsets, view_offsets};

const SEGMENTS: &str = include_str!("../../shaders/optim/segments.wgsl");
const UPDATE_COMMON: &str = include_str!("../../shaders/optim/update_common.wgsl");
const STEP: &str = include_str!("../../shaders/optim/step.wgsl");
const STEP_F16: &str = include_str!("../../shaders/optim/step_f16.wgsl");
const F16_BITS: &str = include_str!("../../shaders/common/f16_bits.wgsl");
const FINITE_CHECK: &str = concat!(
    include_str!("../../shaders/optim/segments.wgsl"),
    include_str!("../../shaders/optim/finite_check.wgsl")
);
/// The gate's value while every step was finite (finite_check.wgsl).
pub(crate) const GATE_OPEN: u32 = u32::MAX;
pub(crate) const WORKGROUP: u32 = 256;

/// A parameter's segment of the packed buffers, as the shaders read it
/// (segments.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct Segment {
    pub start: u32,
    pub end: u32,
    pub l1: f32,
    pub l2: f32,
    /// Multiplier of the weight decay (0: none).
    pub decay: f32,
    /// Multiplier of the learning rate.
    pub lr: f32,
}

/// One optimizer's update rule as the packed step runs it.
pub(crate) struct Rule {
    /// Kernel name (and pipeline key) of the update.
    pub kernel: &'static str,
    /// The WGSL defining `Params` and `fn update(i: u32) -> bool`.
    pub source: &'static str,
    /// The uniform `Params`, as u32 words.
    pub uniform: Vec<u32>,
}

/// The layout, packed buffers, state and gate of one optimizer's parameters.
pub(crate) struct Packed {
    pub lengths: Vec<usize>,
    /// Element offset of each parameter in the packed buffers, then the total:
    /// end to end on the CPU, at binding-aligned offsets on the GPU.
    pub offsets: Vec<usize>,
    /// The optimizer's per-element state: `buffers` tensors of the total
    /// length, each its own binding, so a state never needs a binding longer
    /// than the parameters' (a device's 128 MiB binding limit holds 33M
    /// parameters, not the half of that one block of Adam's m and v would
    /// allow). Without state, one element, so the binding the update
    /// declares is there.
    pub state: Vec<Tensor>,
    pub buffers: usize,
    /// The GPU segment table as uploaded, and the table itself: uploaded on
    /// the first step and again only where the parameters' penalties or
    /// group multipliers changed (an upload flushes the pending batch, so a
    /// settled step must not upload anything).
    segments: Option<(Vec<Segment>, Tensor)>,
    /// The packed parameters on the GPU and a view of each one's segment.
    packed: Option<(Tensor, Vec<Tensor>)>,
    /// The packed gradients on the GPU, laid out as the parameters, and views.
    pub packed_grads: Option<(Tensor, Vec<Tensor>)>,
    /// The parameters' f16 mirror on an adapter with f16, laid out alike, and views.
    pub packed_f16: Option<(Tensor, Vec<Tensor>)>,
    /// The first step (counting from 1) whose loss or gradients were not
    /// finite, or [`GATE_OPEN`]: a `[1]` U32 tensor on the parameters'
    /// device, which the GPU's check writes and its update reads, so no step
    /// waits for the host.
    pub gate: Tensor,
    /// `S = 1` for a step without a model's loss scaler.
    unit_scaler: LossScaler,
    /// The weights' lookahead average in this layout (ema.rs), once started.
    pub ema: Option<Tensor>,
}

/// `Ok` with the parameters' device where every parameter and gradient is
/// F32, of one shape, on one device (and the loss one F32 value there).
pub(crate) fn check_params(
    op: &'static str,
    params: &[Param],
    loss: Option<&Tensor>,
) -> Result<Option<Device>> {
    for p in params {
        if p.value.dtype() != DType::F32 || p.grad.dtype() != DType::F32 {
            return Err(AetherError::InvalidShape {
                op,
                shape: p.value.dims().to_vec(),
                reason: "parameters and gradients must be F32".into(),
            });
        }
        if p.value.dims() != p.grad.dims() {
            return Err(AetherError::ShapeMismatch {
                op,
                expected: p.value.dims().to_vec(),
                actual: p.grad.dims().to_vec(),
            });
        }
        if !p.value.device().same_as(&p.grad.device()) {
            return Err(AetherError::DeviceMismatch {
                op,
                a: p.value.device().name(),
                b: p.grad.device().name(),
            });
        }
    }
    let Some(first) = params.first() else {
        return Ok(None);
    };
    let device = first.value.device();
    if let Some(other) = params.iter().find(|p| !p.value.device().same_as(&device)) {
        return Err(AetherError::DeviceMismatch {
            op,
            a: device.name(),
            b: other.value.device().name(),
        });
    }
    if let Some(loss) = loss
        && (loss.numel() != 1 || loss.dtype() != DType::F32 || !loss.device().same_as(&device))
    {
        return Err(AetherError::InvalidShape {
            op,
            shape: loss.dims().to_vec(),
            reason: format!("the loss must be one F32 value on {}", device.name()),
        });
    }
    Ok(Some(device))
}

/// Whether restored per-parameter `saved` lengths fit parameters of
/// `lengths`: one each, of its size or empty (a parameter starting afresh).
pub(crate) fn fresh_or_same(saved: &[usize], lengths: &[usize]) -> bool {
    saved.len() == lengths.len() && saved.iter().zip(lengths).all(|(&s, &l)| s == 0 || s == l)
}

impl Packed {
    /// The layout of `params` on `device`, with `buffers` per-element state
    /// buffers taken from `restored` (checked against the parameters' sizes;
    /// an empty vector: that parameter's state starts at zero) or zeros.
    pub fn new(
        op: &'static str,
        params: &[Param],
        device: &Device,
        buffers: usize,
        restored: Option<&OptimizerState>,
    ) -> Result<Self> {
        let lengths: Vec<usize> = params.iter().map(|p| p.value.numel()).collect();
        let offsets: Vec<usize> = match device {
            Device::Cpu => packed_offsets(lengths.iter().copied(), 1),
            Device::Gpu(ctx) => {
                let shapes: Vec<Shape> = params.iter().map(|p| p.value.shape().clone()).collect();
                view_offsets(ctx, &shapes)
            }
        };
        let total = *offsets.last().expect("offsets end with the total");
        if let Device::Gpu(ctx) = device {
            // The update binds all parameters (and each state buffer) at once.
            let limit = ctx.caps().max_tensor_bytes();
            let bytes = total as u64 * 4;
            if bytes > limit {
                return Err(AetherError::TooLarge {
                    what: format!(
                        "{op}: the model's {} parameters ({total} values with their segments aligned), \
                         which the fused update binds as one buffer,",
                        lengths.iter().sum::<usize>()
                    ),
                    bytes,
                    limit,
                });
            }
        }
        let mut blocks = vec![vec![0.0; total.max(1)]; buffers];
        if let Some(r) = restored {
            for (k, (_, per_param)) in r.buffers.iter().enumerate() {
                let saved: Vec<usize> = per_param.iter().map(Vec::len).collect();
                if !fresh_or_same(&saved, &lengths) || k >= buffers {
                    return Err(AetherError::ShapeMismatch {
                        op,
                        expected: saved,
                        actual: lengths,
                    });
                }
                for (values, &at) in per_param.iter().zip(&offsets) {
                    blocks[k][at..at + values.len()].copy_from_slice(values);
                }
            }
        }
        if blocks.is_empty() {
            blocks.push(vec![0.0]);
        }
        let state = blocks
            .into_iter()
            .map(|block| Tensor::from_f32(vec![block.len()], block, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            lengths,
            offsets,
            state,
            buffers,
            segments: None,
            packed: None,
            packed_grads: None,
            packed_f16: None,
            gate: Tensor::from_u32(vec![1], vec![GATE_OPEN], device)?,
            unit_scaler: LossScaler::unit(device)?,
            ema: None,
        })
    }

    /// `Ok` where `params` still fit this layout and device.
    pub fn check_layout(&self, op: &'static str, params: &[Param], device: &Device) -> Result<()> {
        let lengths: Vec<usize> = params.iter().map(|p| p.value.numel()).collect();
        if lengths != self.lengths {
            return Err(AetherError::ShapeMismatch {
                op,
                expected: self.lengths.clone(),
                actual: lengths,
            });
        }
        if !self.state[0].device().same_as(device) {
            return Err(AetherError::DeviceMismatch {
                op,
                a: self.state[0].device().name(),
                b: device.name(),
            });
        }
        Ok(())
    }

    pub fn total(&self) -> usize {
        *self.offsets.last().expect("offsets end with the total")
    }

    /// Each state buffer, unpacked per parameter (a read back on the GPU).
    pub fn unpack_state(&self) -> Result<Vec<Vec<Vec<f32>>>> {
        self.state[..self.buffers]
            .iter()
            .map(|block| {
                let all = block.to_vec_f32()?;
                Ok(self
                    .lengths
                    .iter()
                    .zip(&self.offsets)
                    .map(|(&len, &at)| all[at..at + len].to_vec())
                    .collect())
            })
            .collect()
    }

    /// The GPU step: packs what is not yet packed, then records the
    /// finiteness check, `rule`'s update and, for a model's loss scaler, the
    /// scaler's update.
    pub fn step_gpu(
        &mut self,
        ctx: &Arc<GpuContext>,
        params: &mut [Param],
        loss: Option<&Tensor>,
        scaler: Option<&LossScaler>,
        step: u32,
        rule: &Rule,
    ) -> Result<()> {
        let total = self.total();
        let byte_offset = |i: usize| self.offsets[i] as u64 * 4;
        if self.packed.is_none() {
            let shapes: Vec<Shape> = params.iter().map(|p| p.value.shape().clone()).collect();
            self.packed = Some(Tensor::gpu_views(ctx, &shapes, DType::F32)?);
            self.packed_grads = Some(Tensor::gpu_views(ctx, &shapes, DType::F32)?);
            if ctx.caps().shader_f16 {
                self.packed_f16 = Some(Tensor::gpu_views(ctx, &shapes, DType::F16)?);
            }
        }
        let (flat_params, views) = self.packed.as_ref().expect("packed above");
        // Each parameter should be its own view; one that is not (the first
        // step, or a tensor the model replaced) is copied into its segment and
        // replaced by the view.
        for (i, p) in params.iter_mut().enumerate() {
            if !p.value.is_view_at(flat_params, byte_offset(i)) {
                copy_into(ctx, p.value, flat_params, byte_offset(i));
                *p.value = views[i].clone();
            }
        }
        let (flat_grads, _) = self.packed_grads.as_ref().expect("packed above");
        for (i, p) in params.iter().enumerate() {
            if !p.grad.is_view_at(flat_grads, byte_offset(i)) {
                copy_into(ctx, p.grad, flat_grads, byte_offset(i));
            }
        }
        let table = segments_of(params, &self.offsets);
        let seg_tensor = match &self.segments {
            Some((uploaded, t)) if same_bytes(uploaded, &table) => t.clone(),
            _ => {
                let t = segment_tensor(ctx, &table)?;
                self.segments = Some((table, t.clone()));
                t
            }
        };
        let scaler = scaler.unwrap_or(&self.unit_scaler);
        let (grid, row_stride) = flat_grid(
            total,
            WORKGROUP,
            ctx.caps().limits.max_compute_workgroups_per_dimension,
        );
        // The check raises its flags before the update reads them: a dispatch
        // cannot wait for all of its own workgroups, so it is one of its own.
        let check = [
            total as u32,
            row_stride,
            params.len() as u32,
            step,
            u32::from(loss.is_some()),
            u32::from(scaler.updates()),
        ];
        ctx.dispatch(
            "optimizer_finite_check",
            &*pipeline(ctx, "optimizer_finite_check", "portable", || {
                FINITE_CHECK.into()
            })?,
            &[
                gpu_buf(flat_grads),
                gpu_buf(&seg_tensor),
                gpu_buf(loss.unwrap_or(flat_grads)),
                gpu_buf(&self.gate),
                gpu_buf(scaler.state()),
            ],
            bytemuck::cast_slice(&check),
            grid,
        )?;
        let mut uniform = rule.uniform.clone();
        uniform[..3].copy_from_slice(&[total as u32, row_stride, params.len() as u32]);
        // Should the mirror's kernel fail to compile (the cache has warned), the
        // step runs without it and the layers cast their weights themselves.
        let states = self.state.len();
        let mirror_kernel = self.packed_f16.as_ref().and_then(|_| {
            ctx.pipelines().get_or_create(
                &PipelineKey::new(rule.kernel, "f16_mirror"),
                "main",
                || {
                    [
                        "enable f16;\n",
                        F16_BITS,
                        SEGMENTS,
                        UPDATE_COMMON,
                        rule.source,
                        &entry_bindings(states, true),
                        STEP_F16,
                    ]
                    .concat()
                    .into()
                },
            )
        });
        if mirror_kernel.is_none() {
            self.packed_f16 = None;
        }
        let mut buffers = vec![
            gpu_buf(flat_grads),
            gpu_buf(flat_params),
            gpu_buf(&seg_tensor),
            gpu_buf(&self.gate),
            gpu_buf(scaler.state()),
        ];
        buffers.extend(self.state.iter().map(gpu_buf));
        let kernel = match (mirror_kernel, &self.packed_f16) {
            (Some(kernel), Some((mirror, _))) => {
                buffers.push(gpu_buf(mirror));
                kernel
            }
            _ => pipeline(ctx, rule.kernel, "portable", || {
                [
                    SEGMENTS,
                    UPDATE_COMMON,
                    rule.source,
                    &entry_bindings(states, false),
                    STEP,
                ]
                .concat()
            })?,
        };
        ctx.dispatch(
            rule.kernel,
            &kernel,
            &buffers,
            bytemuck::cast_slice(&uniform),
            grid,
        )?;
        // Without a model's scaler an overflow closed the gate in the check.
        if scaler.updates() {
            scaler.update_gpu(ctx, &self.gate, step)?;
        }
        Ok(())
    }

    /// The CPU step's gate: `Ok(Some(inv_scale))` where the update runs,
    /// `Ok(None)` where it is skipped (the gate closed before, the loss is
    /// not finite, or the gradients overflowed), moving the gate and the
    /// scaler as the GPU's kernels do.
    pub fn gate_cpu(
        &mut self,
        params: &[Param],
        loss: Option<&Tensor>,
        scaler: Option<&mut LossScaler>,
        step: u32,
    ) -> Result<Option<f32>> {
        let gate = self.gate.to_vec_u32()?[0];
        if gate != GATE_OPEN {
            return Ok(None);
        }
        let mut loss_finite = true;
        if let Some(loss) = loss {
            loss_finite = loss.to_vec_f32()?.iter().all(|v| v.is_finite());
        }
        let mut grads_finite = true;
        for p in params {
            grads_finite &= p
                .grad
                .host_f32()
                .is_some_and(|g| g.iter().all(|v| v.is_finite()));
        }
        let scaler = scaler.unwrap_or(&mut self.unit_scaler);
        let (scale, _) = scaler.scale()?;
        // A loss that is not finite closes the gate and leaves the scaler be,
        // as on the GPU (its update sees the gate closed).
        let close = !loss_finite || scaler.update_cpu(!grads_finite)?;
        if close {
            self.gate = Tensor::from_u32(vec![1], vec![step], &Device::Cpu)?;
        }
        Ok((loss_finite && grads_finite).then_some(1.0 / scale))
    }

    /// The packed parameters on the GPU, after the first step.
    pub fn flat_params(&self) -> Option<&Tensor> {
        self.packed.as_ref().map(|(flat, _)| flat)
    }

    /// The segment table on the GPU, after the first step.
    pub fn segment_tensor(&self) -> Option<&Tensor> {
        self.segments.as_ref().map(|(_, t)| t)
    }

    /// The gradient of the views handed out: where the model's layers write.
    pub fn grad_views(&self) -> Option<&[Tensor]> {
        self.packed_grads.as_ref().map(|(_, v)| v.as_slice())
    }

    /// The f16 mirror's views, where the step writes one.
    pub fn f16_views(&self) -> Option<&[Tensor]> {
        self.packed_f16.as_ref().map(|(_, v)| v.as_slice())
    }
}

fn same_bytes(a: &[Segment], b: &[Segment]) -> bool {
    bytemuck::cast_slice::<Segment, u8>(a) == bytemuck::cast_slice::<Segment, u8>(b)
}

/// The segment table of `params` starting at `starts`.
pub(crate) fn segments_of(params: &[Param], starts: &[usize]) -> Vec<Segment> {
    params
        .iter()
        .zip(starts)
        .map(|(p, &start)| Segment {
            start: start as u32,
            end: (start + p.value.numel()) as u32,
            l1: p.l1,
            l2: p.l2,
            decay: p.decay_scale,
            lr: p.lr_scale,
        })
        .collect()
}

pub(crate) fn pipeline(
    ctx: &GpuContext,
    kernel: &'static str,
    variant: &'static str,
    source: impl FnOnce() -> String,
) -> Result<Arc<wgpu::ComputePipeline>> {
    ctx.pipelines()
        .require(&PipelineKey::new(kernel, variant), "main", || {
            source().into()
        })
}

pub(crate) fn gpu_buf(t: &Tensor) -> GpuSlice<'_> {
    t.gpu_slice().expect("checked to be on the GPU")
}

/// Records a copy of f32 tensor `t` into `flat` at byte `offset`.
pub(crate) fn copy_into(ctx: &GpuContext, t: &Tensor, flat: &Tensor, offset: u64) {
    let (src, dst) = (gpu_buf(t), gpu_buf(flat));
    ctx.copy_buffer_region(
        src.buffer,
        src.offset,
        dst.buffer,
        offset,
        t.numel() as u64 * 4,
    );
}

/// The segment table as a GPU tensor (u32 words: Segment is six 4-byte fields).
pub(crate) fn segment_tensor(ctx: &Arc<GpuContext>, segs: &[Segment]) -> Result<Tensor> {
    let words: Vec<u32> = bytemuck::cast_slice(segs).to_vec();
    Tensor::from_u32(vec![words.len()], words, &Device::Gpu(Arc::clone(ctx)))
}

/// WGSL's `sign`: 0 at 0 (Rust's `signum` gives 1).
pub(crate) fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// The update kernel's last bindings, after update_common.wgsl's five and
/// the rule's `states` state buffers: the f16 mirror where `mirror`, then
/// the uniform (step.wgsl and step_f16.wgsl use them).
fn entry_bindings(states: usize, mirror: bool) -> String {
    let first = 5 + states;
    if mirror {
        format!(
            "@group(0) @binding({first}) var<storage, read_write> params_f16: array<f16>;\n\
             @group(0) @binding({}) var<uniform> step: Params;\n",
            first + 1
        )
    } else {
        format!("@group(0) @binding({first}) var<uniform> step: Params;\n")
    }
}

/// [`true_grad`] of update_common.wgsl on the CPU.
pub(crate) fn true_grad(g: f32, inv_scale: f32, p: &Param, w: f32) -> f32 {
    g * inv_scale + p.l1 * sign(w) + 2.0 * p.l2 * w
}
