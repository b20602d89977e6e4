//! BatchNorm over the channel axis, with running statistics for inference.
//! Its parameters are excluded from weight decay.

use super::{InputGrad, Layer, LayerSpec, Mode, Param, cached, state_size};
use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::ops::DxStorage;
use crate::ops::activation::Activation;
use crate::ops::batchnorm::{
    BatchNormStats, FusedGrad, NormOutput, RunningStats, backward_into, batch_norm_inference_as,
    batch_norm_train_running, check_epsilon, check_momentum, flags_dx_saturation,
    gated_running_stats,
};
use crate::tensor::{DType, Tensor};

/// Batch normalisation over the last (channel) dimension, with a learned
/// scale and shift; inference uses the running statistics.
pub struct BatchNorm {
    /// Running statistics: `running = momentum * running + (1 - momentum) * batch`
    /// (PyTorch's `momentum` is one minus this).
    pub momentum: f32,
    pub epsilon: f32,
    /// Whether the scale `gamma` is a parameter. Without (airbench's frozen
    /// weight), it stays 1 and is neither trained nor saved.
    pub scale: bool,
    state: Option<NormState>,
    /// Channels (the input's last axis), from `build`.
    channels: usize,
    /// The activation after this layer that runs inside it (see
    /// `Layer::fuse_activation`).
    activation: Option<Activation>,
    /// The output's dtype: F16 where the next layer rounds its input to f16
    /// (see `Layer::output_rounded_to_f16`).
    output: DType,
    /// How the backward returns dx: f16 where the layer before rounds it.
    input_grad: InputGrad,
    /// Input and batch statistics (a fused activation's backward recomputes
    /// its input from them, gamma and beta).
    cache: Option<(Tensor, BatchNormStats)>,
    grads: Option<(Tensor, Tensor)>,
    /// The running statistics the last training forward proposed, kept at
    /// `commit_step` only where the step was finite.
    staged: Option<(Tensor, Tensor)>,
    /// Where the backward writes `(dgamma, dbeta)` (see `Layer::set_grad_outputs`).
    grad_outputs: Option<(Tensor, Tensor)>,
}

struct NormState {
    gamma: Tensor,
    beta: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
}

impl BatchNorm {
    /// Running statistics updated as `momentum * running + (1 - momentum) *
    /// batch` (PyTorch's default momentum 0.1 is 0.9 here), and `epsilon`
    /// added to the variance (PyTorch: 1e-5); both checked at `finalize`.
    pub fn new(momentum: f32, epsilon: f32) -> Self {
        Self {
            momentum,
            epsilon,
            scale: true,
            state: None,
            channels: 0,
            activation: None,
            output: DType::F32,
            input_grad: InputGrad::default(),
            cache: None,
            grads: None,
            staged: None,
            grad_outputs: None,
        }
    }

    /// With `false`, no trainable scale: `gamma` stays 1 (PyTorch's
    /// `weight.requires_grad = False` at its initial value, as airbench).
    pub fn scale(mut self, scale: bool) -> Self {
        self.scale = scale;
        self
    }

    fn state(&self) -> Result<&NormState> {
        self.state
            .as_ref()
            .ok_or_else(|| AetherError::InvalidShape {
                op: "BatchNorm",
                shape: vec![],
                reason: "layer used before the model was finalized".into(),
            })
    }

    /// F16 for a tensor its neighbour rounds to f16 anyway, where the GPU
    /// kernels can pack it (4 channels at a time); else F32.
    fn storage_for(&self, rounded: bool) -> DType {
        if rounded && self.channels.is_multiple_of(4) {
            DType::F16
        } else {
            DType::F32
        }
    }
}

impl Default for BatchNorm {
    /// Aether-ML's defaults: momentum 0.99, epsilon 1e-3.
    fn default() -> Self {
        Self::new(0.99, 1e-3)
    }
}

/// The channels of a per-sample `input`: its last axis.
fn channels(input: &[usize]) -> Result<usize> {
    input
        .last()
        .copied()
        .ok_or_else(|| AetherError::InvalidShape {
            op: "BatchNorm",
            shape: input.to_vec(),
            reason: "needs at least one feature axis".into(),
        })
}

impl Layer for BatchNorm {
    fn spec(&self) -> LayerSpec {
        LayerSpec::BatchNorm {
            momentum: self.momentum,
            epsilon: self.epsilon,
            scale: self.scale,
        }
    }

    fn build(&mut self, input: &[usize], _seed: u64, device: &Device) -> Result<Vec<usize>> {
        check_momentum(self.momentum)?;
        check_epsilon(self.epsilon)?;
        let c = channels(input)?;
        // A fused activation and an f16 output are the model's decisions, made
        // again after every build.
        self.activation = None;
        self.output = DType::F32;
        self.input_grad = InputGrad::default();
        self.channels = c;
        let filled = |v: f32| Tensor::from_f32(vec![c], vec![v; c], device);
        self.state = Some(NormState {
            gamma: filled(1.0)?,
            beta: filled(0.0)?,
            running_mean: filled(0.0)?,
            running_var: filled(1.0)?,
        });
        Ok(input.to_vec())
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let eps = self.epsilon;
        let out = NormOutput {
            activation: self.activation,
            dtype: self.output,
        };
        if let Mode::Infer = mode {
            let s = self.state()?;
            let (mean, var) = (&s.running_mean, &s.running_var);
            return batch_norm_inference_as(x, &s.gamma, &s.beta, mean, var, eps, out);
        }
        let s = self.state()?;
        let running = RunningStats {
            mean: &s.running_mean,
            var: &s.running_var,
            momentum: self.momentum,
        };
        let (y, stats, (mean, var)) =
            batch_norm_train_running(x, &s.gamma, &s.beta, eps, out, running)?;
        self.staged = Some((mean, var));
        self.cache = Some((x.clone(), stats));
        Ok(y)
    }

    fn set_grad_outputs(&mut self, outputs: Vec<Tensor>) {
        self.grad_outputs = match <[Tensor; 2]>::try_from(outputs) {
            Ok([dgamma, dbeta]) => Some((dgamma, dbeta)),
            // Without a trainable scale the kernels still write its gradient:
            // into a buffer of the layer's own, made once.
            Err(outputs) => match outputs.as_slice() {
                [dbeta] if !self.scale => {
                    let dgamma = match self.grad_outputs.take() {
                        Some((dgamma, _)) if dgamma.device().same_as(&dbeta.device()) => {
                            Some(dgamma)
                        }
                        _ => Tensor::from_f32(
                            vec![self.channels],
                            vec![0.0; self.channels],
                            &dbeta.device(),
                        )
                        .ok(),
                    };
                    dgamma.map(|dgamma| (dgamma, dbeta.clone()))
                }
                _ => None,
            },
        };
    }

    fn end_step(&mut self) {
        (self.cache, self.grads, self.staged) = (None, None, None);
        self.input_grad.end_step();
    }

    fn commit_step(&mut self, gate: Option<&Tensor>) -> Result<()> {
        let Some(new) = self.staged.take() else {
            return Ok(());
        };
        let s = self.state.as_mut().expect("a training forward ran");
        let kept = match gate {
            Some(gate) => gated_running_stats((&s.running_mean, &s.running_var), new, gate)?,
            None => new,
        };
        (s.running_mean, s.running_var) = kept;
        Ok(())
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let (dtype, flag) = self.input_grad.take();
        let Some((x, stats)) = self.cache.as_ref() else {
            return cached(&None, "BatchNorm::backward").map(|_| None);
        };
        let state = self.state()?;
        let fused = self.activation.map(|activation| FusedGrad {
            activation,
            beta: &state.beta,
        });
        let outputs = self.grad_outputs.as_ref();
        let dx_out = DxStorage {
            dtype,
            saturation_flag: flag.as_ref(),
        };
        let (dx, dgamma, dbeta) =
            backward_into(dy, x, &state.gamma, stats, fused, outputs, dx_out)?;
        self.grads = Some((dgamma, dbeta));
        Ok(need_dx.then_some(dx))
    }

    /// ReLU, leaky ReLU, GELU and SiLU: the normalize pass applies them, and
    /// the backward's two passes take their gradient at the normalized
    /// value, recomputed from the input it keeps anyway.
    fn fuse_activation(&mut self, activation: Activation) -> bool {
        self.activation = Some(activation);
        true
    }

    fn output_rounded_to_f16(&mut self, rounded: bool) -> bool {
        self.output = self.storage_for(rounded);
        self.output == DType::F16
    }

    /// Clipped to +-65504 before it is rounded, as the conv's own cast does.
    fn input_grad_rounded_to_f16(&mut self, rounded: bool) -> bool {
        let f16 = self.storage_for(rounded) == DType::F16;
        self.input_grad.set_f16(f16)
    }

    /// Where dx's kernel can bind the scaler too (see `flags_dx_saturation`).
    fn flag_input_grad_saturation(&mut self, scaler: &Tensor) -> bool {
        self.input_grad.flag(scaler, flags_dx_saturation)
    }

    fn trainables(&mut self) -> Vec<Param<'_>> {
        let (Some(s), Some((dg, db))) = (self.state.as_mut(), self.grads.as_ref()) else {
            return Vec::new();
        };
        let beta = Param::new("beta", &mut s.beta, db).no_decay();
        if !self.scale {
            return vec![beta];
        }
        let gamma = Param::new("gamma", &mut s.gamma, dg).no_decay();
        vec![gamma, beta]
    }

    /// gamma (with a scale), beta and the two running statistics a channel.
    fn state_values(&self, input: &[usize]) -> Result<usize> {
        let per_channel = 3 + usize::from(self.scale);
        state_size(
            "BatchNorm",
            input,
            channels(input)?.checked_mul(per_channel),
        )
    }

    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        match &self.state {
            Some(s) => {
                let gamma = self.scale.then_some(("gamma", &s.gamma));
                gamma
                    .into_iter()
                    .chain([
                        ("beta", &s.beta),
                        ("running_mean", &s.running_mean),
                        ("running_var", &s.running_var),
                    ])
                    .collect()
            }
            None => Vec::new(),
        }
    }

    fn set_state(&mut self, name: &str, tensor: Tensor) -> Result<()> {
        let s = self
            .state
            .as_mut()
            .ok_or_else(|| AetherError::InvalidShape {
                op: "BatchNorm::set_state",
                shape: vec![],
                reason: "layer not built".into(),
            })?;
        let slot = match name {
            "gamma" if self.scale => &mut s.gamma,
            "beta" => {
                // An unsaved scale of ones follows beta to its device.
                if !self.scale && !s.gamma.device().same_as(&tensor.device()) {
                    s.gamma = s.gamma.to(&tensor.device())?;
                }
                &mut s.beta
            }
            "running_mean" => &mut s.running_mean,
            "running_var" => &mut s.running_var,
            _ => {
                return Err(AetherError::InvalidShape {
                    op: "BatchNorm::set_state",
                    shape: tensor.dims().to_vec(),
                    reason: format!("no tensor named {name:?}"),
                });
            }
        };
        *slot = tensor;
        Ok(())
    }
}
