//! Pooling layers: max, average, global average and global max.

use super::dropout::mask_key;
use super::{InputGrad, Layer, LayerSpec, Mode, cached, hwc};
use crate::conv::Padding;
use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::ops::DxStorage;
use crate::ops::pool::{
    PoolDropout, PoolParams, avg_pool2d, avg_pool2d_backward, global_avg_pool,
    global_avg_pool_backward, max_pool2d_as, max_pool2d_backward_into, max_pool2d_dropout,
    pooled_dims, windows_tile,
};
use crate::tensor::{DType, Tensor};

/// Per-sample output `[H_out, W_out, C]` of a pooling window, with the pooling
/// kernels' own checks: a geometry that builds (at `finalize` and at load)
/// is one `predict` runs.
fn pooled_shape(layer: &'static str, input: &[usize], p: &PoolParams) -> Result<Vec<usize>> {
    Ok(pooled_dims(layer, hwc(layer, input)?, p)?.to_vec())
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

/// 2-D max pooling, NHWC.
pub struct MaxPool2d {
    pub params: PoolParams,
    input_dims: Option<[usize; 4]>,
    argmax: Option<Tensor>,
    /// Per-sample input `[H, W, C]`, from `build`.
    input: [usize; 3],
    /// A SpatialDropout folded in (see `Layer::fuse_spatial_dropout`): its
    /// rate and the seed it was built with.
    dropout: Option<(f32, u64)>,
    /// The folded dropout's draws in the last training forward, for backward.
    step_dropout: Option<PoolDropout>,
    /// How the forward stores `y`: F16 where the next layer rounds its input
    /// to f16 (see `Layer::output_rounded_to_f16`).
    output: DType,
    /// How the backward returns dx: f16 where the conv before rounds it.
    input_grad: InputGrad,
}

impl MaxPool2d {
    /// The maximum of each `pool` = `(height, width)` window, windows `stride`
    /// apart over the input padded by `padding`.
    pub fn new(pool: (usize, usize), stride: (usize, usize), padding: Padding) -> Self {
        Self {
            params: PoolParams {
                filter: pool,
                stride,
                padding,
            },
            input_dims: None,
            argmax: None,
            input: [0; 3],
            dropout: None,
            step_dropout: None,
            output: DType::F32,
            input_grad: InputGrad::default(),
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
        let shape = pooled_shape("MaxPool2d", input, &self.params)?;
        self.input = hwc("MaxPool2d", input)?;
        (self.dropout, self.output) = (None, DType::F32);
        self.input_grad = InputGrad::default();
        Ok(shape)
    }

    /// Where the windows partition the input (the fused backward writes each
    /// window once).
    fn fuse_spatial_dropout(&mut self, rate: f32, seed: u64) -> bool {
        let [h, w, c] = self.input;
        let fits = windows_tile([1, h, w, c], &self.params);
        if fits {
            self.dropout = Some((rate, seed));
        }
        fits
    }

    /// For channels in fours (the kernels write four at a time).
    fn output_rounded_to_f16(&mut self, rounded: bool) -> bool {
        let f16 = rounded && self.input[2].is_multiple_of(4);
        self.output = if f16 { DType::F16 } else { DType::F32 };
        f16
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let train = match mode {
            Mode::Train { seed, step } => Some((seed, step)),
            _ => None,
        };
        self.step_dropout = match (train, self.dropout) {
            (Some((seed, step)), Some((rate, layer_seed))) => Some(PoolDropout {
                rate,
                seed: mask_key(seed, layer_seed),
                step,
            }),
            _ => None,
        };
        let (y, argmax) = match &self.step_dropout {
            Some(dropout) => max_pool2d_dropout(x, &self.params, dropout, self.output)?,
            None => max_pool2d_as(x, &self.params, self.output)?,
        };
        if train.is_some() {
            self.input_dims = Some(x.shape().nhwc("pooling input")?);
            self.argmax = Some(argmax);
        }
        Ok(y)
    }

    /// Where the windows partition the input and the channels come in fours
    /// (the f16 backward writes four channels of a window at a time).
    fn input_grad_rounded_to_f16(&mut self, rounded: bool) -> bool {
        let [h, w, c] = self.input;
        let f16 = rounded && c.is_multiple_of(4) && windows_tile([1, h, w, c], &self.params);
        self.input_grad.set_f16(f16)
    }

    fn flag_input_grad_saturation(&mut self, scaler: &Tensor) -> bool {
        self.input_grad.flag(scaler, |_| true)
    }

    fn end_step(&mut self) {
        self.argmax = None;
        self.input_grad.end_step();
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let (dtype, flag) = self.input_grad.take();
        if !need_dx {
            return Ok(None);
        }
        let dims = input_dims(&self.input_dims, "MaxPool2d::backward")?;
        let argmax = cached(&self.argmax, "MaxPool2d::backward")?;
        let dx_out = DxStorage {
            dtype,
            saturation_flag: flag.as_ref(),
        };
        let dropout = self.step_dropout.as_ref();
        max_pool2d_backward_into(dy, argmax, dims, &self.params, dropout, dx_out).map(Some)
    }
}

/// 2-D average pooling, NHWC.
pub struct AvgPool2d {
    pub params: PoolParams,
    input_dims: Option<[usize; 4]>,
}

impl AvgPool2d {
    /// The mean of each `pool` = `(height, width)` window, windows `stride`
    /// apart over the input padded by `padding`.
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

/// `[N, H, W, C] -> [N, C]`: each channel's largest value, as PyTorch's
/// `AdaptiveMaxPool2d(1)` then flatten. A max pool whose window is the whole
/// input; the gradient goes to the first largest value of each channel.
#[derive(Default)]
pub struct GlobalMaxPool {
    pool: Option<MaxPool2d>,
    channels: usize,
}

impl GlobalMaxPool {
    fn pool(&mut self) -> Result<&mut MaxPool2d> {
        self.pool.as_mut().ok_or_else(|| AetherError::InvalidShape {
            op: "GlobalMaxPool",
            shape: vec![],
            reason: "layer used before the model was finalized".into(),
        })
    }
}

impl Layer for GlobalMaxPool {
    fn spec(&self) -> LayerSpec {
        LayerSpec::GlobalMaxPool
    }

    fn build(&mut self, input: &[usize], seed: u64, device: &Device) -> Result<Vec<usize>> {
        let [h, w, c] = hwc("GlobalMaxPool", input)?;
        let mut pool = MaxPool2d::new((h, w), (h, w), Padding::Valid);
        pool.build(input, seed, device)?;
        (self.pool, self.channels) = (Some(pool), c);
        Ok(vec![c])
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let y = self.pool()?.forward(x, mode)?;
        y.reshape(vec![y.dims()[0], self.channels])
    }

    fn end_step(&mut self) {
        if let Some(pool) = &mut self.pool {
            pool.end_step();
        }
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let dy = dy.reshape(vec![dy.dims()[0], 1, 1, self.channels])?;
        self.pool()?.backward(&dy, need_dx)
    }
}
