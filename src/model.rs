//! A `Model`: a plain stack of layers built with `add`, or a graph of them
//! ([`crate::Graph`]); then `configure`, `finalize`, `train`, `evaluate`,
//! `predict`, `save` and `load`.
//!
//! A training step uploads one batch, records every layer's forward and
//! backward kernels, the loss and the fused optimizer update into the pending
//! batch, and submits once; the host reads the loss back only on logging steps
//! (and every step's loss and correct count once at the end of the epoch).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::conv::PlannedLaunch;
use crate::device::Device;
use crate::error::{AetherError, Result, check_hyperparameter};
use crate::graph::{self, Graph, NodeId};
use crate::nn::{Layer, LayerSpec, Mode};
use crate::ops::activation::Activation;
use crate::ops::loss::{
    correct_count, cross_entropy_scaled, softmax, softmax_cross_entropy_with_correct_scaled,
};
use crate::optim::{
    Adam, Lookahead, LossScale, LossScaler, Optimizer, OptimizerState, Param, ParamGroup, Schedule,
    Sgd, StateByLayer, regularization_loss,
};
use crate::progress::Progress;
use crate::tensor::{DType, Tensor};

/// The training loss.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Loss {
    /// Softmax and categorical cross-entropy fused on logits (the last layer
    /// must not be a Softmax).
    SoftmaxCrossEntropy { label_smoothing: f32 },
    /// Categorical cross-entropy on probabilities (the last layer is a Softmax).
    CategoricalCrossEntropy { label_smoothing: f32 },
}

/// The metric reported next to the loss: the share of samples whose
/// highest output is their label ([`EpochStats::accuracy`], [`Model::evaluate`]).
/// It is the only metric and always computed, so [`Model::configure`]'s
/// argument changes nothing today.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Metric {
    CategoricalAccuracy,
}

/// Options of [`Model::train`].
#[derive(Clone)]
pub struct TrainOptions<'a> {
    pub epochs: usize,
    pub batch_size: usize,
    pub shuffle: bool,
    /// Held-out `(inputs, labels)` evaluated after every epoch.
    pub validation: Option<(&'a [f32], &'a [u32])>,
    /// Steps between loss read-backs (progress and divergence check).
    pub log_every: usize,
    /// Show each epoch's progress on stderr: a bar on a terminal, a plain
    /// line every 10 s elsewhere ([`Progress`]).
    pub progress: bool,
    /// Save the model while training; `None` saves nothing.
    pub checkpoint: Option<Checkpoint>,
    /// Called before every training step with the batch, already on the
    /// model's device, its epoch and step, and the optimizer
    /// ([`BatchContext`]): to augment the batch there (its kernels are
    /// recorded into the step's one submission), to set the learning rate on
    /// a schedule, or to read the dataset rows of the batch. An error it
    /// returns ends `train` with that error before the step changes anything.
    ///
    /// A shared `Fn` (not `FnMut`), so `TrainOptions` stays `Clone`, `Send`
    /// and `Sync`: what a hook changes per step lives in the context; state
    /// of its own goes in a `Cell` or `Mutex`.
    ///
    /// ```
    /// use aether::ops::augment::reflect_translate_alternating_flip;
    /// use aether::{BatchContext, TrainOptions};
    ///
    /// // airbench's augmentation, and the learning rate halved after 100 steps.
    /// let hook = |b: &mut BatchContext| {
    ///     let step = b.step as u32;
    ///     b.inputs = reflect_translate_alternating_flip(&b.inputs, 2, b.rows, b.seed, step, b.epoch)?;
    ///     let lr = if b.step < 100 { 1e-3 } else { 5e-4 };
    ///     b.optimizer().set_learning_rate(lr);
    ///     Ok(())
    /// };
    /// let options = TrainOptions { on_batch: Some(&hook), ..Default::default() };
    /// # let _ = options;
    /// ```
    pub on_batch: Option<&'a BatchHook<'a>>,
    /// Called after every epoch (its validation done, before any checkpoint
    /// save) with the epoch's number in this `train` call, from 0, and what
    /// it measured: to print or plot as training goes, or to stop it early by
    /// returning an error.
    pub on_epoch: Option<&'a EpochHook<'a>>,
}

/// The type of [`TrainOptions::on_batch`].
pub type BatchHook<'h> = dyn Fn(&mut BatchContext<'_>) -> Result<()> + Sync + 'h;
/// The type of [`TrainOptions::on_epoch`].
pub type EpochHook<'h> = dyn Fn(usize, &EpochStats) -> Result<()> + Sync + 'h;

impl std::fmt::Debug for TrainOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainOptions")
            .field("epochs", &self.epochs)
            .field("batch_size", &self.batch_size)
            .field("shuffle", &self.shuffle)
            .field(
                "validation",
                &self.validation.map(|(x, y)| (x.len(), y.len())),
            )
            .field("log_every", &self.log_every)
            .field("progress", &self.progress)
            .field("checkpoint", &self.checkpoint)
            .field("on_batch", &self.on_batch.map(|_| "Fn"))
            .field("on_epoch", &self.on_epoch.map(|_| "Fn"))
            .finish()
    }
}

/// One training step's batch as [`TrainOptions::on_batch`] sees it, before
/// the step. The hook may replace `inputs` and `labels` with tensors of the
/// same shapes on the model's device (an augmented batch), and change the
/// optimizer's hyperparameters; `train` checks what it hands back.
pub struct BatchContext<'m> {
    /// The model's epoch, counted over its life (a resumed checkpoint's
    /// epochs included), so an epoch-dependent augmentation such as
    /// [`crate::ops::augment::alternating_flip`] goes on where it stopped.
    pub epoch: usize,
    /// The model's step, counted over its life: the key of its dropout masks,
    /// and a natural key of augmentation draws.
    pub step: u64,
    /// The batch's place in its epoch, and the epoch's number of batches.
    pub batch: usize,
    pub batches: usize,
    /// The model's seed ([`Model::seed`]).
    pub seed: u64,
    /// The rows of the training data the batch holds, in batch order.
    pub rows: &'m [usize],
    /// The batch, NHWC (F16 where the model's first layer rounds to f16
    /// anyway, see [`Model::input_dtype`]), on the model's device.
    pub inputs: Tensor,
    /// The batch's class labels (U32), on the model's device.
    pub labels: Tensor,
    optimizer: &'m mut Optimizer,
    layers: &'m [Box<dyn Layer>],
}

impl BatchContext<'_> {
    /// The model's optimizer: set its learning rate
    /// ([`Optimizer::set_learning_rate`]) or other hyperparameters for this
    /// step and the following ones (a schedule set with
    /// [`Model::set_schedule`] sets the rate before each step, after this).
    pub fn optimizer(&mut self) -> &mut Optimizer {
        self.optimizer
    }

    /// The model's tensors as [`Model::tensors`] names them, as the previous
    /// step left them, on the model's device: what an average of the weights
    /// (an EMA kept with `ops::arith::{scale, add}`) reads, recorded into the
    /// step's submission like the rest of the hook's GPU work. On a GPU a
    /// parameter is a view of the optimizer's buffer, updated in place by
    /// later steps: keep a value with a copy (`scale(t, 1.0)`), not a clone.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        named_tensors(self.layers)
    }
}

/// Where and how often [`Model::train`] saves the model. Each save is a
/// complete model file written atomically (see [`Model::save`]): a crash, a
/// kill or a GPU fault at any moment leaves the previous checkpoint loadable.
/// A checkpoint holds what `save` writes: architecture, parameters, BatchNorm
/// statistics and, once the optimizer has stepped, its moments and step count
/// with the model's seed, step and completed epochs, all in the one atomic
/// write, so [`Model::resume`] continues training with the same bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The model file, replaced at each save.
    pub path: PathBuf,
    /// Save after every this many epochs (counted within one `train` call);
    /// a final save after the last epoch is the caller's [`Model::save`].
    pub every_epochs: usize,
}

impl Default for TrainOptions<'_> {
    fn default() -> Self {
        Self {
            epochs: 1,
            batch_size: 32,
            shuffle: true,
            validation: None,
            log_every: 20,
            progress: true,
            checkpoint: None,
            on_batch: None,
            on_epoch: None,
        }
    }
}

/// What one epoch of training measured.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    /// Mean data loss over the epoch's steps plus the regularization loss at its end.
    pub loss: f32,
    pub accuracy: f32,
    pub validation: Option<(f32, f32)>,
    /// The whole epoch, validation included.
    pub seconds: f64,
    /// The training steps alone (what a time per step or per image divides).
    pub train_seconds: f64,
    pub steps: usize,
}

/// Per-epoch statistics of a [`Model::train`] call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub epochs: Vec<EpochStats>,
}

/// What [`Model::gradients`] computed on one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients {
    /// The batch's mean loss.
    pub loss: f32,
    /// Each trainable parameter's gradient, named as in a model file.
    pub tensors: Vec<(String, Vec<f32>)>,
}

/// The architecture, as saved in a model file's metadata.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Architecture {
    format: String,
    input_shape: Vec<usize>,
    layers: Vec<LayerSpec>,
    /// Each layer's inputs, in graph models only (format v2); a file without
    /// them is a plain stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inputs: Option<Vec<Vec<NodeId>>>,
    loss: Option<Loss>,
}

/// Plain stacks keep the first format, so files they write still load in
/// older versions; graphs need the second, which older versions refuse.
const FORMAT: &str = "aether-model-v1";
const GRAPH_FORMAT: &str = "aether-model-v2";
const METADATA_KEY: &str = "aether_architecture";
/// The metadata a checkpoint adds to resume training ([`Model::resume`]).
const TRAINING_KEY: &str = "aether_training";

/// Where training stands, as a checkpoint saves it beside the optimizer's
/// state (tensors `optimizer.{buffer}.{k}`: Adam's `m` and `v`, SGD's
/// `momentum`). Adam's fields keep their names of files before SGD.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct TrainingState {
    /// The model's seed: its dropout masks and shuffles.
    seed: u64,
    /// Training steps taken: the next step's dropout masks.
    step: u64,
    /// Epochs [`Model::train`] completed: the next epoch's shuffle.
    epochs_done: usize,
    learning_rate: f32,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
    weight_decay: f32,
    /// The optimizer's step count (Adam's bias correction).
    adam_steps: u32,
    /// Present where the optimizer is SGD (the Adam fields are then unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sgd: Option<SgdSettings>,
    /// The loss scaler's scale and its steps toward the next growth, where
    /// the model trained with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    loss_scale: Option<(f32, u32)>,
}

/// SGD's hyperparameters beside [`TrainingState`]'s learning rate and decay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SgdSettings {
    momentum: f32,
    nesterov: bool,
}

/// A network: a plain stack of layers applied in order, or a graph of them
/// ([`Graph`], for skip connections and branches), trained with one loss and
/// an optimizer ([`crate::optim::Adam`] or [`crate::optim::Sgd`]), on the CPU path or a GPU.
///
/// Build it with [`add`](Self::add) (or [`from_graph`](Self::from_graph)) and
/// [`configure`](Self::configure), move it
/// with [`to`](Self::to), build its weights with [`finalize`](Self::finalize),
/// then [`train`](Self::train), [`evaluate`](Self::evaluate),
/// [`predict`](Self::predict) and [`save`](Self::save) / [`load`](Self::load).
///
/// ```
/// use aether::nn::{Conv2d, Dense, Flatten, ReLU};
/// use aether::optim::Adam;
/// use aether::{Device, Loss, Metric, Model, Padding, TrainOptions};
///
/// let mut model = Model::new().seed(7);
/// model.add(Conv2d::new(4, (3, 3), Padding::Same));
/// model.add(ReLU::default());
/// model.add(Flatten::default());
/// model.add(Dense::new(2));
/// let loss = Loss::SoftmaxCrossEntropy { label_smoothing: 0.0 };
/// model.configure(loss, Adam::new(1e-2), Metric::CategoricalAccuracy);
/// model.to(&Device::Cpu)?;
/// model.finalize(&[6, 6, 1])?; // one sample's shape: height, width, channels
///
/// // Class 1 is bright images, class 0 dark ones.
/// let y: Vec<u32> = (0..16).map(|i| i % 2).collect();
/// let x: Vec<f32> = y.iter().flat_map(|&c| [c as f32; 36]).collect();
/// let options = TrainOptions { epochs: 20, batch_size: 8, progress: false, ..Default::default() };
/// let history = model.train(&x, &y, &options)?;
/// assert_eq!(history.epochs.len(), 20);
/// let probabilities = model.predict(&x[..36], 1, false)?; // one sample, two classes
/// assert_eq!(probabilities.len(), 2);
/// # Ok::<(), aether::AetherError>(())
/// ```
pub struct Model {
    layers: Vec<Box<dyn Layer>>,
    /// Per layer: where its inputs come from (in a plain stack, the layer
    /// before; the first takes the model's input).
    inputs: Vec<Vec<NodeId>>,
    /// Per layer, from `finalize`: the running layers that read its output
    /// (through folded layers), with multiplicity; and those reading the input.
    readers: Vec<Vec<usize>>,
    input_readers: Vec<usize>,
    loss: Option<Loss>,
    optimizer: Option<Optimizer>,
    /// How the loss gradient is scaled, and the scaler it resolved to on the
    /// first step on this device (dropped with the optimizer's state).
    loss_scale: LossScale,
    scaler: Option<LossScaler>,
    /// A checkpoint's scale and growth count, for the first scaler after it.
    restored_scale: Option<(f32, u32)>,
    /// Rules setting parameters' learning-rate and decay multipliers.
    groups: Vec<ParamGroup>,
    /// Layers whose parameters the optimizer does not update.
    frozen: Vec<usize>,
    /// Per layer, how many parameters the last step gave the optimizer (0
    /// for a frozen layer): how its state splits by layer.
    param_counts: Vec<usize>,
    /// The optimizer's state by layer since the trained layers last
    /// changed: laid out by the next step (`relayout`), then the frozen
    /// layers' alone, kept until they train again.
    state_by_layer: StateByLayer,
    relayout: bool,
    /// Sets the optimizer's learning rate before each step.
    schedule: Option<Box<dyn Schedule>>,
    /// Pulls the weights to their moving average every few steps.
    lookahead: Option<Lookahead>,
    device: Device,
    input_shape: Option<Vec<usize>>,
    /// Per-sample shape after each layer, from `finalize`: what bounds the
    /// batch a GPU buffer can hold.
    output_shapes: Vec<Vec<usize>>,
    /// Whether `finalize` folds activations into the layer before them.
    fuse_activations: bool,
    fuse_dropout: bool,
    /// Per layer: an activation or SpatialDropout folded into the layer
    /// before it, so skipped.
    folded: Vec<bool>,
    /// Whether layers write f16 outputs for a next layer that rounds to f16.
    f16_activations: bool,
    /// Per layer: its output written as f16 (see [`Model::f16_activations`]).
    f16_outputs: Vec<bool>,
    /// Per layer: its input gradient returned as f16.
    f16_input_grads: Vec<bool>,
    /// The (batch size, input type, training) steps whose convs were planned
    /// ahead ([`Model::plan_convs_ahead`]).
    convs_planned: Vec<(usize, DType, bool)>,
    seed: u64,
    step: u64,
    /// Epochs [`Model::train`] has completed: each epoch's shuffle follows
    /// from its number, so training on after a checkpoint repeats none.
    epochs_done: usize,
    /// See [`Model::cpu_tensor_limit`].
    cpu_tensor_bytes: u64,
}

/// The default of [`Model::cpu_tensor_limit`]: 2 GiB, the largest buffer
/// most GPUs bind.
pub const DEFAULT_CPU_TENSOR_BYTES: u64 = 2 << 30;

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

/// The indices of the layers whose flag is set.
fn flagged(flags: &[bool]) -> Vec<usize> {
    (0..flags.len()).filter(|&i| flags[i]).collect()
}

/// An epoch's losses and correct counts, still on the device, each with the
/// step that made it. Training reads a loss back on logging steps only, so a
/// divergence seen there is traced back to the step it began at. Public for
/// training loops of one's own around [`Model::train_tensors`].
pub struct PendingLosses {
    epoch: usize,
    steps: Vec<(u64, Tensor, Tensor)>,
}

impl PendingLosses {
    /// Room for an epoch (numbered `epoch` in errors) of `steps` steps.
    pub fn new(epoch: usize, steps: usize) -> Self {
        Self {
            epoch,
            steps: Vec::with_capacity(steps),
        }
    }

    /// Records step `step`'s loss and correct count, unread.
    pub fn push(&mut self, step: u64, loss: Tensor, correct: Tensor) {
        self.steps.push((step, loss, correct));
    }

    /// Step `step`'s loss (not yet pushed), read back on a logging step; where
    /// it is not finite, the error naming the first step whose loss was not.
    pub fn logged(&self, step: u64, loss: &Tensor) -> Result<f32> {
        let value = loss.to_vec_f32()?[0];
        if value.is_finite() {
            return Ok(value);
        }
        self.totals()?;
        Err(self.non_finite(step, value))
    }

    /// The sums of every recorded loss and correct count, in step order; the
    /// error naming the first step whose loss is not finite.
    pub fn totals(&self) -> Result<(f64, u64)> {
        let (mut loss_sum, mut correct_sum) = (0.0f64, 0u64);
        for (step, loss, correct) in &self.steps {
            let value = loss.to_vec_f32()?[0];
            if !value.is_finite() {
                return Err(self.non_finite(*step, value));
            }
            loss_sum += f64::from(value);
            correct_sum += u64::from(correct.to_vec_u32()?[0]);
        }
        Ok((loss_sum, correct_sum))
    }

    /// The step number and loss of the step `back` steps before the last
    /// one recorded.
    fn before_last(&self, back: u64) -> Option<&(u64, Tensor, Tensor)> {
        let back = usize::try_from(back).ok()?;
        self.steps
            .len()
            .checked_sub(back + 1)
            .map(|i| &self.steps[i])
    }

    fn non_finite(&self, step: u64, loss: f32) -> AetherError {
        AetherError::NonFiniteLoss {
            step,
            epoch: self.epoch,
            loss,
        }
    }
}

fn model_err(message: impl Into<String>) -> AetherError {
    AetherError::Model(message.into())
}

/// `Ok` where no group names a parameter of a frozen layer by its index,
/// else the error naming the first such parameter.
fn check_frozen(groups: &[ParamGroup], frozen: &[usize], layers: &[Box<dyn Layer>]) -> Result<()> {
    for (g, group) in groups.iter().enumerate() {
        let Some(index) = group.named_layer().filter(|i| frozen.contains(i)) else {
            continue;
        };
        let kind = layers.get(index).map(|l| l.spec().kind()).unwrap_or("?");
        let names: Vec<&str> = layers
            .get(index)
            .map(|l| l.state().into_iter().map(|(n, _)| n).collect())
            .unwrap_or_default();
        let name = names
            .into_iter()
            .find(|n| group.selects(index, kind, n))
            .unwrap_or("(all)");
        return Err(AetherError::FrozenParameter {
            group: g,
            param: format!("layers.{index}.{name} ({kind})"),
        });
    }
    Ok(())
}

impl Model {
    /// An empty model on the CPU with seed 0.
    pub fn new() -> Self {
        Self {
            layers: Vec::new(),
            inputs: Vec::new(),
            readers: Vec::new(),
            input_readers: Vec::new(),
            loss: None,
            optimizer: None,
            loss_scale: LossScale::Auto,
            scaler: None,
            restored_scale: None,
            groups: Vec::new(),
            frozen: Vec::new(),
            param_counts: Vec::new(),
            state_by_layer: StateByLayer::default(),
            relayout: false,
            schedule: None,
            lookahead: None,
            device: Device::Cpu,
            input_shape: None,
            output_shapes: Vec::new(),
            fuse_activations: true,
            fuse_dropout: true,
            folded: Vec::new(),
            f16_activations: true,
            f16_outputs: Vec::new(),
            f16_input_grads: Vec::new(),
            convs_planned: Vec::new(),
            seed: 0,
            step: 0,
            epochs_done: 0,
            cpu_tensor_bytes: DEFAULT_CPU_TENSOR_BYTES,
        }
    }

    /// The most bytes one activation tensor (a batch's input or a layer's
    /// output, f32) may take on the CPU; default [`DEFAULT_CPU_TENSOR_BYTES`].
    /// Inference splits a batch to fit, as on a GPU; a single sample, or a
    /// training batch, past it is a `TooLarge` error naming the layer, before
    /// anything allocates: a crafted geometry (a 1x1 conv padded by 16383)
    /// cannot make `predict` take gigabytes.
    pub fn cpu_tensor_limit(mut self, bytes: u64) -> Self {
        self.cpu_tensor_bytes = bytes;
        self
    }

    /// Seeds weight initialisation and dropout masks (before `finalize`).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether an activation right after a layer that can take it over runs
    /// inside that layer: ReLU, LeakyReLU, GELU or SiLU after a BatchNorm,
    /// ReLU after a residual `Add`. One pass over the activations fewer each
    /// way, and no copy of them kept for the backward (a BatchNorm recomputes
    /// the activation's input from its own); the same formulas in the same
    /// order (bit-identical on the CPU and on lavapipe; a GPU compiler that
    /// contracts the recomputation into fused multiply-adds differently may
    /// differ in the last bits). On by default; takes effect at `finalize`.
    pub fn fuse_activations(mut self, fuse: bool) -> Self {
        self.fuse_activations = fuse;
        self
    }

    /// Whether a SpatialDropout right after a layer that can take it over (a
    /// MaxPool2d whose windows tile its input) runs inside that layer: a pass
    /// over the activations and the stored mask fewer each way, the mask drawn
    /// again in the backward; bit-identical results. On by default; takes
    /// effect at `finalize`.
    pub fn fuse_dropout(mut self, fuse: bool) -> Self {
        self.fuse_dropout = fuse;
        self
    }

    /// Whether a layer whose output the next layer rounds to f16 anyway (a
    /// conv with f16 kernels, on a GPU) writes it as f16 where it can
    /// (BatchNorm; SpatialDropout in training and MaxPool2d, over channels in
    /// fours; ReLU, LeakyReLU, GELU and SiLU), and
    /// whether a layer whose input gradient the layer before
    /// rounds to f16 anyway (such a conv again, clipping to +-65504) returns
    /// it that way (BatchNorm; a MaxPool2d whose windows tile its input, over
    /// channels in fours; ReLU, LeakyReLU, GELU and SiLU): bit-identical
    /// operands for the conv in half the bytes, and no casts of its own. On by
    /// default; takes effect at `finalize` and `to`.
    pub fn f16_activations(mut self, on: bool) -> Self {
        self.f16_activations = on;
        self
    }

    /// Appends a layer taking the output of the last one (the model's input
    /// for the first; in a graph model, the output). After `finalize` this takes the model back to
    /// unfinalized (training, prediction and `save` then ask for `finalize`,
    /// which builds every layer afresh): the new layer has no weights yet.
    pub fn add(&mut self, layer: impl Layer + 'static) -> &mut Self {
        self.inputs.push(graph::stacked(self.layers.len()));
        self.layers.push(Box::new(layer));
        self.input_shape = None;
        self.output_shapes.clear();
        self
    }

    /// A model (on the CPU, seed 0) running `graph`, whose output is the last
    /// layer added. The graph is checked at `finalize`: a layer that takes a
    /// later layer's output (a cycle), a missing layer or a layer whose output
    /// nothing uses is an error naming it.
    pub fn from_graph(graph: Graph) -> Self {
        let mut model = Self::new();
        model.layers = graph.layers;
        model.inputs = graph.inputs;
        model
    }

    /// Where layer `index` takes its inputs from.
    pub fn layer_inputs(&self, index: usize) -> Option<&[NodeId]> {
        self.inputs.get(index).map(Vec::as_slice)
    }

    /// Sets the training loss and the optimizer (its hyperparameters are
    /// checked at `finalize`). `metric` names what `train` and `evaluate`
    /// report beside the loss; [`Metric::CategoricalAccuracy`] is the only
    /// one and is always reported, so the argument changes nothing.
    pub fn configure(
        &mut self,
        loss: Loss,
        optimizer: impl Into<Optimizer>,
        _metric: Metric,
    ) -> &mut Self {
        self.loss = Some(loss);
        self.optimizer = Some(optimizer.into());
        // Frozen layers' state was the old optimizer's.
        self.state_by_layer = StateByLayer::default();
        self.relayout = false;
        self
    }

    /// How the loss gradient is scaled ([`LossScale`]; by default
    /// [`LossScale::Auto`]: GradScaler's dynamic scale where a layer rounds
    /// its output gradient to f16, none on the CPU path). Takes effect at the
    /// next step from a fresh scale.
    pub fn set_loss_scale(&mut self, scale: LossScale) -> Result<&mut Self> {
        scale.validate()?;
        self.loss_scale = scale;
        self.scaler = None;
        self.restored_scale = None;
        Ok(self)
    }

    /// The loss scale now and the steps counted toward its next growth;
    /// `None` where the model trains unscaled (or took no step yet and
    /// resumed none). On the GPU this reads the scale back.
    pub fn loss_scale(&self) -> Result<Option<(f32, u32)>> {
        match &self.scaler {
            Some(scaler) => scaler.scale().map(Some),
            None => Ok(self.restored_scale),
        }
    }

    /// Sets the parameter groups: each selects parameters by layer kind or
    /// index and sets their learning-rate and weight-decay multipliers
    /// (later groups override earlier ones), carried in the optimizer's
    /// segment table, so the update stays one dispatch. A group naming a
    /// frozen layer by index is [`AetherError::FrozenParameter`].
    pub fn set_param_groups(&mut self, groups: Vec<ParamGroup>) -> Result<&mut Self> {
        for group in &groups {
            group.validate()?;
        }
        check_frozen(&groups, &self.frozen, &self.layers)?;
        self.groups = groups;
        Ok(self)
    }

    /// Freezes layer `index` (`trainable` false: the optimizer leaves its
    /// parameters as they are) or trains it again. Where no layer before a
    /// frozen one trains, its backward does not run, nor does any input
    /// gradient that would only reach it (fine-tuning the head of a frozen
    /// backbone runs the head's backward alone); a frozen layer between
    /// trained ones still passes the gradient through, computing its own
    /// parameters' gradients on the way, which the optimizer ignores.
    /// The optimizer's state (moments, step count, lookahead average) and
    /// the loss scale carry over: the layers that keep training keep
    /// theirs, a frozen layer's waits until it trains again, and a layer
    /// that never trained starts afresh. Before the first step (or the
    /// first after [`Model::to`]) there is none to carry, and a
    /// checkpoint's state not yet laid out by a step is dropped.
    /// A parameter group naming the layer is
    /// [`AetherError::FrozenParameter`].
    pub fn set_trainable(&mut self, index: usize, trainable: bool) -> Result<&mut Self> {
        if index >= self.layers.len() {
            return Err(model_err(format!(
                "set_trainable: no layer {index} (the model has {})",
                self.layers.len()
            )));
        }
        let mut frozen = self.frozen.clone();
        frozen.retain(|&i| i != index);
        if !trainable {
            frozen.push(index);
        }
        check_frozen(&self.groups, &frozen, &self.layers)?;
        if frozen != self.frozen {
            self.split_optimizer_state()?;
            self.frozen = frozen;
            // The backward's input gradients changed with it.
            self.convs_planned.clear();
        }
        Ok(self)
    }

    /// Sets the learning rate of every later step from `schedule`, by the
    /// model's step count ([`Schedule::lr`]): a resumed model carries on
    /// where it stopped, given the same schedule again. `None` keeps the
    /// optimizer's rate as it is.
    pub fn set_schedule(&mut self, schedule: Option<Box<dyn Schedule>>) -> &mut Self {
        self.schedule = schedule;
        self
    }

    /// Keeps a lookahead average of the trained parameters (airbench's
    /// `LookaheadState`; see [`Lookahead`]): it starts from the weights
    /// before the next step, and after every `every`-th optimizer step the
    /// average moves toward the weights by `1 - decay` and the weights
    /// become the average, in one dispatch over all parameters. Changing
    /// `decay` later (airbench raises it) keeps the average; `None` drops
    /// it. A checkpoint saves the average (`optimizer.lookahead.{k}`) but
    /// not this setting: set it again after [`Model::resume`] and the
    /// average carries on.
    pub fn set_lookahead(&mut self, lookahead: Option<Lookahead>) -> Result<&mut Self> {
        if let Some(l) = &lookahead {
            l.validate()?;
        }
        self.lookahead = lookahead;
        Ok(self)
    }

    /// Whether layer `index`'s parameters train (see [`Model::set_trainable`]).
    pub fn is_trainable(&self, index: usize) -> bool {
        !self.frozen.contains(&index)
    }

    /// The optimizer, to change its hyperparameters between steps (a
    /// learning rate by hand, where no schedule sets it).
    pub fn optimizer_mut(&mut self) -> Option<&mut Optimizer> {
        self.optimizer.as_mut()
    }

    /// The optimizer, once configured (its step count, state, gate).
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.optimizer.as_ref()
    }

    /// Whether any layer rounds its output gradient to f16 on this device:
    /// what [`LossScale::Auto`] scales for.
    fn rounds_grads_to_f16(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.rounds_output_grad_to_f16(&self.device))
    }

    /// The loss scaler of the next step, made on the first one.
    fn ensure_scaler(&mut self) -> Result<()> {
        if self.scaler.is_some() {
            return Ok(());
        }
        self.scaler = LossScaler::new(self.loss_scale, self.rounds_grads_to_f16(), &self.device)?;
        if let (Some(scaler), Some((scale, good))) = (&mut self.scaler, self.restored_scale.take())
        {
            *scaler = LossScaler::with_state(scale, good, scaler.growth_interval(), &self.device)?;
        }
        Ok(())
    }

    /// `Ok` where the loss and the optimizer, as configured now, can train
    /// the layers: hyperparameters in range, the loss fits the last layer.
    /// `finalize` checks it, and so does every training step before its
    /// forward pass, since `configure` may have changed them since.
    fn check_configuration(&self) -> Result<()> {
        if let Some(optimizer) = &self.optimizer {
            optimizer.validate()?;
        }
        if let Some(
            Loss::SoftmaxCrossEntropy { label_smoothing }
            | Loss::CategoricalCrossEntropy { label_smoothing },
        ) = self.loss
        {
            let valid = (0.0..=1.0).contains(&label_smoothing);
            check_hyperparameter("label_smoothing", label_smoothing, valid, "in [0, 1]")?;
        }
        if let (Some(Loss::SoftmaxCrossEntropy { .. }), Some(last)) =
            (self.loss, self.layers.last())
            && last.spec() == LayerSpec::Softmax
        {
            return Err(model_err(
                "a Softmax layer directly before SoftmaxCrossEntropy applies softmax twice; \
                 remove the layer (the loss works on logits) or use CategoricalCrossEntropy",
            ));
        }
        if let (Some(Loss::CategoricalCrossEntropy { .. }), Some(last)) =
            (self.loss, self.layers.last())
            && last.spec() != LayerSpec::Softmax
        {
            return Err(model_err(format!(
                "CategoricalCrossEntropy takes probabilities, but the last layer is {:?}; \
                 end the model with a Softmax layer, or use SoftmaxCrossEntropy on logits",
                last.spec()
            )));
        }
        Ok(())
    }

    /// Builds every layer for per-sample `input_shape` on the model's device.
    /// Shape errors name the layer by index.
    pub fn finalize(&mut self, input_shape: &[usize]) -> Result<()> {
        self.finalize_within(input_shape, None)
    }

    /// [`Model::finalize`], refusing before any layer builds where the
    /// layers' state would take more than `state_budget` values: a model
    /// file's architecture may ask for no more than the file's tensors hold.
    fn finalize_within(
        &mut self,
        input_shape: &[usize],
        state_budget: Option<usize>,
    ) -> Result<()> {
        self.check_configuration()?;
        // Every layer's sizes follow from the input's: a sample's values must
        // be countable (no overflow downstream) and indexable by the kernels.
        let values = input_shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d).filter(|_| d > 0));
        if input_shape.is_empty() || values.is_none_or(|v| v > u32::MAX as usize) {
            return Err(model_err(format!(
                "input shape {input_shape:?}: each sample needs 1 to {} values, every axis at least 1",
                u32::MAX
            )));
        }
        let kinds: Vec<&'static str> = self.layers.iter().map(|l| l.spec().kind()).collect();
        let (consumers, _) = graph::consumers(&self.inputs, &kinds)?;
        // The layers build afresh: until every one has, the model is not
        // finalized (a failed build leaves nothing half-built usable), their
        // gradients have no destination and the optimizer no moments.
        self.input_shape = None;
        self.output_shapes.clear();
        self.forget_optimizer_state();
        let mut output_shapes: Vec<Vec<usize>> = Vec::with_capacity(self.layers.len());
        let mut state_values = 0usize;
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let seed = layer_seed(self.seed, i);
            let spec = layer.spec();
            let shapes: Vec<&[usize]> = self.inputs[i]
                .iter()
                .map(|&source| match source {
                    NodeId::Input => input_shape,
                    NodeId::Layer(j) => output_shapes[j].as_slice(),
                })
                .collect();
            let in_layer = |e: AetherError| match shapes.as_slice() {
                [shape] => model_err(format!(
                    "layer {i} ({spec:?}) with input shape {shape:?}: {e}"
                )),
                _ => model_err(format!(
                    "layer {i} ({spec:?}) with input shapes {shapes:?}: {e}"
                )),
            };
            if let Some(budget) = state_budget {
                let values = layer.state_values(shapes[0]).map_err(in_layer)?;
                state_values = state_values.saturating_add(values);
                if state_values > budget {
                    return Err(model_err(format!(
                        "layers 0 to {i} would hold {state_values} state values, \
                         more than the model file's tensors hold ({budget})"
                    )));
                }
            }
            let shape = layer
                .build_inputs(&shapes, seed, &self.device)
                .map_err(in_layer)?;
            output_shapes.push(shape);
        }
        self.input_shape = Some(input_shape.to_vec());
        self.output_shapes = output_shapes;
        self.folded = vec![false; self.layers.len()];
        // A layer folds into the one whose output it alone reads.
        let sole_reader_of = |i: usize| match self.inputs[i].as_slice() {
            [NodeId::Layer(j)] if consumers[*j] == [i] => Some(*j),
            _ => None,
        };
        if self.fuse_activations {
            for i in 0..self.layers.len() {
                if let Some(j) = sole_reader_of(i)
                    && let Some(activation) = Activation::of(&self.layers[i].spec())
                    && !self.folded[j]
                    && self.layers[j].fuse_activation(activation)
                {
                    self.folded[i] = true;
                }
            }
        }
        if self.fuse_dropout {
            for i in 0..self.layers.len() {
                if let Some(j) = sole_reader_of(i)
                    && let LayerSpec::SpatialDropout { rate } = self.layers[i].spec()
                    && !self.folded[j]
                    && self.layers[j].fuse_spatial_dropout(rate, layer_seed(self.seed, i))
                {
                    self.folded[i] = true;
                }
            }
        }
        self.plan_readers();
        self.plan_f16_outputs();
        Ok(())
    }

    /// The layer that computes `source`'s value: a folded layer's value is
    /// the one of the layer it runs inside.
    fn resolve(&self, mut source: NodeId) -> NodeId {
        while let NodeId::Layer(j) = source
            && self.is_folded(j)
        {
            source = self.inputs[j][0];
        }
        source
    }

    /// Where running layer `i` reads its inputs.
    fn sources(&self, i: usize) -> Vec<NodeId> {
        self.inputs[i].iter().map(|&s| self.resolve(s)).collect()
    }

    /// Which running layers' output gradients a backward needs: a layer's
    /// whose parameters train, or that reads a layer whose gradient is
    /// needed (PyTorch's `requires_grad`, carried forward). The backward
    /// skips the others, and asks no layer for an input gradient only
    /// they would take: a frozen front of the network costs nothing.
    fn grads_needed(&self) -> Vec<bool> {
        let mut needed = vec![false; self.layers.len()];
        for i in (0..self.layers.len()).filter(|&i| !self.is_folded(i)) {
            needed[i] = (self.layers[i].spec().has_params() && !self.frozen.contains(&i))
                || self
                    .sources(i)
                    .iter()
                    .any(|s| matches!(s, NodeId::Layer(j) if needed[*j]));
        }
        needed
    }

    /// Who reads each running layer's output, and the input.
    fn plan_readers(&mut self) {
        let n = self.layers.len();
        let mut readers = vec![Vec::new(); n];
        let mut input_readers = Vec::new();
        for i in (0..n).filter(|&i| !self.is_folded(i)) {
            for source in self.sources(i) {
                match source {
                    NodeId::Input => input_readers.push(i),
                    NodeId::Layer(j) => readers[j].push(i),
                }
            }
        }
        (self.readers, self.input_readers) = (readers, input_readers);
    }

    /// Tells each layer whether the next one that runs rounds its input to
    /// f16, and whether the one before rounds its output gradient to f16, on
    /// the model's device (see [`Model::f16_activations`]).
    ///
    /// In a graph, an output goes as f16 only where every layer reading it
    /// rounds it so; a gradient only where its one input feeds this layer
    /// alone (gradients summed from several readers stay f32).
    fn plan_f16_outputs(&mut self) {
        let n = self.layers.len();
        self.f16_outputs = vec![false; n];
        self.f16_input_grads = vec![false; n];
        let device = &self.device;
        let on = self.f16_activations;
        let running: Vec<usize> = (0..n).filter(|&i| !self.is_folded(i)).collect();
        for i in running {
            let readers = &self.readers[i];
            let rounds_output = on
                && !readers.is_empty()
                && readers
                    .iter()
                    .all(|&r| self.layers[r].rounds_input_to_f16(device));
            let rounds_grad = on
                && match self.sources(i).as_slice() {
                    [NodeId::Layer(p)] => {
                        self.readers[*p] == [i] && self.layers[*p].rounds_output_grad_to_f16(device)
                    }
                    _ => false,
                };
            self.f16_outputs[i] = self.layers[i].output_rounded_to_f16(rounds_output);
            self.f16_input_grads[i] = self.layers[i].input_grad_rounded_to_f16(rounds_grad);
        }
    }

    /// Indices of the layers that write their output as f16 for the next
    /// layer (see [`Model::f16_activations`]).
    pub fn f16_outputs(&self) -> Vec<usize> {
        flagged(&self.f16_outputs)
    }

    /// Indices of the layers whose backward returns the input gradient as
    /// f16 for the layer before (see [`Model::f16_activations`]).
    pub fn f16_input_grads(&self) -> Vec<usize> {
        flagged(&self.f16_input_grads)
    }

    /// Indices of the activation layers that `finalize` folded into the
    /// layer before them (see [`Model::fuse_activations`]).
    pub fn fused_activations(&self) -> Vec<usize> {
        self.folded_where(|spec| Activation::of(spec).is_some())
    }

    /// Indices of the SpatialDropout layers that `finalize` folded into the
    /// layer before them (see [`Model::fuse_dropout`]).
    pub fn fused_dropouts(&self) -> Vec<usize> {
        self.folded_where(|spec| matches!(spec, LayerSpec::SpatialDropout { .. }))
    }

    fn folded_where(&self, kind: impl Fn(&LayerSpec) -> bool) -> Vec<usize> {
        flagged(&self.folded)
            .into_iter()
            .filter(|&i| kind(&self.layers[i].spec()))
            .collect()
    }

    /// Whether layer `i` runs inside the layer before it.
    fn is_folded(&self, i: usize) -> bool {
        self.folded.get(i).copied().unwrap_or(false)
    }

    /// Splits the optimizer's state by layer for the next step to lay out
    /// again ([`Model::set_trainable`]), then drops its packed buffers.
    fn split_optimizer_state(&mut self) -> Result<()> {
        if let Some(opt) = &mut self.optimizer
            && opt.core().packed.is_some()
            && !self.relayout
            && self.param_counts.len() == self.layers.len()
            && let Some(state) = opt.state()?
        {
            let lookahead = opt.lookahead_state()?;
            self.state_by_layer
                .take(state, lookahead, &self.param_counts);
            self.relayout = true;
        }
        self.drop_packed_state();
        Ok(())
    }

    /// Drops the optimizer's moments and packed buffers (keeping its
    /// hyperparameters), the state kept by layer and the loss scaler: the
    /// next step starts a fresh optimizer state for the parameters as they are.
    fn forget_optimizer_state(&mut self) {
        self.state_by_layer = StateByLayer::default();
        self.relayout = false;
        self.drop_packed_state();
        self.scaler = None;
    }

    /// Drops the optimizer's packed buffers and the layers' gradient
    /// destinations in them: the layers write their gradients into tensors
    /// of their own until the next step hands out new views.
    fn drop_packed_state(&mut self) {
        for layer in &mut self.layers {
            layer.set_grad_outputs(Vec::new());
        }
        if let Some(opt) = &mut self.optimizer {
            opt.forget_state();
        }
    }

    /// Moves every parameter and statistic to `device`.
    pub fn to(&mut self, device: &Device) -> Result<()> {
        // The gradients went into the old optimizer's buffer, and its moments
        // live on the old device.
        self.forget_optimizer_state();
        for layer in &mut self.layers {
            let moved: Vec<(&'static str, Tensor)> = layer
                .state()
                .into_iter()
                .map(|(name, t)| Ok((name, t.to(device)?)))
                .collect::<Result<_>>()?;
            for (name, t) in moved {
                layer.set_state(name, t)?;
            }
        }
        self.device = device.clone();
        if self.input_shape.is_some() {
            self.plan_f16_outputs();
        }
        Ok(())
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The per-sample input shape given to `finalize` (or read from the model file).
    pub fn input_shape(&self) -> Result<&[usize]> {
        self.input_shape
            .as_deref()
            .ok_or_else(|| model_err("call finalize(input_shape) first"))
    }

    /// Splits flat host data into whole samples, or an error naming the sizes.
    fn sample_count(&self, x: &[f32], labels: Option<&[u32]>) -> Result<usize> {
        let per: usize = self.input_shape()?.iter().product();
        if x.is_empty() || !x.len().is_multiple_of(per) {
            return Err(model_err(format!(
                "input of {} values is not a whole number of samples of shape {:?}",
                x.len(),
                self.input_shape()?
            )));
        }
        let n = x.len() / per;
        // A NaN or Inf input would come out as a NaN prediction or loss.
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(model_err(format!(
                "value {} of sample {} (index {} within it) is not finite",
                x[i],
                i / per,
                i % per
            )));
        }
        if let Some(y) = labels {
            if y.len() != n {
                return Err(model_err(format!("{n} samples but {} labels", y.len())));
            }
            // The GPU's loss kernels cannot report a label past the last class.
            let classes: usize = self.output_shapes.last().map_or(0, |s| s.iter().product());
            if let Some(i) = y.iter().position(|&label| label as usize >= classes) {
                return Err(model_err(format!(
                    "label {} of sample {i} is out of range for the model's {classes} classes",
                    y[i]
                )));
            }
        }
        Ok(n)
    }

    fn batch_tensor(&self, x: &[f32], indices: &[usize]) -> Result<Tensor> {
        let dims = crate::nn::batched_dims(indices.len(), self.input_shape()?);
        Tensor::from_f32_rows(dims, x, indices, self.input_dtype(), &self.device)
    }

    /// Runs every layer in order; each output is dropped once its last
    /// reader has run, so its buffer returns to the pool.
    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        self.plan_convs_ahead(x, matches!(mode, Mode::Train { .. }));
        let n = self.layers.len();
        let mut values: Vec<Option<Tensor>> = vec![None; n];
        for i in 0..n {
            if self.is_folded(i) {
                continue;
            }
            self.timing_scope(|| format!("{i} {} forward", self.layers[i].spec().kind()));
            let sources = self.sources(i);
            let inputs: Vec<&Tensor> = sources
                .iter()
                .map(|&s| match s {
                    NodeId::Input => Ok(x),
                    NodeId::Layer(j) => values[j]
                        .as_ref()
                        .ok_or_else(|| model_err(format!("layer {j}'s output was dropped early"))),
                })
                .collect::<Result<_>>()?;
            let y = self.layers[i].forward_inputs(&inputs, mode)?;
            values[i] = Some(y);
            for source in sources {
                if let NodeId::Layer(j) = source
                    && self.readers[j].last() == Some(&i)
                {
                    values[j] = None;
                }
            }
        }
        match self.resolve(NodeId::Layer(n.saturating_sub(1))) {
            NodeId::Layer(out) if n > 0 => values[out]
                .take()
                .ok_or_else(|| model_err("the output layer ran no forward")),
            _ => Ok(x.clone()),
        }
    }

    /// The gradient of layer `j`'s output summed from `sum` and `dx` (what
    /// reader `i` passed back). At the last sum (from `j`'s first reader,
    /// whose backward runs last), where `j` masks its gradient by a folded
    /// ReLU, the mask is applied in the same pass and `j` told so.
    fn sum_gradient(&mut self, j: usize, i: usize, sum: &Tensor, dx: &Tensor) -> Result<Tensor> {
        let last = self.readers[j].first() == Some(&i);
        match self.layers[j].relu_mask().filter(|_| last).cloned() {
            Some(y) => {
                let masked = crate::ops::arith::add_relu_backward(sum, dx, &y)?;
                self.layers[j].output_grad_masked();
                Ok(masked)
            }
            None => crate::ops::arith::add(sum, dx),
        }
    }

    /// Plans every conv kernel that a step on batches of `batch_size` runs,
    /// spread over all cores at once: each plan compiles its pipelines, which
    /// a first step would otherwise compile one after another as it records
    /// (ResNet-18's first step on an H100 spent about 4 s there). `train`
    /// plans the backward's kernels too. Training and prediction do this on
    /// their own the first time a batch size comes; call it to take that time
    /// where it suits the app (while it loads, say). Nothing on the CPU path.
    pub fn plan_convs(&mut self, batch_size: usize, train: bool) -> Result<()> {
        self.plan_convs_for(batch_size, self.input_dtype(), train)
    }

    /// [`Model::plan_convs`] for a step on `x`, the first time a batch of its
    /// size and type comes. An error is left for the step, which meets the
    /// same plan and reports it with its layer.
    fn plan_convs_ahead(&mut self, x: &Tensor, train: bool) {
        if let Some(&batch) = x.dims().first() {
            let _ = self.plan_convs_for(batch, x.dtype(), train);
        }
    }

    fn plan_convs_for(&mut self, batch: usize, input_dtype: DType, train: bool) -> Result<()> {
        let key = (batch, input_dtype, train);
        if self.convs_planned.contains(&key) {
            return Ok(());
        }
        let Some(ctx) = self.device.gpu_context().cloned() else {
            return Ok(());
        };
        let input_shape = self.input_shape()?.to_vec();
        let needed = self.grads_needed();
        let work: Vec<_> = (0..self.layers.len())
            .filter(|&i| !self.is_folded(i))
            .filter_map(|i| {
                let (input, dtype, input_grad) = match self.sources(i).as_slice() {
                    [NodeId::Input] => (input_shape.as_slice(), input_dtype, false),
                    &[NodeId::Layer(j)] => {
                        let dtype = if self.f16_outputs.get(j) == Some(&true) {
                            DType::F16
                        } else {
                            DType::F32
                        };
                        (self.output_shapes.get(j)?.as_slice(), dtype, needed[j])
                    }
                    _ => return None,
                };
                let step = crate::nn::StepKind {
                    batch,
                    input: dtype,
                    train: train && needed[i],
                    input_grad,
                };
                self.layers[i].conv_work(input, &step)
            })
            .collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let prepared = crate::conv::prepare_convs(&ctx, &work, threads);
        // Not again for this batch, failed or not: a plan that failed here
        // fails in the step, which reports it with its layer.
        self.convs_planned.push(key);
        prepared
    }

    /// Runs every layer's backward in reverse order from `grad`, the loss's
    /// gradient; where an output feeds several layers their gradients are
    /// summed.
    fn backward(&mut self, grad: Tensor) -> Result<()> {
        let n = self.layers.len();
        let mut grads: Vec<Option<Tensor>> = vec![None; n];
        // Output gradients whose f16 saturation the reader that wrote them
        // flagged already (see `Layer::flag_input_grad_saturation`).
        let mut flagged = vec![false; n];
        let needed = self.grads_needed();
        match self.resolve(NodeId::Layer(n.saturating_sub(1))) {
            // A model whose every layer is frozen runs no backward.
            NodeId::Layer(out) if n > 0 && needed[out] => grads[out] = Some(grad),
            _ => return Ok(()),
        }
        let wanted = |s: &NodeId| matches!(s, NodeId::Layer(j) if needed[*j]);
        for i in (0..n).rev() {
            let Some(dy) = grads[i].take() else {
                continue;
            };
            self.timing_scope(|| format!("{i} {} backward", self.layers[i].spec().kind()));
            let sources = self.sources(i);
            let need_dx = sources.iter().any(wanted);
            if let Some(scaler) = &self.scaler {
                if self.layers[i].rounds_output_grad_to_f16(&self.device)
                    && !flagged[i]
                    && !self.layers[i].flag_output_grad_saturation(scaler.state(), &dy)
                {
                    scaler.check_saturation(&dy)?;
                }
                // An f16 input gradient goes to one layer that rounds it
                // (`plan_f16_outputs`): this layer may flag it as it writes it.
                if let [NodeId::Layer(j)] = sources.as_slice()
                    && need_dx
                    && self.f16_input_grads.get(i) == Some(&true)
                {
                    flagged[*j] = self.layers[i].flag_input_grad_saturation(scaler.state());
                }
            }
            let dxs = self.layers[i].backward_inputs(&dy, need_dx)?;
            for (source, dx) in sources.into_iter().zip(dxs) {
                if let (NodeId::Layer(j), Some(dx)) = (source, dx)
                    && needed[j]
                {
                    grads[j] = Some(match grads[j].take() {
                        Some(sum) => self.sum_gradient(j, i, &sum, &dx)?,
                        None => dx,
                    });
                }
            }
        }
        Ok(())
    }

    /// The loss, the count of correct rows and the loss's gradient, scaled
    /// by the loss scaler's scale where there is one: for the softmax loss
    /// in one GPU dispatch where the batch allows.
    fn loss_grad_and_correct(
        &self,
        out: &Tensor,
        labels: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let scale = self.scaler.as_ref().map(LossScaler::state);
        match self
            .loss
            .ok_or_else(|| model_err("call configure(loss, optimizer, metric) first"))?
        {
            Loss::SoftmaxCrossEntropy { label_smoothing } => {
                softmax_cross_entropy_with_correct_scaled(out, labels, label_smoothing, scale)
            }
            Loss::CategoricalCrossEntropy { label_smoothing } => {
                let (loss, grad) = cross_entropy_scaled(out, labels, label_smoothing, scale)?;
                Ok((loss, correct_count(out, labels)?, grad))
            }
        }
    }

    /// The sum of every layer's L1/L2 penalties (one GPU reduction over all of
    /// them), or `None` when no layer is regularised. Computed only when asked.
    pub fn regularization_loss(&self) -> Result<Option<f32>> {
        let terms: Vec<(&Tensor, f32, f32)> =
            self.layers.iter().flat_map(|l| l.regularized()).collect();
        if terms.is_empty() {
            return Ok(None);
        }
        Ok(Some(regularization_loss(&terms)?.to_vec_f32()?[0]))
    }

    /// How host batches go to the device: F16 where the first layer rounds its
    /// input to f16 anyway, half the bytes (docs/lab/perf-notes.md, entry 49), else
    /// F32. A batch for [`Model::train_tensors`] made with this type (by
    /// [`Tensor::from_f32_rows`]) trains exactly as [`Model::train_batch`] would.
    pub fn input_dtype(&self) -> DType {
        let rounds = !self.input_readers.is_empty()
            && self
                .input_readers
                .iter()
                .all(|&r| self.layers[r].rounds_input_to_f16(&self.device));
        if rounds { DType::F16 } else { DType::F32 }
    }

    /// `Ok` where every training step so far had a finite loss and finite
    /// gradients. Else the error naming the first that did not: that step
    /// and every later one changed nothing (the optimizer skipped them, see
    /// [`crate::optim`]), and they are taken back, so the model is as it was before
    /// it and trains on from there. [`Model::train`] checks this on its
    /// logging steps and at every epoch's end; after [`Model::train_batch`]
    /// or [`Model::train_tensors`] call it where their loss is read (it waits
    /// for the steps recorded so far).
    pub fn check_steps(&mut self) -> Result<()> {
        self.check_skipped(None)
    }

    /// [`Model::check_steps`], naming the step as `pending` numbers it and,
    /// where its loss is recorded there and not finite, as `NonFiniteLoss`.
    pub(crate) fn check_skipped(&mut self, pending: Option<&PendingLosses>) -> Result<()> {
        let Some(optimizer) = &mut self.optimizer else {
            return Ok(());
        };
        let Some(first) = optimizer.skipped_step()? else {
            return Ok(());
        };
        let later = u64::from(optimizer.steps() - first);
        let taken_back = u64::from(optimizer.reopen()?);
        let bad_step = self.step - later;
        self.step = self.step.saturating_sub(taken_back);
        if let Some(pending) = pending
            && let Some((step, loss, _)) = pending.before_last(later)
        {
            let value = loss.to_vec_f32()?[0];
            if !value.is_finite() {
                return Err(pending.non_finite(*step, value));
            }
            return Err(AetherError::NonFiniteStep { step: *step, later });
        }
        Err(AetherError::NonFiniteStep {
            step: bad_step,
            later,
        })
    }

    /// One optimizer step on a batch of host data; returns the loss and the
    /// correct count without reading them back.
    pub fn train_batch(&mut self, x: &[f32], y: &[u32]) -> Result<(Tensor, Tensor)> {
        let n = self.sample_count(x, Some(y))?;
        self.check_batch(n)?;
        let indices: Vec<usize> = (0..n).collect();
        let xb = self.batch_tensor(x, &indices)?;
        let yb = Tensor::from_u32(vec![n], y.to_vec(), &self.device)?;
        self.train_step(&xb, &yb)
    }

    /// One optimizer step on a batch already on the model's device (for example
    /// augmented there); returns the loss and the correct count unread. Labels
    /// on a GPU are not range-checked (that would read them back): a label
    /// past the last class matches no class there, so its sample trains
    /// toward label smoothing's uniform share alone. [`Model::train_batch`]
    /// and [`Model::train`] refuse such a label.
    pub fn train_tensors(&mut self, x: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
        self.check_batch(x.dims()[0])?;
        self.train_step(x, labels)
    }

    /// The mean loss on one batch of host data and the gradient of every
    /// trainable parameter (frozen layers' left out), named as in a model file (`layers.{i}.{name}`),
    /// without an optimizer step: for inspecting or checking gradients. The
    /// forward pass trains as a step's does (BatchNorm normalises by the
    /// batch's statistics and takes them into its running ones; dropout draws
    /// the next step's masks). Under a dynamic loss scale, gradients that
    /// overflow f16 at the scale are taken again at half of it (moving the
    /// running statistics again), as a training step would back off.
    pub fn gradients(&mut self, x: &[f32], y: &[u32]) -> Result<Gradients> {
        let n = self.sample_count(x, Some(y))?;
        self.check_batch(n)?;
        let indices: Vec<usize> = (0..n).collect();
        let xb = self.batch_tensor(x, &indices)?;
        let yb = Tensor::from_u32(vec![n], y.to_vec(), &self.device)?;
        let mode = Mode::Train {
            seed: self.seed,
            step: self.step as u32,
        };
        self.ensure_scaler()?;
        loop {
            let result = self.forward(&xb, mode).and_then(|out| {
                let (loss, _, grad) = self.loss_grad_and_correct(&out, &yb)?;
                self.backward(grad)?;
                // The gradients of the scaled loss, divided back exactly (S is
                // a power of two) into the loss's own.
                let inv_scale = match &self.scaler {
                    Some(scaler) => 1.0 / scaler.scale()?.0,
                    None => 1.0,
                };
                let mut named = Vec::new();
                let frozen = &self.frozen;
                for (i, layer) in self.layers.iter_mut().enumerate() {
                    if frozen.contains(&i) {
                        continue;
                    }
                    for t in layer.trainables() {
                        let grad = t.grad.to_vec_f32()?.iter().map(|g| g * inv_scale).collect();
                        named.push((format!("layers.{i}.{}", t.name), grad));
                    }
                }
                Ok(Gradients {
                    loss: loss.to_vec_f32()?[0],
                    tensors: named,
                })
            });
            for layer in &mut self.layers {
                layer.end_step();
            }
            // An output gradient that overflowed f16 at this scale was
            // clipped: the flag is taken (so the next step does not skip for
            // it) and, where the scale can back off, the gradients are taken
            // again at half of it, as the next step would be.
            let Some(scaler) = &mut self.scaler else {
                return result;
            };
            if result.is_err() || !scaler.take_overflow()? || !scaler.back_off()? {
                return result;
            }
        }
    }

    /// One optimizer step on a batch; returns the (GPU-resident) loss and correct count.
    fn train_step(&mut self, x: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
        // Before the forward pass moves any BatchNorm statistic.
        if self.loss.is_none() || self.optimizer.is_none() {
            return Err(model_err("call configure(loss, optimizer, metric) first"));
        }
        if let (Some(schedule), Some(optimizer)) = (&self.schedule, &mut self.optimizer) {
            optimizer.set_learning_rate(schedule.lr(self.step));
        }
        self.check_configuration()?;
        self.ensure_scaler()?;
        let mode = Mode::Train {
            seed: self.seed,
            step: self.step as u32,
        };
        let out = self.forward(x, mode)?;
        self.timing_scope(|| "loss".into());
        let (loss, correct, grad) = self.loss_grad_and_correct(&out, labels)?;
        self.backward(grad)?;
        self.timing_scope(|| "optimizer".into());
        let optimizer = self
            .optimizer
            .as_mut()
            .ok_or_else(|| model_err("call configure first"))?;
        let mut counts = Vec::with_capacity(self.layers.len());
        let mut trainables: Vec<Param> = Vec::new();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            if self.frozen.contains(&i) {
                counts.push(0);
                continue;
            }
            let kind = layer.spec().kind();
            let mut mine = layer.trainables();
            for p in &mut mine {
                for group in self.groups.iter().filter(|g| g.selects(i, kind, p.name)) {
                    group.apply(p);
                }
            }
            counts.push(mine.len());
            trainables.extend(mine);
        }
        if self.relayout {
            // The trained layers changed: each takes its own state back.
            let (state, average) = self.state_by_layer.give(&counts);
            optimizer.set_state(state)?;
            if self.lookahead.is_some() {
                optimizer.set_lookahead_state(average)?;
            }
            self.relayout = false;
        }
        optimizer.track_lookahead(self.lookahead.is_some());
        optimizer.step_scaled(&mut trainables, Some(&loss), self.scaler.as_mut())?;
        if let Some(lookahead) = self.lookahead
            && optimizer.steps() % lookahead.every == 0
        {
            optimizer.lookahead(&mut trainables, lookahead.decay)?;
        }
        drop(trainables);
        for layer in &mut self.layers {
            layer.params_updated();
            layer.commit_step(optimizer.gate())?;
        }
        // The next backward writes the gradients where the optimizer reads them,
        // and the next forward takes the f16 weights the optimizer wrote.
        let mut hand_out = |views: Option<&[Tensor]>, give: fn(&mut dyn Layer, Vec<Tensor>)| {
            let Some(mut views) = views else {
                return;
            };
            for (layer, &count) in self.layers.iter_mut().zip(&counts) {
                let (mine, rest) = views.split_at(count);
                if count > 0 {
                    give(layer.as_mut(), mine.to_vec());
                }
                views = rest;
            }
        };
        hand_out(optimizer.grad_outputs(), |l, v| l.set_grad_outputs(v));
        hand_out(optimizer.param_shadows(), |l, v| l.set_param_shadows(v));
        for layer in &mut self.layers {
            layer.end_step();
        }
        self.param_counts = counts;
        self.step += 1;
        Ok((loss, correct))
    }

    /// Names the kernels recorded next in a [`crate::gpu::GpuContext::timed`]
    /// profile; free when no profile is running.
    fn timing_scope(&self, name: impl FnOnce() -> String) {
        if let Some(ctx) = self.device.gpu_context() {
            ctx.timing_scope(name);
        }
    }

    /// For every layer on the conv kernels: its index and the launch plans
    /// (direction, shape, variant) it has used so far.
    pub fn conv_plans(&self) -> Vec<(usize, Vec<PlannedLaunch>)> {
        self.layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.conv_plans().map(|p| (i, p.summary())))
            .collect()
    }

    /// The architecture of layer `index`, if there is one.
    pub fn layer_spec(&self, index: usize) -> Option<LayerSpec> {
        self.layers.get(index).map(|l| l.spec())
    }

    /// An error, before any step, where the epoch's last batch of `n`
    /// samples in batches of `batch_size` would leave a BatchNorm layer one
    /// value per channel (a dense one after a single sample), whose unbiased
    /// variance is undefined: the step would fail at the end of the epoch.
    fn check_last_batch(&self, n: usize, batch_size: usize) -> Result<()> {
        let last = match n % batch_size {
            0 => batch_size.min(n),
            rest => rest,
        };
        match self.starved_batchnorm(last)? {
            Some((i, values)) => Err(model_err(format!(
                "{n} samples in batches of {batch_size} end in a batch of {last}, which gives \
                 layer {i} (BatchNorm) {values} value(s) per channel; it needs at least 2 \
                 (choose another batch size, or drop the odd sample)"
            ))),
            None => Ok(()),
        }
    }

    /// An error, before the step changes anything (BatchNorm's running
    /// statistics included), where one batch of `batch` samples would give a
    /// BatchNorm layer one value per channel.
    fn check_batch(&self, batch: usize) -> Result<()> {
        self.check_training_batch(batch)?;
        match self.starved_batchnorm(batch)? {
            Some((i, values)) => Err(model_err(format!(
                "a batch of {batch} gives layer {i} (BatchNorm) {values} value(s) per channel; \
                 it needs at least 2"
            ))),
            None => Ok(()),
        }
    }

    /// The first BatchNorm layer, and its values per channel, that a batch of
    /// `batch` samples gives fewer than 2.
    fn starved_batchnorm(&self, batch: usize) -> Result<Option<(usize, usize)>> {
        let input = self.input_shape()?;
        for (i, layer) in self.layers.iter().enumerate() {
            if !matches!(layer.spec(), LayerSpec::BatchNorm { .. }) {
                continue;
            }
            let shape = match self.inputs[i][0] {
                NodeId::Input => input,
                NodeId::Layer(j) => &self.output_shapes[j],
            };
            let per_sample: usize = shape[..shape.len().saturating_sub(1)].iter().product();
            if batch * per_sample < 2 {
                return Ok(Some((i, batch * per_sample)));
            }
        }
        Ok(None)
    }

    /// Hands one batch to [`TrainOptions::on_batch`] and takes back what it
    /// left there, checked: the same shapes on the model's device, so a hook
    /// that swaps in a wrong tensor gets an error naming it, not a step on it.
    fn run_batch_hook(
        &mut self,
        hook: &BatchHook<'_>,
        inputs: Tensor,
        labels: Tensor,
        rows: &[usize],
        batch: usize,
        batches: usize,
    ) -> Result<(Tensor, Tensor)> {
        let (input_dims, label_dims) = (inputs.dims().to_vec(), labels.dims().to_vec());
        let optimizer = self
            .optimizer
            .as_mut()
            .ok_or_else(|| model_err("call configure(loss, optimizer, metric) first"))?;
        let mut context = BatchContext {
            epoch: self.epochs_done,
            step: self.step,
            batch,
            batches,
            seed: self.seed,
            rows,
            inputs,
            labels,
            optimizer,
            layers: &self.layers,
        };
        hook(&mut context)?;
        let BatchContext { inputs, labels, .. } = context;
        for (what, tensor, dims, dtypes) in [
            (
                "inputs",
                &inputs,
                &input_dims,
                &[DType::F32, DType::F16][..],
            ),
            ("labels", &labels, &label_dims, &[DType::U32][..]),
        ] {
            let problem = if tensor.dims() != dims.as_slice() {
                Some(format!(
                    "shape {:?}, the batch's is {dims:?}",
                    tensor.dims()
                ))
            } else if !dtypes.contains(&tensor.dtype()) {
                Some(format!(
                    "dtype {:?}, expected one of {dtypes:?}",
                    tensor.dtype()
                ))
            } else if !tensor.device().same_as(&self.device) {
                Some(format!(
                    "device {}, the model is on {}",
                    tensor.device().name(),
                    self.device.name()
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(model_err(format!(
                    "the on_batch hook left {what} of {problem} (epoch {}, batch {batch})",
                    self.epochs_done
                )));
            }
        }
        Ok((inputs, labels))
    }

    /// Trains on flat host data `x` (samples of the input shape) with class labels `y`.
    pub fn train(&mut self, x: &[f32], y: &[u32], options: &TrainOptions) -> Result<History> {
        let n = self.sample_count(x, Some(y))?;
        // Checked before the first epoch, not after it.
        if let Some((vx, vy)) = options.validation {
            self.sample_count(vx, Some(vy))?;
        }
        if options.batch_size == 0 || options.epochs == 0 {
            return Err(model_err("batch_size and epochs must be at least 1"));
        }
        self.check_last_batch(n, options.batch_size)?;
        if options
            .checkpoint
            .as_ref()
            .is_some_and(|c| c.every_epochs == 0)
        {
            return Err(model_err("checkpoint every_epochs must be at least 1"));
        }
        self.check_training_batch(options.batch_size.min(n))?;
        // Each epoch shuffles the order the one before left: the epochs
        // completed before this call (a resumed checkpoint's) are replayed,
        // so training on shuffles as if it had never stopped.
        let seed = self.seed;
        let epoch_seed =
            move |number: usize| seed ^ (number as u64).wrapping_mul(0xd134_2543_de82_ef95);
        let mut order: Vec<usize> = (0..n).collect();
        if options.shuffle {
            for number in 0..self.epochs_done {
                shuffle(&mut order, epoch_seed(number));
            }
        }
        let mut history = History::default();
        for epoch in 0..options.epochs {
            if options.shuffle {
                shuffle(&mut order, epoch_seed(self.epochs_done));
            }
            let start = Instant::now();
            let steps = n.div_ceil(options.batch_size);
            let bar = options
                .progress
                .then(|| Progress::epoch(epoch, options.epochs, steps));
            let mut pending = PendingLosses::new(epoch, steps);
            for (s, chunk) in order.chunks(options.batch_size).enumerate() {
                let mut xb = self.batch_tensor(x, chunk)?;
                let labels: Vec<u32> = chunk.iter().map(|&i| y[i]).collect();
                let mut yb = Tensor::from_u32(vec![chunk.len()], labels, &self.device)?;
                if let Some(hook) = options.on_batch {
                    (xb, yb) = self.run_batch_hook(hook, xb, yb, chunk, s, steps)?;
                }
                let (loss, correct) = self.train_step(&xb, &yb)?;
                pending.push(self.step, loss.clone(), correct.clone());
                if (s + 1) % options.log_every.max(1) == 0 || s + 1 == steps {
                    self.check_skipped(Some(&pending))?;
                    let value = pending.logged(self.step, &loss)?;
                    if let Some(bar) = &bar {
                        let rate = (s + 1) as f64 / start.elapsed().as_secs_f64();
                        let accuracy = f64::from(correct.to_vec_u32()?[0]) / chunk.len() as f64;
                        bar.set_message(format!(
                            "loss {value:.4}  acc {accuracy:.4}  {rate:.1} steps/s"
                        ));
                    }
                }
                if let Some(bar) = &bar {
                    bar.inc(1);
                }
            }
            self.check_skipped(Some(&pending))?;
            let (loss_sum, correct_sum) = pending.totals()?;
            let train_seconds = start.elapsed().as_secs_f64();
            let reg = self.regularization_loss()?.unwrap_or(0.0);
            let validation = match options.validation {
                Some((vx, vy)) => Some(self.evaluate(vx, vy, options.batch_size)?),
                None => None,
            };
            let stats = EpochStats {
                loss: (loss_sum / steps as f64) as f32 + reg,
                accuracy: correct_sum as f32 / n as f32,
                validation,
                seconds: start.elapsed().as_secs_f64(),
                train_seconds,
                steps,
            };
            if let Some(bar) = bar {
                bar.finish_with_message(format!(
                    "loss {:.4}  acc {:.4}{}",
                    stats.loss,
                    stats.accuracy,
                    stats
                        .validation
                        .map(|(l, a)| format!("  val loss {l:.4}  val acc {a:.4}"))
                        .unwrap_or_default()
                ));
            }
            self.epochs_done += 1;
            if let Some(hook) = options.on_epoch {
                hook(epoch, &stats)?;
            }
            history.epochs.push(stats);
            if let Some(checkpoint) = &options.checkpoint
                && (epoch + 1).is_multiple_of(checkpoint.every_epochs)
            {
                self.save(&checkpoint.path)?;
            }
        }
        Ok(history)
    }

    /// Mean loss and accuracy over `(x, y)` in inference mode.
    pub fn evaluate(&mut self, x: &[f32], y: &[u32], batch_size: usize) -> Result<(f32, f32)> {
        let n = self.sample_count(x, Some(y))?;
        let indices: Vec<usize> = (0..n).collect();
        let mut pending = Vec::new();
        for chunk in indices.chunks(self.inference_batch(batch_size)?) {
            let xb = self.batch_tensor(x, chunk)?;
            let labels: Vec<u32> = chunk.iter().map(|&i| y[i]).collect();
            let yb = Tensor::from_u32(vec![chunk.len()], labels, &self.device)?;
            let out = self.forward(&xb, Mode::Infer)?;
            let (loss, correct, _) = self.loss_grad_and_correct(&out, &yb)?;
            pending.push((loss, correct, chunk.len()));
        }
        let (mut loss_sum, mut correct) = (0.0f64, 0u64);
        for (loss, c, len) in pending {
            loss_sum += f64::from(loss.to_vec_f32()?[0]) * len as f64;
            correct += u64::from(c.to_vec_u32()?[0]);
        }
        Ok(((loss_sum / n as f64) as f32, correct as f32 / n as f32))
    }

    /// Class probabilities (`[n, classes]` flattened) or, with `logits`, the raw
    /// outputs of the last layer.
    pub fn predict(&mut self, x: &[f32], batch_size: usize, logits: bool) -> Result<Vec<f32>> {
        let mut values = Vec::new();
        self.predict_into(x, batch_size, logits, &mut values)?;
        Ok(values)
    }

    /// [`Model::predict`] into `out`, which is cleared and whose memory is
    /// reused: for an app that predicts again and again (one image a frame).
    /// After the first call on a shape, no GPU buffer, pipeline or bind group
    /// is created (aether's pool and caches serve them); see docs/inference.md.
    pub fn predict_into(
        &mut self,
        x: &[f32],
        batch_size: usize,
        logits: bool,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        out.clear();
        let n = self.sample_count(x, None)?;
        let indices: Vec<usize> = (0..n).collect();
        let apply_softmax = !logits
            && matches!(self.loss, Some(Loss::SoftmaxCrossEntropy { .. }) | None)
            && self
                .layers
                .last()
                .is_some_and(|l| l.spec() != LayerSpec::Softmax);
        let mut outputs = Vec::new();
        for chunk in indices.chunks(self.inference_batch(batch_size)?) {
            let xb = self.batch_tensor(x, chunk)?;
            let out = self.forward(&xb, Mode::Infer)?;
            outputs.push(if apply_softmax { softmax(&out)? } else { out });
        }
        for output in outputs {
            output.read_f32_into(out)?;
        }
        Ok(())
    }

    /// The largest per-sample tensor the model makes (its input or a layer's
    /// output), as `(layer index or None for the input, shape, values)`.
    fn largest_activation(&self) -> Result<(Option<usize>, &[usize], usize)> {
        let input = (
            None,
            self.input_shape()?,
            self.input_shape()?.iter().product(),
        );
        Ok(self
            .output_shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (Some(i), s.as_slice(), s.iter().product()))
            .fold(
                input,
                |best, next| if next.2 > best.2 { next } else { best },
            ))
    }

    /// The most bytes one activation tensor may take: on a GPU, one buffer
    /// (`max_storage_buffer_binding_size` and `max_buffer_size`); on the CPU,
    /// [`Model::cpu_tensor_limit`].
    fn tensor_limit(&self) -> u64 {
        match &self.device {
            Device::Gpu(ctx) => ctx.caps().max_tensor_bytes(),
            Device::Cpu => self.cpu_tensor_bytes,
        }
    }

    /// The most samples whose activations (f32 values) fit
    /// [`Model::tensor_limit`]: checked before any layer allocates, so a
    /// model whose geometry blows an activation up is refused, not run.
    fn samples_per_buffer(&self) -> Result<usize> {
        let (_, _, values) = self.largest_activation()?;
        Ok((self.tensor_limit() / (values as u64 * 4)) as usize)
    }

    /// A `TooLarge` error for `samples` samples of the largest activation.
    fn batch_too_large(&self, samples: usize, context: &str) -> Result<AetherError> {
        let (layer, shape, values) = self.largest_activation()?;
        let tensor = match layer {
            None => "the input".to_owned(),
            Some(i) => format!("the output of layer {i} ({:?})", self.layers[i].spec()),
        };
        Ok(AetherError::TooLarge {
            what: format!(
                "{context}: {tensor}, {samples} x {shape:?} f32 ({} samples fit one {})",
                self.samples_per_buffer()?,
                match self.device {
                    Device::Gpu(_) => "GPU buffer",
                    Device::Cpu => "CPU tensor (Model::cpu_tensor_limit)",
                }
            ),
            bytes: samples as u64 * values as u64 * 4,
            limit: self.tensor_limit(),
        })
    }

    /// The chunk size for inference over batches of `requested` samples: as
    /// asked, or smaller so that every activation fits one GPU buffer. Samples
    /// are independent in inference, so the split changes no result.
    fn inference_batch(&self, requested: usize) -> Result<usize> {
        let requested = requested.max(1);
        match self.samples_per_buffer()? {
            0 => Err(self.batch_too_large(1, "inference on one sample")?),
            fit => Ok(requested.min(fit)),
        }
    }

    /// Refuses a training batch whose activations do not fit one tensor:
    /// splitting it would change the BatchNorm statistics and the gradient.
    fn check_training_batch(&self, batch: usize) -> Result<()> {
        match self.samples_per_buffer()? {
            fit if batch > fit => {
                Err(self.batch_too_large(batch, "training batch (reduce batch_size)")?)
            }
            _ => Ok(()),
        }
    }

    fn architecture(&self) -> Result<Architecture> {
        let format = if graph::is_stack(&self.inputs) {
            FORMAT
        } else {
            GRAPH_FORMAT
        };
        Ok(Architecture {
            format: format.into(),
            input_shape: self.input_shape()?.to_vec(),
            layers: self.layers.iter().map(|l| l.spec()).collect(),
            inputs: (!graph::is_stack(&self.inputs)).then(|| self.inputs.clone()),
            loss: self.loss,
        })
    }

    /// Writes the architecture (JSON metadata) and every tensor (safetensors) to
    /// one file, atomically: a crash never leaves a half-written model.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let arch =
            serde_json::to_string(&self.architecture()?).map_err(|e| model_err(e.to_string()))?;
        let mut tensors: Vec<TensorBytes> = Vec::new();
        let training = match self.training_state()? {
            Some((training, optimizer)) => {
                tensors.extend(optimizer);
                Some(training)
            }
            None => None,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let state = layer.state();
            // A layer of one's own naming two tensors alike would collide in
            // the file: refused, not written (nor a panic in safetensors).
            if let Some((name, _)) = state
                .iter()
                .enumerate()
                .find(|(k, (name, _))| state[..*k].iter().any(|(other, _)| other == name))
                .map(|(_, entry)| entry)
            {
                return Err(model_err(format!(
                    "layer {i} ({}) names two state tensors {name:?}: each needs its own name",
                    layer.spec().kind()
                )));
            }
            for (name, t) in state {
                let bytes: Vec<u8> = bytemuck::cast_slice(&t.to_vec_f32()?).to_vec();
                tensors.push((format!("layers.{i}.{name}"), t.dims().to_vec(), bytes));
            }
        }
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(name, shape, bytes)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| model_err(format!("tensor {name}: {e}")))
            })
            .collect::<Result<_>>()?;
        let mut metadata = HashMap::from([(METADATA_KEY.to_owned(), arch)]);
        if let Some(training) = &training {
            let json = serde_json::to_string(training).map_err(|e| model_err(e.to_string()))?;
            metadata.insert(TRAINING_KEY.to_owned(), json);
        }
        let bytes =
            safetensors::serialize(views, Some(metadata)).map_err(|e| model_err(e.to_string()))?;
        crate::io::write_atomic(path, &bytes)
    }

    /// Where training stands and the optimizer's moments as tensors, once
    /// the optimizer has taken a step (or was resumed): what [`Model::save`]
    /// adds so that [`Model::resume`] can continue exactly.
    fn training_state(&self) -> Result<Option<(TrainingState, Vec<TensorBytes>)>> {
        let Some(optimizer) = &self.optimizer else {
            return Ok(None);
        };
        let Some(mut state) = optimizer.state()? else {
            return Ok(None);
        };
        // Steps skipped for a non-finite loss or gradient (not yet reported)
        // changed nothing: the state is the one from before the first of them.
        let mut step = self.step;
        if let Some(first) = optimizer.skipped_step()? {
            step -= u64::from(state.steps - (first - 1));
            state.steps = first - 1;
        }
        let (beta1, beta2, epsilon, weight_decay, sgd) = match optimizer {
            Optimizer::Adam(a) => (a.beta1, a.beta2, a.epsilon, a.weight_decay, None),
            Optimizer::Sgd(s) => {
                let settings = SgdSettings {
                    momentum: s.momentum,
                    nesterov: s.nesterov,
                };
                (0.0, 0.0, 0.0, s.weight_decay, Some(settings))
            }
        };
        let training = TrainingState {
            seed: self.seed,
            step,
            epochs_done: self.epochs_done,
            learning_rate: optimizer.learning_rate(),
            beta1,
            beta2,
            epsilon,
            weight_decay,
            adam_steps: state.steps,
            sgd,
            loss_scale: self.loss_scale()?,
        };
        let mut tensors = Vec::new();
        let lookahead = optimizer.lookahead_state()?;
        let buffers = state
            .buffers
            .iter()
            .map(|(name, b)| (name.as_str(), b))
            .chain(lookahead.as_ref().map(|b| ("lookahead", b)));
        for (which, buffer) in buffers {
            for (k, values) in buffer.iter().enumerate() {
                let bytes: Vec<u8> = bytemuck::cast_slice(values).to_vec();
                tensors.push((format!("optimizer.{which}.{k}"), vec![values.len()], bytes));
            }
        }
        Ok(Some((training, tensors)))
    }

    /// A model and its optimizer rebuilt from a checkpoint written by
    /// [`Model::save`] after training (a [`Checkpoint`] of
    /// [`Model::train`]), on `device`: weights, BatchNorm statistics, the
    /// optimizer's hyperparameters, moments and step count, the model's seed,
    /// step and completed epochs. Training on gives the same bits as if it
    /// had never stopped. A file without that state (saved before any step,
    /// or by an older aether) is a `ModelFile` error: [`Model::load`] reads
    /// its weights.
    pub fn resume(path: impl AsRef<Path>, device: &Device) -> Result<Self> {
        let path = path.as_ref();
        let bytes = read_file(path)?;
        let (arch, file) = parse(path, &bytes)?;
        let json = metadata_value(&bytes, TRAINING_KEY).ok_or_else(|| {
            file_err(
                path,
                format!("no {TRAINING_KEY} metadata: no optimizer state to resume from (Model::load reads the weights)"),
            )
        })?;
        let training: TrainingState = serde_json::from_str(&json)
            .map_err(|e| file_err(path, format!("malformed {TRAINING_KEY} ({e})")))?;
        let mut model = Self::build(path, &arch, &file, device, training.seed)?;
        model.step = training.step;
        model.epochs_done = training.epochs_done;
        let mut optimizer: Optimizer = match &training.sgd {
            Some(sgd) => Sgd::new(training.learning_rate)
                .momentum(sgd.momentum)
                .nesterov(sgd.nesterov)
                .weight_decay(training.weight_decay)
                .into(),
            None => {
                let mut adam = Adam::new(training.learning_rate);
                adam.beta1 = training.beta1;
                adam.beta2 = training.beta2;
                adam.epsilon = training.epsilon;
                adam.weight_decay = training.weight_decay;
                adam.into()
            }
        };
        optimizer
            .validate()
            .map_err(|e| file_err(path, format!("optimizer: {e}")))?;
        let buffer = |which: &str| -> Result<Vec<Vec<f32>>> {
            let mut out = Vec::new();
            while let Ok(view) = file.tensor(&format!("optimizer.{which}.{}", out.len())) {
                if view.dtype() != safetensors::Dtype::F32 || view.shape().len() != 1 {
                    return Err(file_err(
                        path,
                        format!(
                            "tensor optimizer.{which}.{} is not a 1-D F32 tensor",
                            out.len()
                        ),
                    ));
                }
                out.push(bytemuck::pod_collect_to_vec(view.data()));
            }
            Ok(out)
        };
        let state = OptimizerState {
            steps: training.adam_steps,
            buffers: optimizer
                .buffer_names()
                .iter()
                .map(|&name| Ok((name.to_owned(), buffer(name)?)))
                .collect::<Result<_>>()?,
        };
        optimizer
            .set_state(state)
            .map_err(|e| file_err(path, format!("optimizer state: {e}")))?;
        let average = buffer("lookahead")?;
        if !average.is_empty() {
            optimizer
                .set_lookahead_state(average)
                .map_err(|e| file_err(path, format!("lookahead average: {e}")))?;
        }
        model.optimizer = Some(optimizer);
        if let Some((scale, good)) = training.loss_scale {
            LossScale::Static(scale)
                .validate()
                .map_err(|e| file_err(path, format!("loss scale: {e}")))?;
            model.restored_scale = Some((scale, good));
        }
        Ok(model)
    }

    /// A model rebuilt from a file written by [`Model::save`], on `device`.
    pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Self> {
        let path = path.as_ref();
        Self::from_bytes(path, &read_file(path)?, device)
    }

    /// A model rebuilt from the contents `bytes` of a model file, on `device`;
    /// `path` only names the file in errors. Any malformed input is an
    /// [`AetherError::ModelFile`] (or an error naming the layer that does not build).
    pub fn from_bytes(path: impl AsRef<Path>, bytes: &[u8], device: &Device) -> Result<Self> {
        let path = path.as_ref();
        let (arch, file) = parse(path, bytes)?;
        Self::build(path, &arch, &file, device, 0)
    }

    /// The model of a parsed file, seeded `seed`, on `device`.
    fn build(
        path: &Path,
        arch: &Architecture,
        file: &safetensors::SafeTensors,
        device: &Device,
        seed: u64,
    ) -> Result<Self> {
        let mut model = Model::new().seed(seed);
        model.device = device.clone();
        model.loss = arch.loss;
        for (i, spec) in arch.layers.iter().enumerate() {
            let layer = spec
                .instantiate()
                .map_err(|e| file_err(path, format!("layer {i}: {e}")))?;
            model.layers.push(layer);
        }
        model.inputs = match &arch.inputs {
            Some(inputs) if inputs.len() == arch.layers.len() => inputs.clone(),
            Some(inputs) => {
                return Err(file_err(
                    path,
                    format!(
                        "inputs for {} layers, but {} layers",
                        inputs.len(),
                        arch.layers.len()
                    ),
                ));
            }
            None => (0..arch.layers.len()).map(graph::stacked).collect(),
        };
        // Tensor values the file holds (4 bytes each): no layer may allocate
        // more than that, whatever its architecture declares.
        let held = file
            .tensors()
            .iter()
            .filter(|(name, _)| name.starts_with("layers."))
            .map(|(_, view)| view.data().len() / 4)
            .sum();
        model
            .finalize_within(&arch.input_shape, Some(held))
            .map_err(|e| file_err(path, format!("architecture does not build: {e}")))?;
        model.load_tensors(path, file)?;
        Ok(model)
    }

    /// Replaces this model's tensors with those of a file of the same architecture.
    pub fn load_weights(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = read_file(path)?;
        let (arch, file) = parse(path, &bytes)?;
        let mine = self.architecture()?;
        if arch.layers != mine.layers
            || arch.input_shape != mine.input_shape
            || arch.inputs != mine.inputs
        {
            return Err(file_err(
                path,
                format!(
                    "another architecture: file has input {:?} and layers {:?}, model has input {:?} and layers {:?}",
                    arch.input_shape, arch.layers, mine.input_shape, mine.layers
                ),
            ));
        }
        self.load_tensors(path, &file)
    }

    /// Every tensor [`Model::save`] writes (parameters and statistics), named
    /// as in the file (`layers.{i}.{name}`), on the model's device.
    pub fn tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.input_shape()?;
        Ok(named_tensors(&self.layers))
    }

    /// Replaces the named tensors (as [`Model::tensors`] names them) with
    /// `values` of the same element count: an initialisation of one's own,
    /// or weights from elsewhere. Every name and size is checked before any
    /// tensor is replaced, so an error leaves the model as it was. The
    /// optimizer keeps its moments.
    pub fn set_tensors(&mut self, values: &[(String, Vec<f32>)]) -> Result<()> {
        self.input_shape()?;
        let mut replaced: Vec<(usize, &'static str, Tensor)> = Vec::with_capacity(values.len());
        for (i, layer) in self.layers.iter().enumerate() {
            for (name, current) in layer.state() {
                let key = format!("layers.{i}.{name}");
                let Some((_, data)) = values.iter().find(|(n, _)| *n == key) else {
                    continue;
                };
                if data.len() != current.numel() {
                    return Err(model_err(format!(
                        "tensor {key} holds {} values ({:?}), given {}",
                        current.numel(),
                        current.dims(),
                        data.len()
                    )));
                }
                if let Some(reason) = invalid_state_values(&key, name, data) {
                    return Err(model_err(reason));
                }
                let t = Tensor::from_f32(current.dims().to_vec(), data.clone(), &self.device)?;
                replaced.push((i, name, t));
            }
        }
        if replaced.len() < values.len() {
            let names: Vec<String> = self.tensors()?.into_iter().map(|(n, _)| n).collect();
            if let Some((name, _)) = values.iter().find(|(n, _)| !names.contains(n)) {
                return Err(model_err(format!(
                    "no tensor {name:?}; the model's are {names:?}"
                )));
            }
            let twice = values
                .iter()
                .enumerate()
                .find(|(k, (n, _))| values[..*k].iter().any(|(m, _)| m == n));
            if let Some((_, (name, _))) = twice {
                return Err(model_err(format!("tensor {name:?} is given twice")));
            }
        }
        for (layer, name, t) in replaced {
            self.layers[layer].set_state(name, t)?;
        }
        Ok(())
    }

    /// Checks every tensor against the built model before replacing any, so a
    /// bad file leaves the model as it was.
    fn load_tensors(&mut self, path: &Path, file: &safetensors::SafeTensors) -> Result<()> {
        let mut loaded: Vec<(usize, &'static str, Tensor)> = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (name, current) in layer.state() {
                let key = format!("layers.{i}.{name}");
                let view = file
                    .tensor(&key)
                    .map_err(|_| file_err(path, format!("tensor {key} is missing")))?;
                if view.dtype() != safetensors::Dtype::F32 || view.shape() != current.dims() {
                    return Err(file_err(
                        path,
                        format!(
                            "tensor {key} is {:?} {:?}, expected F32 {:?}",
                            view.dtype(),
                            view.shape(),
                            current.dims()
                        ),
                    ));
                }
                let values: Vec<f32> = bytemuck::pod_collect_to_vec(view.data());
                if let Some(reason) = invalid_state_values(&key, name, &values) {
                    return Err(file_err(path, reason));
                }
                loaded.push((
                    i,
                    name,
                    Tensor::from_f32(current.dims().to_vec(), values, &self.device)?,
                ));
            }
        }
        for (i, name, t) in loaded {
            self.layers[i].set_state(name, t)?;
        }
        Ok(())
    }
}

/// Why `values` cannot be tensor `key` (state `name` of its layer) of a
/// trained model, if they cannot: a value not finite, a negative running
/// variance. Files and [`Model::set_tensors`] are held to it alike.
fn invalid_state_values(key: &str, name: &str, values: &[f32]) -> Option<String> {
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Some(format!(
            "tensor {key} holds {} at index {i}, not a finite value",
            values[i]
        ));
    }
    if name == "running_var"
        && let Some(i) = values.iter().position(|&v| v < 0.0)
    {
        return Some(format!(
            "tensor {key} holds the negative variance {} at index {i}",
            values[i]
        ));
    }
    None
}

fn file_err(path: &Path, reason: String) -> AetherError {
    AetherError::ModelFile {
        path: path.to_owned(),
        reason,
    }
}

/// A tensor as `save` writes it: name, shape, little-endian f32 bytes.
type TensorBytes = (String, Vec<usize>, Vec<u8>);

/// The value of metadata `key` in the header of a model file's `bytes`.
fn metadata_value(bytes: &[u8], key: &str) -> Option<String> {
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).ok()?;
    meta.metadata().as_ref()?.get(key).cloned()
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    crate::io::read_regular(path, crate::io::MAX_MODEL_FILE_BYTES).map_err(|source| {
        AetherError::Io {
            action: "read model",
            path: path.to_owned(),
            source,
        }
    })
}

fn parse<'b>(path: &Path, bytes: &'b [u8]) -> Result<(Architecture, safetensors::SafeTensors<'b>)> {
    let file = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| file_err(path, format!("not a complete safetensors file ({e})")))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| file_err(path, format!("unreadable header ({e})")))?;
    if let Some(key) = crate::io::duplicate_header_key(bytes) {
        return Err(file_err(
            path,
            format!("key {key:?} appears twice in the header (which one counts is ambiguous)"),
        ));
    }
    let json = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get(METADATA_KEY))
        .ok_or_else(|| {
            file_err(
                path,
                format!("no {METADATA_KEY} metadata: not an aether model"),
            )
        })?;
    let arch: Architecture = serde_json::from_str(json)
        .map_err(|e| file_err(path, format!("malformed architecture ({e})")))?;
    match (arch.format.as_str(), &arch.inputs) {
        (FORMAT, None) | (GRAPH_FORMAT, Some(_)) => {}
        (FORMAT, Some(_)) => {
            return Err(file_err(path, format!("a {FORMAT} file with graph inputs")));
        }
        (GRAPH_FORMAT, None) => {
            return Err(file_err(
                path,
                format!("a {GRAPH_FORMAT} file without inputs"),
            ));
        }
        (other, _) => {
            return Err(file_err(
                path,
                format!("format {other:?}, expected {FORMAT:?} or {GRAPH_FORMAT:?}"),
            ));
        }
    }
    Ok((arch, file))
}

/// Every layer's state tensors, named `layers.{i}.{name}` as in a model file.
fn named_tensors(layers: &[Box<dyn Layer>]) -> Vec<(String, Tensor)> {
    layers
        .iter()
        .enumerate()
        .flat_map(|(i, layer)| {
            layer
                .state()
                .into_iter()
                .map(move |(name, t)| (format!("layers.{i}.{name}"), t.clone()))
        })
        .collect()
}

/// Fisher-Yates with SplitMix64: the same order for the same seed on every machine.
fn shuffle(order: &mut [usize], seed: u64) {
    let mut state = seed;
    for i in (1..order.len()).rev() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let j = ((z ^ (z >> 31)) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
}

/// The seed layer `i` of a model seeded `seed` is built with (weights, dropout
/// masks).
fn layer_seed(seed: u64, i: usize) -> u64 {
    seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}
