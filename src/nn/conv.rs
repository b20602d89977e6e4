//! Conv2d and Dense (a 1x1 convolution over `[N, 1, 1, in]`), on the conv
//! kernels. On a GPU whose best conv variant takes f16 operands, the forward and
//! input-gradient kernels share the weights' f16 shadow: the one the optimizer's
//! step wrote (`Layer::set_param_shadows`), else one cast once (before the first
//! step, after a load). The backward casts dvalues once for both gradient
//! kernels; dweight reads an f32 input as f32, converting while staging.

use std::sync::Arc;

use super::init::{dirac_leading_filters, he_normal};
use super::{Layer, LayerSpec, Mode, Param, StepKind, batched_dims, cached, hwc, state_size};
use crate::conv::{
    ConvParams, ConvPlans, ConvShapeMeta, ConvVariant, ConvWork, Padding, cast_f16,
    cast_f16_flagging, cast_f16_kept, conv2d_forward,
    dinput::{conv2d_dinput_flipped, flipped_filter_target},
    dweight::conv2d_dweight_into,
};
use crate::device::Device;
use crate::error::{AetherError, Result, check_hyperparameter};
use crate::gpu::GpuContext;
use crate::tensor::{DType, Tensor};

/// A 2-D convolution, NHWC, weights `[R, S, C_in, C_out]`, with a bias per
/// filter unless built with `bias(false)` (a conv before BatchNorm needs none).
pub struct Conv2d {
    pub filters: usize,
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: Padding,
    /// L1 / L2 penalties on the kernel and on the bias.
    pub l1: f32,
    pub l2: f32,
    pub bias_l1: f32,
    pub bias_l2: f32,
    /// Whether the bias is a parameter. Without, the kernels add a zero bias
    /// that is neither trained nor saved.
    pub bias: bool,
    /// Whether `build` starts the leading filters as the identity (see
    /// [`Conv2d::dirac`]); the rest, and every filter otherwise, He-normal.
    pub dirac: bool,
    weights: Option<ConvWeights>,
    input: Option<Tensor>,
    grads: Option<(Tensor, Tensor)>,
    /// Where the backward writes `(dW, dbias)` (see `Layer::set_grad_outputs`).
    grad_outputs: Option<(Tensor, Tensor)>,
    /// For the next backward: the loss scaler's state, whose flag the cast
    /// of an f32 `dy` raises (see `Layer::flag_output_grad_saturation`).
    saturation_flag: Option<Tensor>,
    plans: ConvPlans,
}

struct ConvWeights {
    params: ConvParams,
    kernel: Tensor,
    bias: Tensor,
    /// The kernel as f16 for the f16 variants: the optimizer's, or cast when
    /// first needed; `None` after the kernel changed without a new one.
    kernel_f16: Option<Tensor>,
}

impl Conv2d {
    /// `filters` output channels from a `kernel` = `(height, width)` filter,
    /// stride 1 (see [`stride`](Self::stride)); input channels come from the
    /// input at `finalize`.
    ///
    /// ```
    /// use aether::Padding;
    /// use aether::nn::Conv2d;
    ///
    /// let conv = Conv2d::new(32, (3, 3), Padding::Same).stride((2, 2));
    /// assert_eq!((conv.filters, conv.stride), (32, (2, 2)));
    /// ```
    pub fn new(filters: usize, kernel: (usize, usize), padding: Padding) -> Self {
        Self {
            filters,
            kernel,
            stride: (1, 1),
            padding,
            l1: 0.0,
            l2: 0.0,
            bias_l1: 0.0,
            bias_l2: 0.0,
            bias: true,
            dirac: false,
            weights: None,
            input: None,
            grads: None,
            grad_outputs: None,
            saturation_flag: None,
            plans: ConvPlans::new(),
        }
    }

    /// The filter's step `(vertical, horizontal)`; 1 by default.
    pub fn stride(mut self, stride: (usize, usize)) -> Self {
        self.stride = stride;
        self
    }

    /// L1 / L2 penalties on the kernel and the bias.
    pub fn regularize(mut self, l1: f32, l2: f32, bias_l1: f32, bias_l2: f32) -> Self {
        (self.l1, self.l2, self.bias_l1, self.bias_l2) = (l1, l2, bias_l1, bias_l2);
        self
    }

    /// With `false`, no bias parameter (as PyTorch's `bias=False`).
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// With `true`, the first `min(C_in, filters)` filters start as the
    /// identity, each passing its own input channel through its centre tap
    /// (PyTorch's `nn.init.dirac_` on them): the conv starts as an implicit
    /// residual, as airbench's do. The other filters are He-initialised.
    pub fn dirac(mut self, dirac: bool) -> Self {
        self.dirac = dirac;
        self
    }

    fn weights(&self) -> Result<&ConvWeights> {
        self.weights
            .as_ref()
            .ok_or_else(|| AetherError::InvalidShape {
                op: "Conv2d",
                shape: vec![],
                reason: "layer used before the model was finalized".into(),
            })
    }

    /// The kernel operand: the f16 shadow where the best GPU variant takes f16.
    fn kernel_operand(&mut self) -> Result<Tensor> {
        let w = self
            .weights
            .as_mut()
            .ok_or_else(|| AetherError::InvalidShape {
                op: "Conv2d",
                shape: vec![],
                reason: "layer used before the model was finalized".into(),
            })?;
        if !f16_kernels_first(w.kernel.gpu_context()) {
            return Ok(w.kernel.clone());
        }
        if w.kernel_f16.is_none() {
            w.kernel_f16 = Some(cast_f16_kept(&w.kernel, true)?);
        }
        Ok(w.kernel_f16.clone().expect("set above"))
    }
}

/// Whether `ctx` is a GPU whose preferred conv variant takes f16 operands, so
/// operands are best cast once and shared.
fn f16_kernels_first(ctx: Option<&Arc<GpuContext>>) -> bool {
    ctx.is_some_and(|ctx| {
        ConvVariant::candidates(ctx.caps())
            .first()
            .is_some_and(|v| v.f16_operands())
    })
}

impl Conv2d {
    /// The conv's parameters and its geometry for one sample of `input`.
    fn geometry(&self, input: &[usize]) -> Result<(ConvParams, ConvShapeMeta)> {
        let [h, w, c] = hwc("Conv2d", input)?;
        let params = ConvParams {
            c_out: self.filters,
            filter: self.kernel,
            stride: self.stride,
            padding: self.padding,
            dilation: (1, 1),
        };
        let meta = ConvShapeMeta::new([1, h, w, c], &params)?;
        Ok((params, meta))
    }
}

impl Layer for Conv2d {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Conv2d {
            filters: self.filters,
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            l1: self.l1,
            l2: self.l2,
            bias_l1: self.bias_l1,
            bias_l2: self.bias_l2,
            bias: self.bias,
        }
    }

    fn build(&mut self, input: &[usize], seed: u64, device: &Device) -> Result<Vec<usize>> {
        for (name, value) in [
            ("l1", self.l1),
            ("l2", self.l2),
            ("bias_l1", self.bias_l1),
            ("bias_l2", self.bias_l2),
        ] {
            check_hyperparameter(
                name,
                value,
                value >= 0.0 && value.is_finite(),
                "finite and >= 0",
            )?;
        }
        let (params, meta) = self.geometry(input)?;
        let mut values = he_normal(meta.k * self.filters, meta.k, seed);
        if self.dirac {
            dirac_leading_filters(&mut values, meta.weight_dims());
        }
        let kernel = Tensor::from_f32(meta.weight_dims().to_vec(), values, device)?;
        let bias = Tensor::from_f32(vec![self.filters], vec![0.0; self.filters], device)?;
        self.weights = Some(ConvWeights {
            params,
            kernel,
            bias,
            kernel_f16: None,
        });
        Ok(vec![meta.h_out, meta.w_out, self.filters])
    }

    /// The f16 variants convert the input while staging it (forward) and in
    /// the backward cast, rounding to nearest either way.
    fn rounds_input_to_f16(&self, device: &Device) -> bool {
        f16_kernels_first(device.gpu_context())
    }

    /// The backward casts its gradient to f16, clipped to +-65504, first.
    fn rounds_output_grad_to_f16(&self, device: &Device) -> bool {
        f16_kernels_first(device.gpu_context())
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let kernel = self.kernel_operand()?;
        let w = self.weights()?;
        let y = conv2d_forward(x, &kernel, &w.bias, &w.params, &self.plans)?;
        if matches!(mode, Mode::Train { .. }) {
            self.input = Some(x.clone());
        }
        Ok(y)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let x = cached(&self.input, "Conv2d::backward")?.clone();
        let params = self.weights()?.params;
        let dims = x.shape().nhwc("Conv2d::backward input")?;
        // Cast dy once here for both gradients (dweight and dinput would each
        // cast it otherwise), raising the scaler's flag where asked to. An f32
        // input goes as it is: dweight reads it as f32 and converts while
        // staging, as the forward does.
        let flag = self.saturation_flag.take();
        let dy = match (dy.dtype(), flag) {
            (DType::F32, Some(scaler)) => cast_f16_flagging(dy, &scaler)?,
            (DType::F32, None) if f16_kernels_first(x.gpu_context()) => cast_f16(dy, true)?,
            _ => dy.clone(),
        };
        // Where dinput runs the halo kernel, dweight's reduce also writes the
        // flipped filter it reads: one dispatch fewer than its own flip.
        let kernel = if need_dx {
            Some(self.kernel_operand()?)
        } else {
            None
        };
        let target = match &kernel {
            Some(w) => flipped_filter_target(&dy, w, dims, &params, &self.plans)?,
            None => None,
        };
        let (dw, db, flipped) = conv2d_dweight_into(
            &x,
            &dy,
            &params,
            &self.plans,
            self.grad_outputs.as_ref(),
            kernel.as_ref().zip(target.as_ref()),
        )?;
        self.grads = Some((dw, db));
        let Some(kernel) = kernel else {
            return Ok(None);
        };
        let flipped = target.as_ref().filter(|_| flipped);
        conv2d_dinput_flipped(&dy, &kernel, flipped, dims, &params, &self.plans).map(Some)
    }

    fn trainables(&mut self) -> Vec<Param<'_>> {
        let (Some(w), Some((dw, db))) = (self.weights.as_mut(), self.grads.as_ref()) else {
            return Vec::new();
        };
        let mut trainables =
            vec![Param::new("kernel", &mut w.kernel, dw).penalties(self.l1, self.l2)];
        if self.bias {
            trainables
                .push(Param::new("bias", &mut w.bias, db).penalties(self.bias_l1, self.bias_l2));
        }
        trainables
    }

    fn regularized(&self) -> Vec<(&Tensor, f32, f32)> {
        let Some(w) = &self.weights else {
            return Vec::new();
        };
        [
            (&w.kernel, self.l1, self.l2),
            (&w.bias, self.bias_l1, self.bias_l2),
        ]
        .into_iter()
        .take(if self.bias { 2 } else { 1 })
        .filter(|(_, l1, l2)| *l1 != 0.0 || *l2 != 0.0)
        .collect()
    }

    /// The kernel's `K x filters` values and the bias's `filters`.
    fn state_values(&self, input: &[usize]) -> Result<usize> {
        let (_, meta) = self.geometry(input)?;
        let values = meta
            .k
            .checked_add(usize::from(self.bias))
            .and_then(|k| k.checked_mul(self.filters));
        state_size("Conv2d", input, values)
    }

    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        match &self.weights {
            Some(w) if self.bias => vec![("kernel", &w.kernel), ("bias", &w.bias)],
            Some(w) => vec![("kernel", &w.kernel)],
            None => Vec::new(),
        }
    }

    fn set_state(&mut self, name: &str, tensor: Tensor) -> Result<()> {
        let w = self
            .weights
            .as_mut()
            .ok_or_else(|| AetherError::InvalidShape {
                op: "Conv2d::set_state",
                shape: vec![],
                reason: "layer not built".into(),
            })?;
        match name {
            "kernel" => {
                // An unsaved zero bias follows the kernel to its device.
                if !self.bias && !w.bias.device().same_as(&tensor.device()) {
                    w.bias = w.bias.to(&tensor.device())?;
                }
                w.kernel = tensor;
            }
            "bias" if self.bias => w.bias = tensor,
            _ => {
                return Err(AetherError::InvalidShape {
                    op: "Conv2d::set_state",
                    shape: tensor.dims().to_vec(),
                    reason: format!("no tensor named {name:?}"),
                });
            }
        }
        w.kernel_f16 = None;
        Ok(())
    }

    fn params_updated(&mut self) {
        if let Some(w) = &mut self.weights {
            w.kernel_f16 = None;
        }
    }

    fn set_grad_outputs(&mut self, outputs: Vec<Tensor>) {
        self.grad_outputs = match <[Tensor; 2]>::try_from(outputs) {
            Ok([dw, db]) => Some((dw, db)),
            // Without a bias parameter the kernels still write a bias
            // gradient: into a buffer of the layer's own, made once.
            Err(outputs) => match (outputs.as_slice(), &self.weights) {
                ([dw], Some(w)) if !self.bias => {
                    let db = match self.grad_outputs.take() {
                        Some((_, db)) if db.device().same_as(&dw.device()) => Some(db),
                        _ => Tensor::from_f32(
                            vec![self.filters],
                            vec![0.0; self.filters],
                            &dw.device(),
                        )
                        .ok(),
                    };
                    db.map(|db| (dw.clone(), db))
                }
                _ => None,
            },
        };
    }

    fn set_param_shadows(&mut self, shadows: Vec<Tensor>) {
        // The kernel's shadow (the first); the bias has no f16 use.
        if let (Some(w), Some(kernel)) = (self.weights.as_mut(), shadows.into_iter().next())
            && kernel.dims() == w.kernel.dims()
            && f16_kernels_first(w.kernel.gpu_context())
        {
            w.kernel_f16 = Some(kernel);
        }
    }

    fn flag_output_grad_saturation(&mut self, scaler: &Tensor, dy: &Tensor) -> bool {
        let flags = dy.dtype() == DType::F32
            && f16_kernels_first(dy.gpu_context())
            && dy.device().same_as(&scaler.device());
        self.saturation_flag = flags.then(|| scaler.clone());
        flags
    }

    fn end_step(&mut self) {
        (self.input, self.grads) = (None, None);
        self.saturation_flag = None;
    }

    fn conv_plans(&self) -> Option<&ConvPlans> {
        Some(&self.plans)
    }

    fn conv_work(&self, input: &[usize], step: &StepKind) -> Option<ConvWork<'_>> {
        let w = self.weights.as_ref()?;
        let ctx = w.kernel.gpu_context()?;
        let [h, width, c] = hwc("Conv2d", input).ok()?;
        let meta = ConvShapeMeta::new([step.batch, h, width, c], &w.params).ok()?;
        // As `kernel_operand` and `backward` pass them: f16 on the f16 variants.
        let operands = if f16_kernels_first(Some(ctx)) {
            DType::F16
        } else {
            DType::F32
        };
        Some(ConvWork {
            plans: &self.plans,
            meta,
            params: w.params,
            input: step.input,
            weights: operands,
            backward: step.train.then_some(operands),
            input_grad: step.input_grad,
        })
    }
}

/// A fully connected layer `[N, in] -> [N, units]`, run as a 1x1 convolution
/// over one pixel of features, whose filters are its units (one count, so the
/// two cannot disagree).
pub struct Dense {
    conv: Conv2d,
}

impl Dense {
    /// `units` output features from the `[N, in]` features of the layer
    /// before (a [`Flatten`](super::Flatten) or [`GlobalAvgPool`](super::GlobalAvgPool)).
    pub fn new(units: usize) -> Self {
        Self {
            conv: Conv2d::new(units, (1, 1), Padding::Valid),
        }
    }

    /// Output features.
    pub fn units(&self) -> usize {
        self.conv.filters
    }

    /// L1 / L2 penalties on the weights and the bias.
    pub fn regularize(mut self, l1: f32, l2: f32, bias_l1: f32, bias_l2: f32) -> Self {
        self.conv = self.conv.regularize(l1, l2, bias_l1, bias_l2);
        self
    }

    /// With `false`, no bias parameter (as PyTorch's `bias=False`).
    pub fn bias(mut self, bias: bool) -> Self {
        self.conv = self.conv.bias(bias);
        self
    }

    fn as_image(x: &Tensor) -> Result<Tensor> {
        match *x.dims() {
            [n, features] => x.reshape(vec![n, 1, 1, features]),
            _ => Err(AetherError::InvalidShape {
                op: "Dense",
                shape: x.dims().to_vec(),
                reason: "expects [N, features] input (add a Flatten layer before it)".into(),
            }),
        }
    }

    /// A per-sample input of features as the conv's 1 x 1 pixel.
    fn as_pixel(input: &[usize]) -> Result<[usize; 3]> {
        let [features] = <[usize; 1]>::try_from(input).map_err(|_| AetherError::InvalidShape {
            op: "Dense",
            shape: input.to_vec(),
            reason: "expects per-sample input (features); add a Flatten layer before it".into(),
        })?;
        Ok([1, 1, features])
    }

    fn as_rows(t: &Tensor) -> Result<Tensor> {
        t.reshape(vec![t.dims()[0], t.numel() / t.dims()[0]])
    }
}

impl Layer for Dense {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Dense {
            units: self.units(),
            l1: self.conv.l1,
            l2: self.conv.l2,
            bias_l1: self.conv.bias_l1,
            bias_l2: self.conv.bias_l2,
            bias: self.conv.bias,
        }
    }

    fn build(&mut self, input: &[usize], seed: u64, device: &Device) -> Result<Vec<usize>> {
        self.conv.build(&Self::as_pixel(input)?, seed, device)?;
        Ok(vec![self.units()])
    }

    fn state_values(&self, input: &[usize]) -> Result<usize> {
        self.conv.state_values(&Self::as_pixel(input)?)
    }

    fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        Self::as_rows(&self.conv.forward(&Self::as_image(x)?, mode)?)
    }

    /// The conv's backward casts the gradient to f16, as a conv's does.
    fn rounds_output_grad_to_f16(&self, device: &Device) -> bool {
        self.conv.rounds_output_grad_to_f16(device)
    }

    fn flag_output_grad_saturation(&mut self, scaler: &Tensor, dy: &Tensor) -> bool {
        self.conv.flag_output_grad_saturation(scaler, dy)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let dy = dy.reshape(batched_dims(dy.dims()[0], &[1, 1, self.units()]))?;
        self.conv
            .backward(&dy, need_dx)?
            .map(|dx| Self::as_rows(&dx))
            .transpose()
    }

    fn trainables(&mut self) -> Vec<Param<'_>> {
        self.conv.trainables()
    }

    fn regularized(&self) -> Vec<(&Tensor, f32, f32)> {
        self.conv.regularized()
    }

    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        self.conv.state()
    }

    fn set_state(&mut self, name: &str, tensor: Tensor) -> Result<()> {
        self.conv.set_state(name, tensor)
    }

    fn conv_plans(&self) -> Option<&ConvPlans> {
        self.conv.conv_plans()
    }

    fn conv_work(&self, input: &[usize], step: &StepKind) -> Option<ConvWork<'_>> {
        self.conv.conv_work(&Self::as_pixel(input).ok()?, step)
    }

    fn params_updated(&mut self) {
        self.conv.params_updated();
    }

    fn set_grad_outputs(&mut self, outputs: Vec<Tensor>) {
        self.conv.set_grad_outputs(outputs);
    }

    fn set_param_shadows(&mut self, shadows: Vec<Tensor>) {
        self.conv.set_param_shadows(shadows);
    }

    fn end_step(&mut self) {
        self.conv.end_step();
    }
}
