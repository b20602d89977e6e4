//! Adam (Kingma & Ba) with optional decoupled weight decay (AdamW), one fused
//! update over all parameters (shaders/optim/adam_update.wgsl).

use super::packed::{Rule, true_grad};
use super::{Core, OptimizerState, Param, scale::LossScaler};
use crate::device::Device;
use crate::error::{Result, check_hyperparameter};
use crate::tensor::Tensor;

const ADAM_UPDATE: &str = include_str!("../../shaders/optim/adam_update.wgsl");
/// The names of Adam's state buffers in [`OptimizerState`] and model files.
pub(super) const BUFFERS: [&str; 2] = ["m", "v"];

/// Adam (Kingma & Ba) with optional decoupled weight decay (AdamW).
///
/// A step whose loss or gradients are not finite changes nothing (see the
/// module docs of [`crate::optim`]).
pub struct Adam {
    pub learning_rate: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub epsilon: f32,
    /// Decoupled weight decay per step, `p -= lr * weight_decay * p` (0 for Adam).
    pub weight_decay: f32,
    pub(crate) core: Core,
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
            core: Core::default(),
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

    /// The step count and moments (`m`, `v`), for a checkpoint; `None`
    /// before the first step (nothing to carry). On the GPU this reads the
    /// moments back.
    pub fn state(&self) -> Result<Option<OptimizerState>> {
        self.core.state(&BUFFERS)
    }

    /// Continues from `state` (see [`Adam::state`]) instead of a first step:
    /// the next step takes the parameters with these moments and step count,
    /// exactly as the optimizer that saved them would have. The next step
    /// refuses it where the parameters' sizes differ. Every moment must be
    /// finite, and every second moment at least 0.
    pub fn set_state(&mut self, state: OptimizerState) -> Result<()> {
        self.core
            .set_state("Adam::set_state", &BUFFERS, state, |name, x| {
                x.is_finite() && (name != "v" || x >= 0.0)
            })
    }

    /// Steps taken so far (skipped ones included, until [`Adam::reopen`]).
    pub fn steps(&self) -> u32 {
        self.core.steps
    }

    /// The first step (counting from 1, as [`Adam::steps`]) whose loss or
    /// gradients were not finite, so that it and every step after it changed
    /// nothing; `None` where all were finite. On the GPU this reads the gate
    /// back (a wait for the steps recorded so far).
    pub fn skipped_step(&self) -> Result<Option<u32>> {
        self.core.skipped_step()
    }

    /// Forgets the steps from the first skipped one on (the step count goes
    /// back to the last finite step) and opens the gate, so training can go
    /// on from the parameters as they are. Returns how many steps it took
    /// back (0 where none was skipped).
    pub fn reopen(&mut self) -> Result<u32> {
        self.core.reopen()
    }

    /// The gate of the last step: `[1]` U32, `u32::MAX` (open) while every
    /// step was finite. A layer whose state moves in the forward pass
    /// (BatchNorm's running statistics) keeps the new state only where it is
    /// open.
    pub fn gate(&self) -> Option<&Tensor> {
        self.core.gate()
    }

    /// On the GPU, after the first step: where the parameters' gradients
    /// should be written for the next steps, in the order the step took the
    /// parameters (views of the packed gradient buffer, which the step then
    /// reads without a copy).
    pub fn grad_outputs(&self) -> Option<&[Tensor]> {
        self.core.packed.as_ref()?.grad_views()
    }

    /// On a GPU with f16, after a step: each parameter as the step left it,
    /// rounded to f16, in the order the step took the parameters (views of the
    /// packed mirror the step writes). Valid until a parameter is replaced.
    pub fn param_shadows(&self) -> Option<&[Tensor]> {
        self.core.packed.as_ref()?.f16_views()
    }

    /// Updates every parameter from its gradient; all must be f32 on one
    /// device. A gradient that is not finite skips the step (see [`Adam`]).
    pub fn step(&mut self, params: &mut [Param]) -> Result<()> {
        self.step_scaled(params, None, None)
    }

    /// [`Adam::step`], skipped also where `loss` (a `[1]` F32 tensor on the
    /// parameters' device) is not finite.
    pub fn step_with_loss(&mut self, params: &mut [Param], loss: Option<&Tensor>) -> Result<()> {
        self.step_scaled(params, loss, None)
    }

    /// [`Adam::step_with_loss`] on gradients of a loss scaled by `scaler`'s
    /// scale, divided out before the moments (see [`LossScaler`]).
    pub fn step_scaled(
        &mut self,
        params: &mut [Param],
        loss: Option<&Tensor>,
        scaler: Option<&mut LossScaler>,
    ) -> Result<()> {
        self.validate()?;
        let Some(device) = self.core.begin("Adam::step", params, loss, 2)? else {
            return Ok(());
        };
        let t = self.core.steps;
        let lr_t = self.learning_rate * (1.0 - self.beta2.powi(t as i32)).sqrt()
            / (1.0 - self.beta1.powi(t as i32));
        let decay_lr = self.learning_rate * self.weight_decay;
        let packed = self.core.packed();
        match &device {
            Device::Gpu(ctx) => {
                let rule = Rule {
                    kernel: "adam",
                    source: ADAM_UPDATE,
                    uniform: vec![
                        0,
                        0,
                        0,
                        lr_t.to_bits(),
                        self.beta1.to_bits(),
                        self.beta2.to_bits(),
                        self.epsilon.to_bits(),
                        decay_lr.to_bits(),
                    ],
                };
                packed.step_gpu(ctx, params, loss, scaler.as_deref(), t, &rule)
            }
            Device::Cpu => {
                let Some(inv_scale) = packed.gate_cpu(params, loss, scaler, t)? else {
                    return Ok(());
                };
                let (b1, b2, eps) = (self.beta1, self.beta2, self.epsilon);
                let mut m = packed.state[0].to_vec_f32()?;
                let mut v = packed.state[1].to_vec_f32()?;
                for (p, &offset) in params.iter_mut().zip(&packed.offsets) {
                    let grad = p.grad.to_vec_f32()?;
                    let mut value = p.value.to_vec_f32()?;
                    for (j, (w, &g)) in value.iter_mut().zip(&grad).enumerate() {
                        let i = offset + j;
                        let g = true_grad(g, inv_scale, p, *w);
                        m[i] = b1 * m[i] + (1.0 - b1) * g;
                        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                        *w -= decay_lr * p.lr_scale * p.decay_scale * *w;
                        *w -= lr_t * p.lr_scale * m[i] / (v[i].sqrt() + eps);
                    }
                    *p.value = Tensor::from_f32(p.value.dims().to_vec(), value, &Device::Cpu)?;
                }
                for (block, values) in packed.state.iter_mut().zip([m, v]) {
                    *block = Tensor::from_f32(vec![values.len()], values, &Device::Cpu)?;
                }
                Ok(())
            }
        }
    }
}
