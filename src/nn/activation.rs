//! Activation layers (ReLU, LeakyReLU, GELU, SiLU, Softmax) and the
//! elementwise Identity and Scale.

use super::{InputGrad, Layer, LayerSpec, Mode, cached};
use crate::device::Device;
use crate::error::{Result, check_hyperparameter};
use crate::ops::DxStorage;
use crate::ops::activation::{Activation, Smooth, activation_as, activation_backward_into};
use crate::ops::arith::scale;
use crate::ops::loss::{softmax, softmax_backward};
use crate::tensor::{DType, Tensor};

/// What an elementwise activation layer keeps: its input for the backward,
/// how it stores its output (f16 where the next layer rounds its input to f16,
/// see `Layer::output_rounded_to_f16`) and its input gradient (f16 wherever
/// the layer before rounds it).
struct Elementwise {
    input: Option<Tensor>,
    output: DType,
    input_grad: InputGrad,
}

impl Default for Elementwise {
    fn default() -> Self {
        Self {
            input: None,
            output: DType::F32,
            input_grad: InputGrad::default(),
        }
    }
}

impl Elementwise {
    fn forward(&mut self, x: &Tensor, mode: Mode, activation: Activation) -> Result<Tensor> {
        if matches!(mode, Mode::Train { .. }) {
            self.input = Some(x.clone());
        }
        activation_as(x, activation, self.output)
    }

    fn backward(
        &mut self,
        dy: &Tensor,
        need_dx: bool,
        activation: Activation,
        layer: &'static str,
    ) -> Result<Option<Tensor>> {
        let (dtype, flag) = self.input_grad.take();
        if !need_dx {
            return Ok(None);
        }
        let dx_out = DxStorage {
            dtype,
            saturation_flag: flag.as_ref(),
        };
        activation_backward_into(cached(&self.input, layer)?, dy, activation, dx_out).map(Some)
    }

    fn end_step(&mut self) {
        self.input = None;
        self.input_grad.end_step();
    }

    fn output_rounded_to_f16(&mut self, rounded: bool) -> bool {
        self.output = if rounded { DType::F16 } else { DType::F32 };
        rounded
    }

    fn input_grad_rounded_to_f16(&mut self, rounded: bool) -> bool {
        self.input_grad.set_f16(rounded)
    }

    fn flag_input_grad_saturation(&mut self, scaler: &Tensor) -> bool {
        self.input_grad.flag(scaler, |_| true)
    }
}

/// `max(x, 0)`, elementwise; `ReLU::default()` makes one. Right after a
/// BatchNorm or a residual `Add` it runs inside that layer (see
/// [`Model::fuse_activations`](crate::Model::fuse_activations)).
#[derive(Default)]
pub struct ReLU(Elementwise);

/// `x` where positive, `alpha * x` elsewhere, elementwise.
pub struct LeakyReLU {
    pub alpha: f32,
    state: Elementwise,
}

impl LeakyReLU {
    /// The slope `alpha` below zero (finite; checked at `finalize`).
    pub fn new(alpha: f32) -> Self {
        Self {
            alpha,
            state: Elementwise::default(),
        }
    }
}

/// GELU, exact (erf) form as PyTorch's `nn.GELU()`: `x * Phi(x)`. Right
/// after a BatchNorm it runs inside that layer (see
/// [`Model::fuse_activations`](crate::Model::fuse_activations)).
#[derive(Default)]
pub struct GELU(Elementwise);

/// SiLU (swish): `x * sigmoid(x)`. Right after a BatchNorm it runs inside
/// that layer, as GELU does.
#[derive(Default)]
pub struct SiLU(Elementwise);

/// What distinguishes the elementwise activation layers: their activation,
/// spec and build check, and where their [`Elementwise`] state lives.
trait ElementwiseLayer {
    fn activation(&self) -> Activation;
    fn layer_spec(&self) -> LayerSpec;
    fn state(&mut self) -> &mut Elementwise;
    /// The hyperparameters' check at `finalize`.
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

impl ElementwiseLayer for ReLU {
    fn activation(&self) -> Activation {
        Activation::Relu
    }
    fn layer_spec(&self) -> LayerSpec {
        LayerSpec::ReLU
    }
    fn state(&mut self) -> &mut Elementwise {
        &mut self.0
    }
}

impl ElementwiseLayer for LeakyReLU {
    fn activation(&self) -> Activation {
        Activation::LeakyRelu(self.alpha)
    }
    fn layer_spec(&self) -> LayerSpec {
        LayerSpec::LeakyReLU { alpha: self.alpha }
    }
    fn state(&mut self) -> &mut Elementwise {
        &mut self.state
    }
    fn check(&self) -> Result<()> {
        check_hyperparameter(
            "LeakyReLU alpha",
            self.alpha,
            self.alpha.is_finite(),
            "finite",
        )
    }
}

impl ElementwiseLayer for GELU {
    fn activation(&self) -> Activation {
        Activation::Smooth(Smooth::Gelu)
    }
    fn layer_spec(&self) -> LayerSpec {
        LayerSpec::GELU
    }
    fn state(&mut self) -> &mut Elementwise {
        &mut self.0
    }
}

impl ElementwiseLayer for SiLU {
    fn activation(&self) -> Activation {
        Activation::Smooth(Smooth::Silu)
    }
    fn layer_spec(&self) -> LayerSpec {
        LayerSpec::SiLU
    }
    fn state(&mut self) -> &mut Elementwise {
        &mut self.0
    }
}

/// `Layer` for an [`ElementwiseLayer`]: the shapes pass through, the rest is
/// [`Elementwise`]'s.
macro_rules! elementwise_layer {
    ($layer:ident, $name:literal) => {
        impl Layer for $layer {
            fn spec(&self) -> LayerSpec {
                self.layer_spec()
            }

            fn build(
                &mut self,
                input: &[usize],
                _seed: u64,
                _device: &Device,
            ) -> Result<Vec<usize>> {
                self.check()?;
                Ok(input.to_vec())
            }

            fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
                let activation = self.activation();
                self.state().forward(x, mode, activation)
            }

            fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
                let activation = self.activation();
                let layer = concat!($name, "::backward");
                self.state().backward(dy, need_dx, activation, layer)
            }

            fn end_step(&mut self) {
                self.state().end_step()
            }

            fn output_rounded_to_f16(&mut self, rounded: bool) -> bool {
                self.state().output_rounded_to_f16(rounded)
            }

            fn input_grad_rounded_to_f16(&mut self, rounded: bool) -> bool {
                self.state().input_grad_rounded_to_f16(rounded)
            }

            fn flag_input_grad_saturation(&mut self, scaler: &Tensor) -> bool {
                self.state().flag_input_grad_saturation(scaler)
            }
        }
    };
}

elementwise_layer!(ReLU, "ReLU");
elementwise_layer!(LeakyReLU, "LeakyReLU");
elementwise_layer!(GELU, "GELU");
elementwise_layer!(SiLU, "SiLU");

/// Row-wise softmax over `[N, K]`.
#[derive(Default)]
pub struct Softmax {
    output: Option<Tensor>,
}

impl Layer for Softmax {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Softmax
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let y = softmax(x)?;
        if matches!(mode, Mode::Train { .. }) {
            self.output = Some(y.clone());
        }
        Ok(y)
    }

    fn end_step(&mut self) {
        self.output = None;
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        softmax_backward(cached(&self.output, "Softmax::backward")?, dy).map(Some)
    }
}

/// Passes its input through unchanged (a placeholder branch, as PyTorch's
/// `nn.Identity`).
#[derive(Default)]
pub struct Identity;

impl Layer for Identity {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Identity
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }

    fn forward(&mut self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        Ok(need_dx.then(|| dy.clone()))
    }
}

/// Multiplies by a constant `factor` (airbench scales its logits by 1/9).
pub struct Scale {
    pub factor: f32,
}

impl Scale {
    pub fn new(factor: f32) -> Self {
        Self { factor }
    }
}

impl Layer for Scale {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Scale {
            factor: self.factor,
        }
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        check_hyperparameter(
            "Scale factor",
            self.factor,
            self.factor.is_finite(),
            "finite",
        )?;
        Ok(input.to_vec())
    }

    fn forward(&mut self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        scale(x, self.factor)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        scale(dy, self.factor).map(Some)
    }
}
