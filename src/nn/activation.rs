//! Activation layers (ReLU, LeakyReLU, GELU, SiLU, Softmax) and the
//! elementwise Identity and Scale.

use super::{Layer, LayerSpec, Mode, cached};
use crate::device::Device;
use crate::error::{Result, check_hyperparameter};
use crate::ops::DxStorage;
use crate::ops::activation::{
    Activation, Smooth, activation_backward_into, leaky_relu, smooth_activation_as,
};
use crate::ops::arith::scale;
use crate::ops::loss::{softmax, softmax_backward};
use crate::ops::relu;
use crate::tensor::{DType, Tensor};

/// Where an activation layer's backward writes its input gradient as f16,
/// for the conv before it (see `Layer::input_grad_rounded_to_f16`), and the
/// loss scaler whose saturation flag it then raises.
#[derive(Default)]
struct InputGrad {
    f16: bool,
    saturation_flag: Option<Tensor>,
}

impl InputGrad {
    fn rounded(&mut self, rounded: bool) -> bool {
        self.f16 = rounded;
        rounded
    }

    fn flag(&mut self, scaler: &Tensor) -> bool {
        let flags = self.f16 && scaler.gpu_context().is_some();
        self.saturation_flag = flags.then(|| scaler.clone());
        flags
    }

    /// `activation`'s gradient at its input `x` for `dy`, stored as decided.
    fn backward(&mut self, x: &Tensor, dy: &Tensor, activation: Activation) -> Result<Tensor> {
        let flag = self.saturation_flag.take();
        let dx_out = DxStorage {
            dtype: if self.f16 { DType::F16 } else { DType::F32 },
            saturation_flag: flag.as_ref(),
        };
        activation_backward_into(x, dy, activation, dx_out)
    }
}

/// `max(x, 0)`, elementwise; `ReLU::default()` makes one. Right after a
/// BatchNorm or a residual `Add` it runs inside that layer (see
/// [`Model::fuse_activations`](crate::Model::fuse_activations)).
#[derive(Default)]
pub struct ReLU {
    input: Option<Tensor>,
    input_grad: InputGrad,
}

impl Layer for ReLU {
    fn spec(&self) -> LayerSpec {
        LayerSpec::ReLU
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if matches!(mode, Mode::Train { .. }) {
            self.input = Some(x.clone());
        }
        relu(x)
    }

    fn end_step(&mut self) {
        self.input = None;
        self.input_grad.saturation_flag = None;
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let x = cached(&self.input, "ReLU::backward")?;
        self.input_grad.backward(x, dy, Activation::Relu).map(Some)
    }

    fn input_grad_rounded_to_f16(&mut self, rounded: bool) -> bool {
        self.input_grad.rounded(rounded)
    }

    fn flag_input_grad_saturation(&mut self, scaler: &Tensor) -> bool {
        self.input_grad.flag(scaler)
    }
}

/// `x` where positive, `alpha * x` elsewhere, elementwise.
pub struct LeakyReLU {
    pub alpha: f32,
    input: Option<Tensor>,
    input_grad: InputGrad,
}

impl LeakyReLU {
    /// The slope `alpha` below zero (finite; checked at `finalize`).
    pub fn new(alpha: f32) -> Self {
        Self {
            alpha,
            input: None,
            input_grad: InputGrad::default(),
        }
    }
}

impl Layer for LeakyReLU {
    fn spec(&self) -> LayerSpec {
        LayerSpec::LeakyReLU { alpha: self.alpha }
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        check_hyperparameter(
            "LeakyReLU alpha",
            self.alpha,
            self.alpha.is_finite(),
            "finite",
        )?;
        Ok(input.to_vec())
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if matches!(mode, Mode::Train { .. }) {
            self.input = Some(x.clone());
        }
        leaky_relu(x, self.alpha)
    }

    fn end_step(&mut self) {
        self.input = None;
        self.input_grad.saturation_flag = None;
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let x = cached(&self.input, "LeakyReLU::backward")?;
        let activation = Activation::LeakyRelu(self.alpha);
        self.input_grad.backward(x, dy, activation).map(Some)
    }

    fn input_grad_rounded_to_f16(&mut self, rounded: bool) -> bool {
        self.input_grad.rounded(rounded)
    }

    fn flag_input_grad_saturation(&mut self, scaler: &Tensor) -> bool {
        self.input_grad.flag(scaler)
    }
}

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

/// A smooth activation layer over any shape, keeping its input for the
/// backward. Its output goes as f16 where the next layer rounds its input to
/// f16 (see `Layer::output_rounded_to_f16`), and its input gradient where the
/// layer before rounds it.
struct SmoothLayer {
    kind: Smooth,
    input: Option<Tensor>,
    output: DType,
    input_grad: InputGrad,
}

impl SmoothLayer {
    fn new(kind: Smooth) -> Self {
        Self {
            kind,
            input: None,
            output: DType::F32,
            input_grad: InputGrad::default(),
        }
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if matches!(mode, Mode::Train { .. }) {
            self.input = Some(x.clone());
        }
        smooth_activation_as(x, self.kind, self.output)
    }

    fn output_rounded_to_f16(&mut self, rounded: bool) -> bool {
        self.output = if rounded { DType::F16 } else { DType::F32 };
        rounded
    }

    fn backward(
        &mut self,
        dy: &Tensor,
        need_dx: bool,
        layer: &'static str,
    ) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let x = cached(&self.input, layer)?;
        let activation = Activation::Smooth(self.kind);
        self.input_grad.backward(x, dy, activation).map(Some)
    }
}

/// GELU, exact (erf) form as PyTorch's `nn.GELU()`: `x * Phi(x)`. Right
/// after a BatchNorm it runs inside that layer (see
/// [`Model::fuse_activations`](crate::Model::fuse_activations)).
pub struct GELU(SmoothLayer);

impl Default for GELU {
    fn default() -> Self {
        Self(SmoothLayer::new(Smooth::Gelu))
    }
}

/// SiLU (swish): `x * sigmoid(x)`. Right after a BatchNorm it runs inside
/// that layer, as GELU does.
pub struct SiLU(SmoothLayer);

impl Default for SiLU {
    fn default() -> Self {
        Self(SmoothLayer::new(Smooth::Silu))
    }
}

macro_rules! smooth_layer {
    ($layer:ident, $name:literal) => {
        impl Layer for $layer {
            fn spec(&self) -> LayerSpec {
                LayerSpec::$layer
            }

            fn build(
                &mut self,
                input: &[usize],
                _seed: u64,
                _device: &Device,
            ) -> Result<Vec<usize>> {
                Ok(input.to_vec())
            }

            fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
                self.0.forward(x, mode)
            }

            fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
                self.0.backward(dy, need_dx, concat!($name, "::backward"))
            }

            fn end_step(&mut self) {
                self.0.input = None;
                self.0.input_grad.saturation_flag = None;
            }

            fn output_rounded_to_f16(&mut self, rounded: bool) -> bool {
                self.0.output_rounded_to_f16(rounded)
            }

            fn input_grad_rounded_to_f16(&mut self, rounded: bool) -> bool {
                self.0.input_grad.rounded(rounded)
            }

            fn flag_input_grad_saturation(&mut self, scaler: &Tensor) -> bool {
                self.0.input_grad.flag(scaler)
            }
        }
    };
}

smooth_layer!(GELU, "GELU");
smooth_layer!(SiLU, "SiLU");

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
