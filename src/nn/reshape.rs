//! Flatten: `[N, ...] -> [N, features]`, a reshape without a copy.

use super::{Layer, LayerSpec, Mode};
use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;

/// `[N, ...] -> [N, features]`, before a [`Dense`](super::Dense);
/// `Flatten::default()` makes one.
#[derive(Default)]
pub struct Flatten {
    input: Vec<usize>,
}

impl Layer for Flatten {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Flatten
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        self.input = input.to_vec();
        Ok(vec![input.iter().product()])
    }

    fn forward(&mut self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        let n = x.dims()[0];
        x.reshape(vec![n, x.numel() / n])
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        dy.reshape(super::batched_dims(dy.dims()[0], &self.input))
            .map(Some)
    }
}
