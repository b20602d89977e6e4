//! SGD with momentum and Nesterov momentum as `torch.optim.SGD` takes it
//! (dampening 0, weight decay added to the gradient), one fused update over
//! all parameters (shaders/optim/sgd_update.wgsl).

use super::packed::{Rule, true_grad};
use super::{Core, OptimizerState, Param, scale::LossScaler};
use crate::device::Device;
use crate::error::{Result, check_hyperparameter};
use crate::tensor::Tensor;

const SGD_UPDATE: &str = include_str!("../../shaders/optim/sgd_update.wgsl");
/// The name of the momentum buffer in [`OptimizerState`] and model files.
const MOMENTUM: [&str; 1] = ["momentum"];

/// Stochastic gradient descent, PyTorch's rule:
///
/// ```text
/// g = grad + weight_decay * p        (L1/L2 penalties of the layer added too)
/// b = momentum * b + g               (b starts at 0, so the first b is g)
/// g = g + momentum * b  (nesterov)   or   g = b   (momentum > 0)
/// p = p - lr * g
/// ```
///
/// The weight decay is coupled (L2 through the gradient), as PyTorch's SGD
/// and airbench use it; BatchNorm's parameters are excluded unless a
/// parameter group says otherwise. A step whose loss or gradients are not
/// finite changes nothing (see [`crate::optim`]).
pub struct Sgd {
    pub learning_rate: f32,
    /// In [0, 1); 0 is plain SGD (no momentum buffer is kept).
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    pub(crate) core: Core,
}

impl Sgd {
    /// Plain SGD at `learning_rate`.
    pub fn new(learning_rate: f32) -> Self {
        Self {
            learning_rate,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            core: Core::default(),
        }
    }

    /// With heavy-ball momentum.
    pub fn momentum(mut self, momentum: f32) -> Self {
        self.momentum = momentum;
        self
    }

    /// With Nesterov momentum (needs a momentum above 0).
    pub fn nesterov(mut self, nesterov: bool) -> Self {
        self.nesterov = nesterov;
        self
    }

    /// With weight decay added to the gradient.
    pub fn weight_decay(mut self, weight_decay: f32) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// `Ok` where every hyperparameter is in its range: a finite learning
    /// rate and weight decay of at least 0, a momentum in [0, 1), and a
    /// momentum above 0 where Nesterov is asked for (PyTorch's rule).
    pub fn validate(&self) -> Result<()> {
        check_hyperparameter(
            "SGD learning_rate",
            self.learning_rate,
            self.learning_rate >= 0.0 && self.learning_rate.is_finite(),
            "finite and >= 0",
        )?;
        check_hyperparameter(
            "SGD momentum",
            self.momentum,
            (0.0..1.0).contains(&self.momentum),
            "in [0, 1)",
        )?;
        check_hyperparameter(
            "SGD momentum (with nesterov)",
            self.momentum,
            !self.nesterov || self.momentum > 0.0,
            "> 0 where nesterov is set",
        )?;
        check_hyperparameter(
            "SGD weight_decay",
            self.weight_decay,
            self.weight_decay >= 0.0 && self.weight_decay.is_finite(),
            "finite and >= 0",
        )
    }

    /// The state buffers this configuration keeps: the momentum buffer, or
    /// none for plain SGD.
    pub(super) fn buffers(&self) -> &'static [&'static str] {
        if self.momentum > 0.0 { &MOMENTUM } else { &[] }
    }

    /// The step count and momentum buffer, for a checkpoint; `None` before
    /// the first step. On the GPU this reads the buffer back.
    pub fn state(&self) -> Result<Option<OptimizerState>> {
        self.core.state(self.buffers())
    }

    /// Continues from `state` (see [`Sgd::state`]); every value must be finite.
    pub fn set_state(&mut self, state: OptimizerState) -> Result<()> {
        let buffers = self.buffers();
        self.core
            .set_state("Sgd::set_state", buffers, state, |_, x| x.is_finite())
    }

    /// Updates every parameter from its gradient divided by `scaler`'s scale
    /// (none: 1); skipped where `loss` (a `[1]` F32 tensor on the
    /// parameters' device) or a gradient is not finite.
    pub fn step_scaled(
        &mut self,
        params: &mut [Param],
        loss: Option<&Tensor>,
        scaler: Option<&mut LossScaler>,
    ) -> Result<()> {
        self.validate()?;
        let buffers = self.buffers().len();
        let Some(device) = self.core.begin("Sgd::step", params, loss, buffers)? else {
            return Ok(());
        };
        let step = self.core.steps;
        let (lr, momentum, wd) = (self.learning_rate, self.momentum, self.weight_decay);
        let packed = self.core.packed();
        match &device {
            Device::Gpu(ctx) => {
                let rule = Rule {
                    kernel: "sgd",
                    source: SGD_UPDATE,
                    uniform: vec![
                        0,
                        0,
                        0,
                        lr.to_bits(),
                        momentum.to_bits(),
                        wd.to_bits(),
                        u32::from(self.nesterov),
                    ],
                };
                packed.step_gpu(ctx, params, loss, scaler.as_deref(), step, &rule)
            }
            Device::Cpu => {
                let Some(inv_scale) = packed.gate_cpu(params, loss, scaler, step)? else {
                    return Ok(());
                };
                let mut b = packed.state[0].to_vec_f32()?;
                for (p, &offset) in params.iter_mut().zip(&packed.offsets) {
                    let grad = p.grad.to_vec_f32()?;
                    let mut value = p.value.to_vec_f32()?;
                    for (j, (w, &g)) in value.iter_mut().zip(&grad).enumerate() {
                        let mut g = true_grad(g, inv_scale, p, *w) + wd * p.decay_scale * *w;
                        if momentum != 0.0 {
                            let i = offset + j;
                            b[i] = momentum * b[i] + g;
                            g = if self.nesterov {
                                g + momentum * b[i]
                            } else {
                                b[i]
                            };
                        }
                        *w -= lr * p.lr_scale * g;
                    }
                    *p.value = Tensor::from_f32(p.value.dims().to_vec(), value, &Device::Cpu)?;
                }
                if momentum != 0.0 {
                    let len = b.len();
                    packed.state[0] = Tensor::from_f32(vec![len], b, &Device::Cpu)?;
                }
                Ok(())
            }
        }
    }
}
