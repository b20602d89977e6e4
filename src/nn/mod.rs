//! Layers: the `Layer` trait, the serialisable `LayerSpec` that describes each
//! layer's architecture, and the layers themselves (NHWC, both devices).

mod activation;
mod conv;
mod custom;
mod dropout;
mod init;
mod merge;
mod norm;
mod pool;
mod reshape;

pub use activation::{GELU, Identity, LeakyReLU, ReLU, Scale, SiLU, Softmax};
pub use conv::{Conv2d, Dense};
pub use custom::{LayerFactory, register_layer};
pub use dropout::{Dropout, SpatialDropout};
pub use merge::{Add, Concat};
pub use norm::BatchNorm;
pub use pool::{AvgPool2d, GlobalAvgPool, GlobalMaxPool, MaxPool2d};
pub use reshape::Flatten;

use serde::{Deserialize, Serialize};

use crate::conv::{ConvPlans, ConvWork, Padding};
use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::gpu::GpuContext;
use crate::ops::activation::Activation;
use crate::tensor::{DType, Tensor};

/// Whether a forward pass trains (batch statistics, dropout) or infers.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// `seed` and `step` key the dropout masks, so a run is reproducible.
    Train {
        seed: u64,
        step: u32,
    },
    Infer,
}

/// A trainable tensor and its gradient, as a layer hands it to the optimizer.
pub use crate::optim::Param;

/// The architecture of one layer: what `save` writes and `load` rebuilds from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum LayerSpec {
    Conv2d {
        filters: usize,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: Padding,
        l1: f32,
        l2: f32,
        bias_l1: f32,
        bias_l2: f32,
        /// Absent from files of layers with a bias (all before it existed).
        #[serde(default = "with_bias", skip_serializing_if = "Clone::clone")]
        bias: bool,
    },
    Dense {
        units: usize,
        l1: f32,
        l2: f32,
        bias_l1: f32,
        bias_l2: f32,
        #[serde(default = "with_bias", skip_serializing_if = "Clone::clone")]
        bias: bool,
    },
    Flatten,
    BatchNorm {
        momentum: f32,
        epsilon: f32,
        /// Absent from files of layers with a trainable scale.
        #[serde(default = "with_bias", skip_serializing_if = "Clone::clone")]
        scale: bool,
    },
    MaxPool2d {
        pool: (usize, usize),
        stride: (usize, usize),
        padding: Padding,
    },
    AvgPool2d {
        pool: (usize, usize),
        stride: (usize, usize),
        padding: Padding,
    },
    GlobalAvgPool,
    GlobalMaxPool,
    Dropout {
        rate: f32,
    },
    SpatialDropout {
        rate: f32,
    },
    ReLU,
    LeakyReLU {
        alpha: f32,
    },
    Softmax,
    GELU,
    SiLU,
    Identity,
    Scale {
        factor: f32,
    },
    Add,
    Concat,
    /// A layer type of the application's own, registered under `name` with
    /// [`register_layer`]; `config` is whatever it needs to be rebuilt.
    Custom {
        name: String,
        config: serde_json::Value,
    },
}

/// A serde default: files written before a layer could leave out its bias
/// (or scale) have one.
fn with_bias() -> bool {
    true
}

impl LayerSpec {
    /// Whether the layer may have parameters to train: the model runs the
    /// backward of a layer without, and of everything before it, only where
    /// a layer before it trains. True for every custom layer.
    pub fn has_params(&self) -> bool {
        matches!(
            self,
            Self::Conv2d { .. } | Self::Dense { .. } | Self::BatchNorm { .. } | Self::Custom { .. }
        )
    }

    /// The layer type's name, as in the saved architecture.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Conv2d { .. } => "Conv2d",
            Self::Dense { .. } => "Dense",
            Self::Flatten => "Flatten",
            Self::BatchNorm { .. } => "BatchNorm",
            Self::MaxPool2d { .. } => "MaxPool2d",
            Self::AvgPool2d { .. } => "AvgPool2d",
            Self::GlobalAvgPool => "GlobalAvgPool",
            Self::GlobalMaxPool => "GlobalMaxPool",
            Self::Dropout { .. } => "Dropout",
            Self::SpatialDropout { .. } => "SpatialDropout",
            Self::ReLU => "ReLU",
            Self::LeakyReLU { .. } => "LeakyReLU",
            Self::Softmax => "Softmax",
            Self::GELU => "GELU",
            Self::SiLU => "SiLU",
            Self::Identity => "Identity",
            Self::Scale { .. } => "Scale",
            Self::Add => "Add",
            Self::Concat => "Concat",
            Self::Custom { .. } => "Custom",
        }
    }

    /// A fresh, unbuilt layer with this architecture; for a
    /// [`LayerSpec::Custom`] one, made by its registered factory (an error
    /// where none is registered).
    pub fn instantiate(&self) -> Result<Box<dyn Layer>> {
        if let Self::Custom { name, config } = self {
            return custom::instantiate_custom(name, config);
        }
        Ok(match *self {
            Self::Conv2d {
                filters,
                kernel,
                stride,
                padding,
                l1,
                l2,
                bias_l1,
                bias_l2,
                bias,
            } => Box::new(
                Conv2d::new(filters, kernel, padding)
                    .stride(stride)
                    .regularize(l1, l2, bias_l1, bias_l2)
                    .bias(bias),
            ),
            Self::Dense {
                units,
                l1,
                l2,
                bias_l1,
                bias_l2,
                bias,
            } => Box::new(
                Dense::new(units)
                    .regularize(l1, l2, bias_l1, bias_l2)
                    .bias(bias),
            ),
            Self::Flatten => Box::new(Flatten::default()),
            Self::BatchNorm {
                momentum,
                epsilon,
                scale,
            } => Box::new(BatchNorm::new(momentum, epsilon).scale(scale)),
            Self::MaxPool2d {
                pool,
                stride,
                padding,
            } => Box::new(MaxPool2d::new(pool, stride, padding)),
            Self::AvgPool2d {
                pool,
                stride,
                padding,
            } => Box::new(AvgPool2d::new(pool, stride, padding)),
            Self::GlobalAvgPool => Box::new(GlobalAvgPool::default()),
            Self::GlobalMaxPool => Box::new(GlobalMaxPool::default()),
            Self::Dropout { rate } => Box::new(Dropout::new(rate)),
            Self::SpatialDropout { rate } => Box::new(SpatialDropout::new(rate)),
            Self::ReLU => Box::new(ReLU::default()),
            Self::LeakyReLU { alpha } => Box::new(LeakyReLU::new(alpha)),
            Self::Softmax => Box::new(Softmax::default()),
            Self::GELU => Box::new(GELU::default()),
            Self::SiLU => Box::new(SiLU::default()),
            Self::Identity => Box::new(Identity),
            Self::Scale { factor } => Box::new(Scale::new(factor)),
            Self::Add => Box::new(Add::default()),
            Self::Concat => Box::new(Concat::default()),
            Self::Custom { .. } => unreachable!("made by its factory above"),
        })
    }
}

/// One layer of a sequential model. Shapes are per sample (no batch dimension)
/// in `build`; tensors in `forward` / `backward` carry the batch first.
pub trait Layer: Send {
    fn spec(&self) -> LayerSpec;

    /// Creates parameters (He initialisation from `seed`) on `device` for a
    /// per-sample input shape; returns the per-sample output shape.
    fn build(&mut self, input: &[usize], seed: u64, device: &Device) -> Result<Vec<usize>>;

    /// The forward pass; in training it keeps what `backward` needs.
    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor>;

    /// Gradients of the parameters from `dy`, and the input gradient when
    /// `need_dx` (not for the first layer, nor where no layer before this
    /// one trains: see [`crate::Model::set_trainable`]).
    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>>;

    /// [`Layer::build`] for the per-sample shapes of all the layer's inputs in
    /// a [`crate::Graph`]: one for most layers, two or more for a merge
    /// ([`Add`], [`Concat`]), which overrides the three `_inputs` methods.
    fn build_inputs(
        &mut self,
        inputs: &[&[usize]],
        seed: u64,
        device: &Device,
    ) -> Result<Vec<usize>> {
        match inputs {
            [input] => self.build(input, seed, device),
            _ => Err(AetherError::InvalidShape {
                op: "Layer::build",
                shape: vec![],
                reason: format!(
                    "{} takes one input, given {}",
                    self.spec().kind(),
                    inputs.len()
                ),
            }),
        }
    }

    /// [`Layer::forward`] over all the layer's inputs, in the order given to
    /// [`crate::Graph::add`].
    fn forward_inputs(&mut self, inputs: &[&Tensor], mode: Mode) -> Result<Tensor> {
        self.forward(inputs[0], mode)
    }

    /// [`Layer::backward`] returning one gradient per input (`None` where
    /// `need_dx` is false).
    fn backward_inputs(&mut self, dy: &Tensor, need_dx: bool) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![self.backward(dy, need_dx)?])
    }

    /// Takes over the activation layer that follows this layer: from now on
    /// its output goes through `activation` and its backward takes the
    /// gradient through it first, so the model skips the activation layer.
    /// Returns false (and changes nothing) where the layer cannot; the result
    /// must be the two layers', computed by the same formulas in the same order.
    fn fuse_activation(&mut self, _activation: Activation) -> bool {
        false
    }

    /// Takes over the SpatialDropout of `rate` that follows this layer, built
    /// with `seed`: in training its output is then masked as that layer's
    /// would be, and its backward masks the gradient first, so the model skips
    /// the dropout layer. Returns false (and changes nothing) where the layer
    /// cannot; the result must be bit-identical to the two layers.
    fn fuse_spatial_dropout(&mut self, _rate: f32, _seed: u64) -> bool {
        false
    }

    /// True when, on `device`, the layer rounds its input to f16 before any
    /// use of it (a conv whose kernels take f16 operands): an input uploaded
    /// as f16 then gives the same results for half the bytes, so the model
    /// uploads its batches that way when its first layer says so.
    fn rounds_input_to_f16(&self, _device: &Device) -> bool {
        false
    }

    /// Told (after every build and device move) whether the next layer
    /// rounds its input to f16 before any use ([`Layer::rounds_input_to_f16`]):
    /// a layer that can then writes its output as f16, rounded as
    /// `half::f16::from_f32`, so the next layer sees the same values in half
    /// the bytes and casts nothing. Returns whether it will; by default no.
    fn output_rounded_to_f16(&mut self, _rounded: bool) -> bool {
        false
    }

    /// True when, on `device`, the layer clips the gradient of its output to
    /// +-65504 and rounds it to f16 before any use (a conv whose kernels take
    /// f16 operands): the layer after it may then hand it over as f16.
    fn rounds_output_grad_to_f16(&self, _device: &Device) -> bool {
        false
    }

    /// For the next backward only, on a GPU: the loss scaler's state (word 2
    /// its overflow flag) where this layer rounds its output gradient `dy`
    /// to f16 itself ([`Layer::rounds_output_grad_to_f16`]). A layer that
    /// can raises the flag in the pass that rounds `dy`, where a value
    /// saturates f16, as the scaler's own check of `dy` would, and returns
    /// true: the model then records no check of its own. By default no.
    fn flag_output_grad_saturation(&mut self, _scaler: &Tensor, _dy: &Tensor) -> bool {
        false
    }

    /// Told (after every build and device move) whether the previous layer
    /// rounds the gradient this one returns to f16
    /// ([`Layer::rounds_output_grad_to_f16`]): a layer that can then returns
    /// it as f16, clipped and rounded the same way. Returns whether it will;
    /// by default no.
    fn input_grad_rounded_to_f16(&mut self, _rounded: bool) -> bool {
        false
    }

    /// For the next backward only, on a GPU: the loss scaler's state (word 2
    /// its overflow flag) where this layer returns its input gradient as f16
    /// ([`Layer::input_grad_rounded_to_f16`]). A layer that can raises the
    /// flag in the pass that writes that gradient, where a value saturates f16
    /// (65504 or beyond, inf, NaN), as the scaler's own check of it would, and
    /// returns true: the model then records no check of its own. By default
    /// no (and BatchNorm not where its kernel cannot bind one more storage
    /// buffer).
    fn flag_input_grad_saturation(&mut self, _scaler: &Tensor) -> bool {
        false
    }

    /// Parameters with the gradients of the last `backward`.
    fn trainables(&mut self) -> Vec<Param<'_>> {
        Vec::new()
    }

    /// `(tensor, l1, l2)` for every regularised parameter.
    fn regularized(&self) -> Vec<(&Tensor, f32, f32)> {
        Vec::new()
    }

    /// Everything that is saved: parameters and running statistics, by name.
    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    /// How many values [`Layer::state`] will hold once built for `input`,
    /// worked out without allocating them: `Model::load` holds a file's
    /// architecture to the tensors the file carries before any layer builds.
    fn state_values(&self, _input: &[usize]) -> Result<usize> {
        Ok(0)
    }

    /// Replaces the state tensor `name` (shape already checked by the caller).
    fn set_state(&mut self, name: &str, _tensor: Tensor) -> Result<()> {
        Err(AetherError::InvalidShape {
            op: "Layer::set_state",
            shape: vec![],
            reason: format!("layer {:?} has no tensor {name:?}", self.spec()),
        })
    }

    /// Called after the optimizer replaced the parameters (refreshes f16 shadows).
    fn params_updated(&mut self) {}

    /// Called after the optimizer's step with its gate
    /// ([`crate::optim::Optimizer::gate`]; `None` where it took no step): a layer
    /// whose lasting state moved in the training forward (BatchNorm's running
    /// statistics) keeps the move only where the gate is open, so a step
    /// with a non-finite loss or gradient changes nothing.
    fn commit_step(&mut self, _gate: Option<&Tensor>) -> Result<()> {
        Ok(())
    }

    /// Where later backward passes write this layer's parameter gradients, in
    /// the order of [`Layer::trainables`]: on the GPU, the layer's segments of
    /// the optimizer's packed gradient buffer, so the optimizer copies none.
    /// An empty list (the model moved to another device, whose optimizer
    /// starts afresh): into new tensors again. Layers without parameters
    /// ignore it.
    fn set_grad_outputs(&mut self, _outputs: Vec<Tensor>) {}

    /// The parameters as the optimizer's step left them, rounded to f16, in the
    /// order of [`Layer::trainables`]: a layer whose kernels take f16 operands
    /// uses them instead of casting, until it replaces a parameter.
    fn set_param_shadows(&mut self, _shadows: Vec<Tensor>) {}

    /// Called at the end of a training step: drops what the forward kept for
    /// the backward and the step's gradients. The next step then starts from
    /// the layer's lasting state alone, so it is handed the same pooled
    /// buffers every time and its bind groups repeat (src/gpu/pool.rs), and a
    /// finished step holds no GPU memory.
    fn end_step(&mut self) {}

    /// The conv launch plans of a layer that runs on the conv kernels, so a
    /// profile can say which variant each direction used.
    fn conv_plans(&self) -> Option<&ConvPlans> {
        None
    }

    /// Where this layer's backward first masks its output gradient by the
    /// sign of its output, in a pass of its own (a ReLU folded into an
    /// `Add`): that output. A model summing the gradients of a forked output
    /// then masks the sum in the same pass and calls
    /// [`Layer::output_grad_masked`].
    fn relu_mask(&self) -> Option<&Tensor> {
        None
    }

    /// The next backward's output gradient comes masked by
    /// [`Layer::relu_mask`] already. Forgotten at the next forward.
    fn output_grad_masked(&mut self) {}

    /// What a step of `batch` samples of per-sample `input` asks of the conv
    /// kernels, for a layer that runs on them (its forward input coming as
    /// `step.input`), so the model can plan every conv ahead on all cores
    /// ([`crate::conv::prepare_convs`]). `None` for other layers, and where
    /// the layer cannot say (the step then reports why).
    fn conv_work(&self, _input: &[usize], _step: &StepKind) -> Option<ConvWork<'_>> {
        None
    }
}

/// How a layer's inputs arrive in the step the model plans ahead for
/// ([`Layer::conv_work`]).
#[derive(Clone, Copy, Debug)]
pub struct StepKind {
    /// Samples in the batch.
    pub batch: usize,
    /// The type the layer's input comes in.
    pub input: DType,
    /// Whether the step trains (runs the backward).
    pub train: bool,
    /// Whether the backward asks for the layer's input gradient.
    pub input_grad: bool,
}

/// How a layer returns its input gradient: as f16 where the layer before
/// rounds it to f16 anyway and this layer can write it so (see
/// `Layer::input_grad_rounded_to_f16`), and the loss scaler whose saturation
/// flag the next backward's f16 gradient raises (see
/// `Layer::flag_input_grad_saturation`).
#[derive(Default)]
pub(crate) struct InputGrad {
    f16: bool,
    saturation_flag: Option<Tensor>,
}

impl InputGrad {
    /// Stores the gradient as f16 where `f16`; returns it.
    pub(crate) fn set_f16(&mut self, f16: bool) -> bool {
        self.f16 = f16;
        f16
    }

    /// The next backward raises `scaler`'s flag where it stores f16, the
    /// scaler is on a GPU and `binds` says the layer's kernel can bind it
    /// there; returns whether it will.
    pub(crate) fn flag(
        &mut self,
        scaler: &Tensor,
        binds: impl FnOnce(&GpuContext) -> bool,
    ) -> bool {
        let flags = self.f16 && scaler.gpu_context().is_some_and(|ctx| binds(ctx));
        self.saturation_flag = flags.then(|| scaler.clone());
        flags
    }

    /// The next backward's storage: the dtype, and the scaler whose flag it
    /// raises (taken: a flag is for one backward).
    pub(crate) fn take(&mut self) -> (DType, Option<Tensor>) {
        let dtype = if self.f16 { DType::F16 } else { DType::F32 };
        (dtype, self.saturation_flag.take())
    }

    /// Drops a flag no backward took.
    pub(crate) fn end_step(&mut self) {
        self.saturation_flag = None;
    }
}

/// The tensor a backward pass needs from its forward pass, or a clear error.
pub(crate) fn cached<'a>(slot: &'a Option<Tensor>, layer: &'static str) -> Result<&'a Tensor> {
    slot.as_ref().ok_or_else(|| AetherError::InvalidShape {
        op: layer,
        shape: vec![],
        reason: "backward called before a training forward pass".into(),
    })
}

/// `[N, dims...]`: a per-sample shape with the batch in front.
/// `values` as a state size, or an `InvalidShape` for `op`'s `input` where
/// the count overflowed.
pub(crate) fn state_size(
    op: &'static str,
    input: &[usize],
    values: Option<usize>,
) -> Result<usize> {
    values.ok_or_else(|| AetherError::InvalidShape {
        op,
        shape: input.to_vec(),
        reason: "its parameters overflow a count of values".into(),
    })
}

pub(crate) fn batched_dims(n: usize, per_sample: &[usize]) -> Vec<usize> {
    std::iter::once(n)
        .chain(per_sample.iter().copied())
        .collect()
}

/// `dims` as NHWC per-sample `[H, W, C]`, or an error naming the layer.
pub(crate) fn hwc(layer: &'static str, dims: &[usize]) -> Result<[usize; 3]> {
    <[usize; 3]>::try_from(dims).map_err(|_| AetherError::InvalidShape {
        op: layer,
        shape: dims.to_vec(),
        reason: "expects per-sample input (H, W, C)".into(),
    })
}
