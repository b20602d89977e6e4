//! Optimizers that update every parameter of a model with one fused kernel
//! (Adam / AdamW and SGD with momentum or Nesterov), loss scaling, and the
//! regularization loss of all parameters in one GPU reduction.
//!
//! Every optimizer packs the parameters into one buffer on its first step and
//! updates them all in one dispatch from then on (see `packed.rs`). Each
//! parameter carries its own L1/L2 coefficients and its multipliers of the
//! learning rate and of the weight decay (BatchNorm's parameters are
//! excluded from weight decay by default), held in the packed step's segment
//! table, so per-parameter settings cost no extra dispatch.
//!
//! A step whose loss or gradients are not finite (Inf or NaN) changes
//! nothing, as PyTorch's GradScaler skips such a step: on the GPU a check
//! recorded before the fused update (in the same submission, read by no host)
//! raises a flag the update reads. Under a dynamic loss scale
//! ([`LossScale`]) a step whose gradients overflowed is skipped and the scale
//! halved; otherwise a gate closes and stays closed, so every later step
//! changes nothing either, until [`Optimizer::reopen`] after the host has read
//! [`Optimizer::skipped_step`]: the parameters and the optimizer's state stay
//! those from before the first bad step.
//!
//! airbench's recipe, as a model sets it up (each piece is optional):
//!
//! ```
//! use aether::nn::{BatchNorm, Conv2d, Dense, GlobalAvgPool, ReLU};
//! use aether::optim::{Lookahead, LossScale, ParamGroup, PiecewiseLinear, Sgd};
//! use aether::{Device, Loss, Metric, Model, Padding};
//!
//! let mut model = Model::new().seed(1);
//! model.add(Conv2d::new(8, (2, 2), Padding::Valid)); // say, a whitening conv
//! model.add(Conv2d::new(16, (3, 3), Padding::Same).bias(false));
//! model.add(BatchNorm::new(0.9, 1e-5));
//! model.add(ReLU::default());
//! model.add(GlobalAvgPool::default());
//! model.add(Dense::new(10));
//! let sgd = Sgd::new(0.2).momentum(0.85).nesterov(true).weight_decay(5e-4);
//! let loss = Loss::SoftmaxCrossEntropy { label_smoothing: 0.2 };
//! model.configure(loss, sgd, Metric::CategoricalAccuracy);
//! let bn_biases = ParamGroup::kind("BatchNorm", Some("beta")).lr_scale(64.0).decay_scale(1.0 / 64.0);
//! model.set_param_groups(vec![bn_biases])?;
//! model.set_schedule(Some(Box::new(PiecewiseLinear::triangle(0.2, 1000, 0.2, 0.23, 0.07))));
//! model.set_lookahead(Some(Lookahead { every: 5, decay: 0.77 }))?;
//! model.set_loss_scale(LossScale::Auto)?; // the default: dynamic on an f16 GPU
//! model.set_trainable(0, false)?; // the whitening conv stays as initialised
//! model.to(&Device::Cpu)?;
//! model.finalize(&[8, 8, 3])?;
//! let (x, y) = aether::data::synthetic_images(16, 8, 8, 1)?;
//! model.train_batch(&x, &y)?;
//! # Ok::<(), aether::AetherError>(())
//! ```

mod adam;
mod by_layer;
mod ema;
mod groups;
mod packed;
mod regularization;
mod scale;
mod schedule;
mod sgd;

pub use adam::Adam;
pub(crate) use by_layer::StateByLayer;
pub use ema::Lookahead;
pub use groups::{ParamGroup, Select};
pub use regularization::regularization_loss;
pub use scale::{LossScale, LossScaler, MAX_LOSS_SCALE};
pub use schedule::{Constant, Decay, PiecewiseLinear, Schedule, WarmupDecay};
pub use sgd::Sgd;

use packed::{GATE_OPEN, Packed, check_params};

use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::tensor::Tensor;

/// One trainable tensor and its gradient, as a layer hands it to the
/// optimizer ([`crate::nn::Layer::trainables`]).
pub struct Param<'a> {
    /// The state entry it is ([`crate::nn::Layer::state`]): "kernel", "bias",
    /// "gamma", "beta".
    pub name: &'static str,
    /// Replaced by the updated tensor after a step (on the GPU: a view of the
    /// packed parameters, updated in place by later steps).
    pub value: &'a mut Tensor,
    pub grad: &'a Tensor,
    /// Coefficients of the layer's L1 and L2 penalties on this tensor.
    pub l1: f32,
    pub l2: f32,
    /// Multiplier of the optimizer's weight decay: 1 by default, 0 where no
    /// decay applies (BatchNorm's parameters).
    pub decay_scale: f32,
    /// Multiplier of the optimizer's learning rate (1 by default).
    pub lr_scale: f32,
}

impl<'a> Param<'a> {
    /// A parameter without penalties, decayed, at the optimizer's learning rate.
    pub fn new(name: &'static str, value: &'a mut Tensor, grad: &'a Tensor) -> Self {
        Self {
            name,
            value,
            grad,
            l1: 0.0,
            l2: 0.0,
            decay_scale: 1.0,
            lr_scale: 1.0,
        }
    }

    /// With the layer's L1 and L2 coefficients.
    pub fn penalties(mut self, l1: f32, l2: f32) -> Self {
        self.l1 = l1;
        self.l2 = l2;
        self
    }

    /// Excluded from weight decay (BatchNorm's parameters).
    pub fn no_decay(mut self) -> Self {
        self.decay_scale = 0.0;
        self
    }
}

/// What an optimizer carries from step to step, as a checkpoint saves it:
/// the step count and each per-element state buffer by name (Adam: `m` and
/// `v`; SGD with momentum: `momentum`), one vector per parameter in the order
/// the steps take the parameters (an empty one: that parameter starts afresh).
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerState {
    pub steps: u32,
    pub buffers: Vec<(String, Vec<Vec<f32>>)>,
}

/// The optimizer a [`crate::Model`] trains with. `Model::configure` takes
/// anything that converts into it ([`Adam`], [`Sgd`]).
pub enum Optimizer {
    Adam(Adam),
    Sgd(Sgd),
}

impl From<Adam> for Optimizer {
    fn from(adam: Adam) -> Self {
        Self::Adam(adam)
    }
}

impl From<Sgd> for Optimizer {
    fn from(sgd: Sgd) -> Self {
        Self::Sgd(sgd)
    }
}

/// Calls `$body` with `$o` bound to whichever optimizer `$self` holds.
macro_rules! each {
    ($self:expr, $o:ident => $body:expr) => {
        match $self {
            Optimizer::Adam($o) => $body,
            Optimizer::Sgd($o) => $body,
        }
    };
}

impl Optimizer {
    /// `Ok` where every hyperparameter is in its range (see each optimizer's
    /// `validate`).
    pub fn validate(&self) -> Result<()> {
        each!(self, o => o.validate())
    }

    /// The base learning rate.
    pub fn learning_rate(&self) -> f32 {
        each!(self, o => o.learning_rate)
    }

    /// Sets the base learning rate (a schedule's step).
    pub fn set_learning_rate(&mut self, lr: f32) {
        each!(self, o => o.learning_rate = lr)
    }

    /// Updates every parameter from its gradient divided by `scaler`'s scale
    /// (none: 1); skipped where `loss` or a gradient is not finite.
    pub fn step_scaled(
        &mut self,
        params: &mut [Param],
        loss: Option<&Tensor>,
        scaler: Option<&mut LossScaler>,
    ) -> Result<()> {
        each!(self, o => o.step_scaled(params, loss, scaler))
    }

    pub(crate) fn core(&self) -> &Core {
        each!(self, o => &o.core)
    }

    fn core_mut(&mut self) -> &mut Core {
        each!(self, o => &mut o.core)
    }

    /// The step count and state, for a checkpoint (see [`Adam::state`]).
    pub fn state(&self) -> Result<Option<OptimizerState>> {
        each!(self, o => o.state())
    }

    /// Continues from a checkpoint's state (see [`Adam::set_state`]).
    pub fn set_state(&mut self, state: OptimizerState) -> Result<()> {
        each!(self, o => o.set_state(state))
    }

    /// The names of the state buffers [`Optimizer::state`] holds, in order.
    pub fn buffer_names(&self) -> &'static [&'static str] {
        match self {
            Self::Adam(_) => adam::BUFFERS.as_slice(),
            Self::Sgd(s) => s.buffers(),
        }
    }

    /// Steps taken so far (skipped ones included, until [`Optimizer::reopen`]).
    pub fn steps(&self) -> u32 {
        self.core().steps
    }

    /// See [`Adam::skipped_step`].
    pub fn skipped_step(&self) -> Result<Option<u32>> {
        self.core().skipped_step()
    }

    /// See [`Adam::reopen`].
    pub fn reopen(&mut self) -> Result<u32> {
        self.core_mut().reopen()
    }

    /// See [`Adam::gate`].
    pub fn gate(&self) -> Option<&Tensor> {
        self.core().gate()
    }

    /// See [`Adam::grad_outputs`].
    pub fn grad_outputs(&self) -> Option<&[Tensor]> {
        self.core().packed.as_ref()?.grad_views()
    }

    /// See [`Adam::param_shadows`].
    pub fn param_shadows(&self) -> Option<&[Tensor]> {
        self.core().packed.as_ref()?.f16_views()
    }

    /// Keeps (or stops keeping) a lookahead average of the weights from the
    /// next step on; it starts from the weights before that step.
    pub fn track_lookahead(&mut self, track: bool) {
        let core = self.core_mut();
        core.track_lookahead = track;
        if let (false, Some(packed)) = (track, &mut core.packed) {
            packed.ema = None;
        }
    }

    /// The lookahead average per parameter, for a checkpoint; `None` where
    /// none is kept (a read back on the GPU).
    pub fn lookahead_state(&self) -> Result<Option<Vec<Vec<f32>>>> {
        let core = self.core();
        match &core.packed {
            Some(packed) => ema::unpack(packed),
            None => Ok(core.restored_lookahead.clone()),
        }
    }

    /// Continues the lookahead average from a checkpoint's (see
    /// [`Optimizer::lookahead_state`]) at the next step that keeps one; every
    /// value must be finite, and the next step refuses other sizes.
    pub fn set_lookahead_state(&mut self, average: Vec<Vec<f32>>) -> Result<()> {
        if let Some(bad) = average.iter().flatten().find(|x| !x.is_finite()) {
            return Err(AetherError::InvalidShape {
                op: "Optimizer::set_lookahead_state",
                shape: average.iter().map(Vec::len).collect(),
                reason: format!("the average must be finite (holds {bad})"),
            });
        }
        let core = self.core_mut();
        if let Some(packed) = &mut core.packed {
            packed.ema = None;
        }
        core.restored_lookahead = Some(average);
        Ok(())
    }

    /// One lookahead update of `params` (the parameters of the step just
    /// taken, in its order): the average moves toward them by `1 - decay`
    /// and they become the average. Nothing before the average exists.
    pub fn lookahead(&mut self, params: &mut [Param], decay: f32) -> Result<()> {
        match &mut self.core_mut().packed {
            Some(packed) => ema::update(packed, params, decay),
            None => Ok(()),
        }
    }

    /// Drops the state and packed buffers and the step count, keeping the
    /// hyperparameters: the next step starts afresh for the parameters as
    /// they are then (rebuilt, or moved to another device).
    pub(crate) fn forget_state(&mut self) {
        self.core_mut().forget();
    }
}

/// The step count, packed layout and state every optimizer keeps.
#[derive(Default)]
pub(crate) struct Core {
    pub steps: u32,
    pub packed: Option<Packed>,
    /// State read from a checkpoint, laid out by the first step that follows.
    restored: Option<OptimizerState>,
    /// Whether the steps keep a lookahead average of the weights (ema.rs).
    track_lookahead: bool,
    /// A checkpoint's lookahead average, per parameter, for the first step.
    restored_lookahead: Option<Vec<Vec<f32>>>,
}

impl Core {
    fn forget(&mut self) {
        *self = Self {
            track_lookahead: self.track_lookahead,
            ..Self::default()
        };
    }

    /// Checks `params` and `loss`, lays the parameters out on the first step
    /// (with `buffers` per-element state buffers, restored where a
    /// checkpoint's state waits) and counts the step. `None` where there are
    /// no parameters (nothing to do).
    fn begin(
        &mut self,
        op: &'static str,
        params: &[Param],
        loss: Option<&Tensor>,
        buffers: usize,
    ) -> Result<Option<Device>> {
        let Some(device) = check_params(op, params, loss)? else {
            return Ok(None);
        };
        match &self.packed {
            Some(packed) if packed.buffers != buffers => {
                return Err(AetherError::InvalidShape {
                    op,
                    shape: vec![packed.buffers, buffers],
                    reason: "the optimizer's state buffers changed since its first step (momentum set to or from 0)".into(),
                });
            }
            Some(packed) => packed.check_layout(op, params, &device)?,
            None => {
                self.packed = Some(Packed::new(
                    op,
                    params,
                    &device,
                    buffers,
                    self.restored.as_ref(),
                )?);
                self.restored = None;
            }
        }
        if self.track_lookahead && self.packed().ema.is_none() {
            let restored = self.restored_lookahead.take();
            ema::start(self.packed(), params, &device, restored)?;
        }
        self.steps += 1;
        Ok(Some(device))
    }

    fn packed(&mut self) -> &mut Packed {
        self.packed.as_mut().expect("laid out by begin")
    }

    fn state(&self, names: &[&str]) -> Result<Option<OptimizerState>> {
        let Some(packed) = &self.packed else {
            return Ok(self.restored.clone());
        };
        let buffers = packed.unpack_state()?;
        Ok(Some(OptimizerState {
            steps: self.steps,
            buffers: names.iter().map(|n| n.to_string()).zip(buffers).collect(),
        }))
    }

    /// Keeps `state` for the next step, where its buffers are `names` in
    /// order, pair up per parameter, and every value passes `valid`.
    fn set_state(
        &mut self,
        op: &'static str,
        names: &[&str],
        state: OptimizerState,
        valid: impl Fn(&str, f32) -> bool,
    ) -> Result<()> {
        let given: Vec<&str> = state.buffers.iter().map(|(n, _)| n.as_str()).collect();
        let lengths = |b: &Vec<Vec<f32>>| b.iter().map(Vec::len).collect::<Vec<_>>();
        let first = state.buffers.first().map(|(_, b)| lengths(b));
        let bad = given != names
            || state.buffers.iter().any(|(_, b)| Some(lengths(b)) != first)
            || state
                .buffers
                .iter()
                .any(|(n, b)| b.iter().flatten().any(|&x| !valid(n, x)));
        if bad {
            return Err(AetherError::InvalidShape {
                op,
                shape: first.unwrap_or_default(),
                reason: format!(
                    "state buffers must be {names:?} (given {given:?}), pair up per parameter, and hold valid values"
                ),
            });
        }
        self.packed = None;
        self.steps = state.steps;
        self.restored = Some(state);
        Ok(())
    }

    fn skipped_step(&self) -> Result<Option<u32>> {
        let Some(packed) = &self.packed else {
            return Ok(None);
        };
        let gate = packed.gate.to_vec_u32()?[0];
        Ok((gate != GATE_OPEN).then_some(gate))
    }

    fn reopen(&mut self) -> Result<u32> {
        let Some(first) = self.skipped_step()? else {
            return Ok(0);
        };
        let packed = self.packed();
        packed.gate = Tensor::from_u32(vec![1], vec![GATE_OPEN], &packed.gate.device())?;
        let taken_back = self.steps - (first - 1);
        self.steps = first - 1;
        Ok(taken_back)
    }

    fn gate(&self) -> Option<&Tensor> {
        self.packed.as_ref().map(|p| &p.gate)
    }
}
