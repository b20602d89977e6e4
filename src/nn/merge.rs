//! Layers that merge several inputs of a [`crate::Graph`]: `Add` (the
//! residual connection) and `Concat` (along channels).

use super::{Layer, LayerSpec, Mode, cached};
use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::ops::activation::{Activation, relu_backward};
use crate::ops::arith::{add, add_relu};
use crate::ops::concat::{concat_channels, split_channels};
use crate::tensor::Tensor;

/// The error of a merge given fewer than two inputs.
fn needs_two(layer: &'static str, given: usize) -> AetherError {
    AetherError::InvalidShape {
        op: layer,
        shape: vec![],
        reason: format!(
            "merges two or more inputs, given {given}: add it to a Graph with its inputs"
        ),
    }
}

/// Sums two or more inputs of one shape elementwise: a residual connection.
/// Its gradient passes to every input unchanged (no copy). A ReLU that alone
/// reads its output runs inside it (see [`Model::fuse_activations`](crate::Model::fuse_activations)):
/// the last sum and the ReLU are one pass, and the gradient is masked once
/// for all inputs.
#[derive(Default)]
pub struct Add {
    inputs: usize,
    relu: bool,
    /// The output, kept in training for the fused ReLU's gradient.
    output: Option<Tensor>,
    /// The next backward's gradient is masked already (see
    /// [`Layer::output_grad_masked`]).
    grad_masked: bool,
}

impl Layer for Add {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Add
    }

    fn build(&mut self, _input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        Err(needs_two("Add", 1))
    }

    fn forward(&mut self, _x: &Tensor, _mode: Mode) -> Result<Tensor> {
        Err(needs_two("Add", 1))
    }

    fn backward(&mut self, _dy: &Tensor, _need_dx: bool) -> Result<Option<Tensor>> {
        Err(needs_two("Add", 1))
    }

    fn build_inputs(
        &mut self,
        inputs: &[&[usize]],
        _seed: u64,
        _device: &Device,
    ) -> Result<Vec<usize>> {
        if inputs.len() < 2 {
            return Err(needs_two("Add", inputs.len()));
        }
        if let Some(other) = inputs.iter().find(|s| **s != inputs[0]) {
            return Err(AetherError::ShapeMismatch {
                op: "Add",
                expected: inputs[0].to_vec(),
                actual: other.to_vec(),
            });
        }
        self.inputs = inputs.len();
        // A fused ReLU is the model's decision, made again after every build.
        self.relu = false;
        Ok(inputs[0].to_vec())
    }

    fn fuse_activation(&mut self, activation: Activation) -> bool {
        self.relu = activation == Activation::Relu;
        self.relu
    }

    fn forward_inputs(&mut self, inputs: &[&Tensor], mode: Mode) -> Result<Tensor> {
        let (last, rest) = inputs.split_last().expect("built with two or more inputs");
        let mut sum = rest[0].clone();
        for x in &rest[1..] {
            sum = add(&sum, x)?;
        }
        let out = if self.relu {
            add_relu(&sum, last)?
        } else {
            add(&sum, last)?
        };
        if self.relu && matches!(mode, Mode::Train { .. }) {
            self.output = Some(out.clone());
        }
        self.grad_masked = false;
        Ok(out)
    }

    fn end_step(&mut self) {
        self.output = None;
        self.grad_masked = false;
    }

    fn relu_mask(&self) -> Option<&Tensor> {
        self.output.as_ref().filter(|_| self.relu)
    }

    fn output_grad_masked(&mut self) {
        self.grad_masked = self.relu;
    }

    fn backward_inputs(&mut self, dy: &Tensor, need_dx: bool) -> Result<Vec<Option<Tensor>>> {
        if !need_dx {
            return Ok(vec![None; self.inputs]);
        }
        let dx = if self.relu && !std::mem::take(&mut self.grad_masked) {
            relu_backward(cached(&self.output, "Add::backward")?, dy)?
        } else {
            dy.clone()
        };
        Ok(vec![Some(dx); self.inputs])
    }
}

/// Joins two or more inputs along their last axis (channels, NHWC); every
/// other axis must agree.
#[derive(Default)]
pub struct Concat {
    widths: Vec<usize>,
}

impl Layer for Concat {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Concat
    }

    fn build(&mut self, _input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        Err(needs_two("Concat", 1))
    }

    fn forward(&mut self, _x: &Tensor, _mode: Mode) -> Result<Tensor> {
        Err(needs_two("Concat", 1))
    }

    fn backward(&mut self, _dy: &Tensor, _need_dx: bool) -> Result<Option<Tensor>> {
        Err(needs_two("Concat", 1))
    }

    fn build_inputs(
        &mut self,
        inputs: &[&[usize]],
        _seed: u64,
        _device: &Device,
    ) -> Result<Vec<usize>> {
        if inputs.len() < 2 {
            return Err(needs_two("Concat", inputs.len()));
        }
        let lead = |s: &[usize]| s[..s.len().saturating_sub(1)].to_vec();
        let mut widths = Vec::with_capacity(inputs.len());
        for s in inputs {
            if s.is_empty() || lead(s) != lead(inputs[0]) {
                return Err(AetherError::ShapeMismatch {
                    op: "Concat (all axes but the last must agree)",
                    expected: inputs[0].to_vec(),
                    actual: s.to_vec(),
                });
            }
            widths.push(s[s.len() - 1]);
        }
        let mut out = lead(inputs[0]);
        out.push(widths.iter().sum());
        self.widths = widths;
        Ok(out)
    }

    fn forward_inputs(&mut self, inputs: &[&Tensor], _mode: Mode) -> Result<Tensor> {
        concat_channels(inputs)
    }

    fn backward_inputs(&mut self, dy: &Tensor, need_dx: bool) -> Result<Vec<Option<Tensor>>> {
        if !need_dx {
            return Ok(vec![None; self.widths.len()]);
        }
        Ok(split_channels(dy, &self.widths)?
            .into_iter()
            .map(Some)
            .collect())
    }
}
