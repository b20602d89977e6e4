//! Pooling layers: max, average and global average.

use super::{Layer, LayerSpec, Mode, cached, hwc};
use crate::conv::{ConvParams, ConvShapeMeta, Padding};
use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::ops::pool::{
    PoolParams, avg_pool2d, avg_pool2d_backward, global_avg_pool, global_avg_pool_backward,
    max_pool2d, max_pool2d_backward,
};
use crate::tensor::Tensor;

/// Per-sample output `[H_out, W_out, C]` of a pooling window, with the conv
/// geometry's checks (an empty output is an error).
fn pooled_shape(layer: &'static str, input: &[usize], p: &PoolParams) -> Result<Vec<usize>> {
    let [h, w, c] = hwc(layer, input)?;
    let params = ConvParams {
        c_out: c,
        filter: p.filter,
        stride: p.stride,
        padding: p.padding,
        dilation: (1, 1),
    };
    let meta = ConvShapeMeta::new([1, h, w, c], &params)?;
    Ok(vec![meta.h_out, meta.w_out, c])
}

/// The NHWC input shape a training forward pass recorded (only the shape is
/// kept, not the activation, so pooling holds no extra GPU memory).
fn input_dims(dims: &Option<[usize; 4]>, layer: &'static str) -> Result<[usize; 4]> {
    dims.ok_or_else(|| AetherError::InvalidShape {
        op: layer,
        shape: vec![],
        reason: "backward called before a training forward pass".into(),
    })
}

pub struct MaxPool2d {
    pub params: PoolParams,
    input_dims: Option<[usize; 4]>,
    argmax: Option<Tensor>,
}

impl MaxPool2d {
    pub fn new(pool: (usize, usize), stride: (usize, usize), padding: Padding) -> Self {
        Self {
            params: PoolParams {
                filter: pool,
                stride,
                padding,
            },
            input_dims: None,
            argmax: None,
        }
    }
}

impl Layer for MaxPool2d {
    fn spec(&self) -> LayerSpec {
        LayerSpec::MaxPool2d {
            pool: self.params.filter,
            stride: self.params.stride,
            padding: self.params.padding,
        }
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        pooled_shape("MaxPool2d", input, &self.params)
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let (y, argmax) = max_pool2d(x, &self.params)?;
        if matches!(mode, Mode::Train { .. }) {
            self.input_dims = Some(x.shape().nhwc("pooling input")?);
            self.argmax = Some(argmax);
        }
        Ok(y)
    }

    fn end_step(&mut self) {
        self.argmax = None;
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let dims = input_dims(&self.input_dims, "MaxPool2d::backward")?;
        let argmax = cached(&self.argmax, "MaxPool2d::backward")?;
        max_pool2d_backward(dy, argmax, dims, &self.params).map(Some)
    }
}

pub struct AvgPool2d {
    pub params: PoolParams,
    input_dims: Option<[usize; 4]>,
}

impl AvgPool2d {
    pub fn new(pool: (usize, usize), stride: (usize, usize), padding: Padding) -> Self {
        Self {
            params: PoolParams {
                filter: pool,
                stride,
                padding,
            },
            input_dims: None,
        }
    }
}

impl Layer for AvgPool2d {
    fn spec(&self) -> LayerSpec {
        LayerSpec::AvgPool2d {
            pool: self.params.filter,
            stride: self.params.stride,
            padding: self.params.padding,
        }
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        pooled_shape("AvgPool2d", input, &self.params)
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if matches!(mode, Mode::Train { .. }) {
            self.input_dims = Some(x.shape().nhwc("pooling input")?);
        }
        avg_pool2d(x, &self.params)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let dims = input_dims(&self.input_dims, "AvgPool2d::backward")?;
        avg_pool2d_backward(dy, dims, &self.params).map(Some)
    }
}

/// `[N, H, W, C] -> [N, C]`.
#[derive(Default)]
pub struct GlobalAvgPool {
    input_dims: Option<[usize; 4]>,
}

impl Layer for GlobalAvgPool {
    fn spec(&self) -> LayerSpec {
        LayerSpec::GlobalAvgPool
    }

    fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
        let [_, _, c] = hwc("GlobalAvgPool", input)?;
        Ok(vec![c])
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if matches!(mode, Mode::Train { .. }) {
            self.input_dims = Some(x.shape().nhwc("pooling input")?);
        }
        global_avg_pool(x)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let dims = input_dims(&self.input_dims, "GlobalAvgPool::backward")?;
        global_avg_pool_backward(dy, dims).map(Some)
    }
}
