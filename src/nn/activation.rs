//! Activation layers: ReLU, LeakyReLU, Softmax.

use super::{Layer, LayerSpec, Mode, cached};
use crate::device::Device;
use crate::error::{Result, check_hyperparameter};
use crate::ops::activation::{leaky_relu, leaky_relu_backward, relu_backward};
use crate::ops::loss::{softmax, softmax_backward};
use crate::ops::relu;
use crate::tensor::Tensor;

/// `max(x, 0)`, elementwise; `ReLU::default()` makes one. Right after a
/// BatchNorm it runs inside that layer (see [`Model::fuse_relu`](crate::Model::fuse_relu)).
#[derive(Default)]
pub struct ReLU {
    input: Option<Tensor>,
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
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        relu_backward(cached(&self.input, "ReLU::backward")?, dy).map(Some)
    }
}

/// `x` where positive, `alpha * x` elsewhere, elementwise.
pub struct LeakyReLU {
    pub alpha: f32,
    input: Option<Tensor>,
}

impl LeakyReLU {
    /// The slope `alpha` below zero (finite; checked at `finalize`).
    pub fn new(alpha: f32) -> Self {
        Self { alpha, input: None }
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
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        leaky_relu_backward(cached(&self.input, "LeakyReLU::backward")?, dy, self.alpha).map(Some)
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
