//! Pooling layers: max, average and global average.

use super::{Layer, LayerSpec, Mode, cached, hwc};
use crate::conv::{ConvParams, ConvShapeMeta, Padding};
use crate::device::Device;
use crate::error::Result;
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

fn input_dims(x: &Option<Tensor>, layer: &'static str) -> Result<[usize; 4]> {
    cached(x, layer)?.shape().nhwc(layer)
}

pub struct MaxPool2d {
    pub params: PoolParams,
    cache: Option<Tensor>,
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
            cache: None,
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
            self.cache = Some(x.clone());
            self.argmax = Some(argmax);
        }
        Ok(y)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let dims = input_dims(&self.cache, "MaxPool2d::backward")?;
        let argmax = cached(&self.argmax, "MaxPool2d::backward")?;
        max_pool2d_backward(dy, argmax, dims, &self.params).map(Some)
    }
}

pub struct AvgPool2d {
    pub params: PoolParams,
    cache: Option<Tensor>,
}

impl AvgPool2d {
    pub fn new(pool: (usize, usize), stride: (usize, usize), padding: Padding) -> Self {
        Self {
            params: PoolParams {
                filter: pool,
                stride,
                padding,
            },
            cache: None,
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
            self.cache = Some(x.clone());
        }
        avg_pool2d(x, &self.params)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let dims = input_dims(&self.cache, "AvgPool2d::backward")?;
        avg_pool2d_backward(dy, dims, &self.params).map(Some)
    }
}

/// `[N, H, W, C] -> [N, C]`.
#[derive(Default)]
pub struct GlobalAvgPool {
    cache: Option<Tensor>,
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
            self.cache = Some(x.clone());
        }
        global_avg_pool(x)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        if !need_dx {
            return Ok(None);
        }
        let dims = input_dims(&self.cache, "GlobalAvgPool::backward")?;
        global_avg_pool_backward(dy, dims).map(Some)
    }
}
