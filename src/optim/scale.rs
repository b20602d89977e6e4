//! Loss scaling: the loss gradient multiplied by a power of two `S` before the
//! backward pass and divided out again in the optimizer's update.
//!
//! Why: on a GPU whose convs take f16 operands, each conv and dense layer
//! rounds its output gradient to f16. With a batch-mean loss those gradients
//! are tiny, mostly below f16's normal range, and many round to 0 (measured in
//! docs/lab/parity-v1.md: it cost v1 about 1.6 points of test accuracy).
//! Scaling lifts them into f16's range. `S` is a power of two and every
//! backward op is linear in its output gradient, so in f32 the scaled
//! gradients are exactly `S` times the unscaled ones and the update divides
//! them back exactly: on the CPU path a scaled run is bit-identical to an
//! unscaled one (short of an f32 overflow or gradients in f32's subnormal
//! range).
//!
//! A dynamic scale follows PyTorch's GradScaler: it starts at 2^16, halves
//! on a step that overflows (which is skipped) and doubles after 2000 steps in
//! a row that did not. The scale lives on the device ([`LossScaler::state`]),
//! where the loss kernel reads it and a one-invocation kernel after the
//! update moves it, so no step waits for the host.
//!
//! Overflow: every f32 -> f16 conversion of aether saturates at +-65504, so a
//! scaled output gradient past f16's range does not become inf, and the
//! backward would carry on with finite, wrong values. The model therefore
//! checks each output gradient that a layer will round to f16
//! ([`crate::nn::Layer::rounds_output_grad_to_f16`]) for values at 65504 or
//! beyond, as the f16 rounding sees them, and raises the scaler's overflow
//! flag; non-finite parameter gradients raise it too. A flagged step is
//! skipped as PyTorch skips it. A step that overflows at a static scale, or at
//! a dynamic scale already down to 1, closes the optimizer's gate instead, as
//! a non-finite gradient always did: training stops with
//! [`crate::AetherError::NonFiniteStep`].

use std::sync::Arc;

use crate::device::Device;
use crate::error::{Result, check_hyperparameter};
use crate::gpu::{GpuContext, PipelineKey, flat_grid};
use crate::tensor::{DType, Tensor};

const UPDATE: &str = include_str!("../../shaders/optim/loss_scale_update.wgsl");
const SATURATION: &str = include_str!("../../shaders/optim/saturation_check.wgsl");
/// `WORDS_PER_INVOCATION` of saturation_check.wgsl.
const SATURATION_WORDS_PER_INVOCATION: usize = 4;
/// The largest scale a dynamic scaler grows to: beyond it a batch-mean loss
/// gradient gains no f16 range, only overflow risk.
pub const MAX_LOSS_SCALE: f32 = 16_777_216.0; // 2^24

/// How a model scales its loss gradient (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LossScale {
    /// [`LossScale::dynamic`] where some layer rounds its output gradient to
    /// f16 (a GPU with f16 conv kernels), no scaling elsewhere (the CPU path's
    /// f32 gradients do not underflow).
    #[default]
    Auto,
    /// No scaling: `S = 1`.
    Off,
    /// A fixed power of two from 1 to 2^24. An overflow stops training.
    Static(f32),
    /// GradScaler's rule: start at `init` (a power of two from 1 to 2^24),
    /// halve on an overflowing step (skipped), double after
    /// `growth_interval` steps in a row without one, up to 2^24.
    Dynamic { init: f32, growth_interval: u32 },
}

impl LossScale {
    /// PyTorch's GradScaler defaults: 2^16, doubled every 2000 good steps.
    pub fn dynamic() -> Self {
        Self::Dynamic {
            init: 65536.0,
            growth_interval: 2000,
        }
    }

    /// `Ok` where the scale is a power of two in `[1, 2^24]` and the growth
    /// interval at least 1.
    pub fn validate(&self) -> Result<()> {
        let (init, interval) = match *self {
            Self::Auto | Self::Off => return Ok(()),
            Self::Static(s) => (s, 1),
            Self::Dynamic {
                init,
                growth_interval,
            } => (init, growth_interval),
        };
        let power_of_two = init.is_finite() && init > 0.0 && init.to_bits() & 0x007f_ffff == 0;
        check_hyperparameter(
            "loss scale",
            init,
            power_of_two && (1.0..=MAX_LOSS_SCALE).contains(&init),
            "a power of two in [1, 2^24]",
        )?;
        check_hyperparameter(
            "loss scale growth_interval",
            interval as f32,
            interval >= 1,
            ">= 1",
        )
    }

    /// The scale this setting resolves to on a model where `rounds_to_f16`
    /// says whether any layer rounds its output gradient to f16: `(initial
    /// scale, Some(growth interval))` for a dynamic one, `None` for no scaling.
    fn resolve(self, rounds_to_f16: bool) -> Option<(f32, Option<u32>)> {
        match self {
            Self::Auto if rounds_to_f16 => Self::dynamic().resolve(true),
            Self::Auto | Self::Off => None,
            Self::Static(s) => Some((s, None)),
            Self::Dynamic {
                init,
                growth_interval,
            } => Some((init, Some(growth_interval))),
        }
    }
}

/// The scale a model trains with, on the model's device: a `[4]` U32 tensor
/// `[scale as f32 bits, steps since the last overflow or growth, overflow
/// flag, 0]` that the loss kernel, the optimizer's check and update, and the
/// scaler's own update read and write.
pub struct LossScaler {
    state: Tensor,
    /// `None` for a static scale.
    growth_interval: Option<u32>,
    /// False for [`LossScaler::unit`], which nothing raises or moves.
    updates: bool,
}

impl LossScaler {
    /// The scaler `setting` gives (validated) on `device`, or `None` where it
    /// means no scaling; `rounds_to_f16` resolves [`LossScale::Auto`].
    pub fn new(setting: LossScale, rounds_to_f16: bool, device: &Device) -> Result<Option<Self>> {
        setting.validate()?;
        let Some((scale, growth_interval)) = setting.resolve(rounds_to_f16) else {
            return Ok(None);
        };
        Ok(Some(Self::with_state(scale, 0, growth_interval, device)?))
    }

    /// A scaler at `scale` with `good_steps` counted toward its next growth.
    pub(crate) fn with_state(
        scale: f32,
        good_steps: u32,
        growth_interval: Option<u32>,
        device: &Device,
    ) -> Result<Self> {
        let words = vec![scale.to_bits(), good_steps, 0, 0];
        Ok(Self {
            state: Tensor::from_u32(vec![4], words, device)?,
            growth_interval,
            updates: true,
        })
    }

    /// `S = 1` that never moves: what an optimizer stepping without a model's
    /// scaler uses, so one update kernel serves both.
    pub(crate) fn unit(device: &Device) -> Result<Self> {
        Ok(Self {
            updates: false,
            ..Self::with_state(1.0, 0, None, device)?
        })
    }

    /// Whether overflows go through the scaler's flag and update (a model's
    /// scaler) rather than closing the gate in the check (the unit one).
    pub(crate) fn updates(&self) -> bool {
        self.updates
    }

    /// The state tensor (see [`LossScaler`]).
    pub fn state(&self) -> &Tensor {
        &self.state
    }

    /// The scale now and the steps counted toward its next growth (a read
    /// back on the GPU).
    pub fn scale(&self) -> Result<(f32, u32)> {
        let words = self.state.to_vec_u32()?;
        Ok((f32::from_bits(words[0]), words[1]))
    }

    /// Steps without an overflow after which a dynamic scale doubles; `None`
    /// for a static one.
    pub fn growth_interval(&self) -> Option<u32> {
        self.growth_interval
    }

    /// Whether the scale moves (GradScaler's rule) or stays.
    pub fn is_dynamic(&self) -> bool {
        self.growth_interval.is_some()
    }

    /// On the GPU: records a check raising the overflow flag where `grad`
    /// (f32 or f16, bound for a layer that rounds it to f16) holds a value at
    /// f16's limit or beyond. Nothing on the CPU path, whose f32 gradients
    /// are not rounded.
    pub(crate) fn check_saturation(&self, grad: &Tensor) -> Result<()> {
        let Some(ctx) = self.state.gpu_context() else {
            return Ok(());
        };
        let half = grad.dtype() == DType::F16;
        let words = if half {
            grad.numel().div_ceil(2)
        } else {
            grad.numel()
        };
        let invocations = words.div_ceil(SATURATION_WORDS_PER_INVOCATION);
        let (grid, row_stride) = flat_grid(
            invocations,
            256,
            ctx.caps().limits.max_compute_workgroups_per_dimension,
        );
        let params = [
            grad.numel() as u32,
            row_stride,
            u32::from(half),
            invocations as u32,
        ];
        ctx.dispatch(
            "loss_scale_saturation",
            &*pipeline(ctx, "loss_scale_saturation", SATURATION)?,
            &[gpu_slice(grad), gpu_slice(&self.state)],
            bytemuck::cast_slice(&params),
            grid,
        )
    }

    /// Clears the overflow flag; whether it was raised (a read back on the
    /// GPU). For a pass that is no optimizer step ([`crate::Model::gradients`]).
    pub(crate) fn take_overflow(&mut self) -> Result<bool> {
        let (scale, good) = self.scale()?;
        let raised = self.state.to_vec_u32()?[2] != 0;
        if raised {
            self.reset(scale, good)?;
        }
        Ok(raised)
    }

    /// Halves a dynamic scale above 1 (restarting its growth count), as an
    /// overflowing step does; false where it cannot.
    pub(crate) fn back_off(&mut self) -> Result<bool> {
        let (scale, _) = self.scale()?;
        if self.growth_interval.is_none() || scale <= 1.0 {
            return Ok(false);
        }
        self.reset(scale * 0.5, 0)?;
        Ok(true)
    }

    /// The state rewritten as `scale` and `good` steps, the flag down.
    fn reset(&mut self, scale: f32, good: u32) -> Result<()> {
        let device = self.state.device();
        self.state = Self::with_state(scale, good, self.growth_interval, &device)?.state;
        Ok(())
    }

    /// The host side of a step on the CPU path: `overflow` says whether the
    /// step's gradients were not finite. Returns whether the gate must close
    /// (an overflow no smaller scale can help).
    pub(crate) fn update_cpu(&mut self, overflow: bool) -> Result<bool> {
        let (mut scale, mut good) = self.scale()?;
        let mut close = false;
        match self.growth_interval {
            Some(_) if overflow && scale > 1.0 => {
                scale *= 0.5;
                good = 0;
            }
            _ if overflow => {
                close = true;
                good = 0;
            }
            Some(interval) => {
                good += 1;
                if good >= interval {
                    scale = (scale * 2.0).min(MAX_LOSS_SCALE);
                    good = 0;
                }
            }
            None => {}
        }
        self.reset(scale, good)?;
        Ok(close)
    }

    /// Records the scaler's step after the optimizer's update of step `step`
    /// (see loss_scale_update.wgsl), closing `gate` where it must.
    pub(crate) fn update_gpu(&self, ctx: &Arc<GpuContext>, gate: &Tensor, step: u32) -> Result<()> {
        let (interval, dynamic) = match self.growth_interval {
            Some(i) => (i, 1),
            None => (1, 0),
        };
        let params = [step, interval, dynamic, MAX_LOSS_SCALE.to_bits()];
        ctx.dispatch(
            "loss_scale_update",
            &*pipeline(ctx, "loss_scale_update", UPDATE)?,
            &[gpu_slice(&self.state), gpu_slice(gate)],
            bytemuck::cast_slice(&params),
            [1, 1, 1],
        )
    }
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

fn gpu_slice(t: &Tensor) -> crate::gpu::GpuSlice<'_> {
    t.gpu_slice().expect("checked to be on the GPU")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{DevicePreference, GpuOptions};

    /// The saturation check on every word of odd-length f32 and f16
    /// gradients (the last invocation's rounds ending mid-way, the last f16
    /// word holding one value): a value at the limit anywhere raises the
    /// flag, values just under it (65472 and 65488, which rounds to it) do
    /// not. Skipped without a GPU adapter.
    #[test]
    fn the_saturation_check_sees_every_position_of_odd_lengths() {
        let Ok(device) = Device::with_preference(DevicePreference::Gpu, &GpuOptions::default())
        else {
            eprintln!("[aether-test] SKIP: no GPU adapter");
            return;
        };
        let mut scaler = LossScaler::new(LossScale::Static(1.0), true, &device)
            .unwrap()
            .expect("a static scale");
        for len in [1, 7, 4 * 256 + 3, 2 * 4 * 257 + 5] {
            let safe: Vec<f32> = (0..len)
                .map(|i| if i % 2 == 0 { 65488.0 } else { -65472.0 })
                .collect();
            for dtype in [DType::F32, DType::F16] {
                let gradient = |values: &[f32]| match dtype {
                    DType::F16 => Tensor::from_f32_as_f16(vec![len], values, &device).unwrap(),
                    _ => Tensor::from_f32(vec![len], values.to_vec(), &device).unwrap(),
                };
                scaler.check_saturation(&gradient(&safe)).unwrap();
                assert!(
                    !scaler.take_overflow().unwrap(),
                    "{dtype:?} {len}: nothing at the limit"
                );
                let positions = [0, len / 2, len.saturating_sub(2), len - 1];
                for (at, bad) in positions
                    .into_iter()
                    .zip([65504.0, -1e6, f32::INFINITY, f32::NAN])
                {
                    let mut values = safe.clone();
                    values[at] = bad;
                    scaler.check_saturation(&gradient(&values)).unwrap();
                    assert!(
                        scaler.take_overflow().unwrap(),
                        "{dtype:?} {len}: {bad} at {at} not seen"
                    );
                }
            }
        }
    }
}
