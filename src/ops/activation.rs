//! Activation backward passes, leaky ReLU, and the f16-storing forwards and
//! backwards of the four elementwise activations, on the CPU and the GPU.
//!
//! Every op here is elementwise over tensors of one shape, so they share one
//! launch helper (also used by dropout's backward pass): a flat 1-D grid, the
//! inputs bound in order, then the output, then `[len, row_stride, extra...]`
//! as the uniform block. The derivative at exactly 0 is taken as the left one
//! (0 for ReLU, `alpha` for leaky ReLU), the usual convention; a NaN input
//! also takes the `x <= 0` branch, so a NaN `x` gives `alpha * x` (NaN) forward
//! and `alpha * dy` backward.

use std::sync::Arc;

use rayon::prelude::*;

use crate::conv::cast_f16;
use crate::error::{AetherError, Result};
use crate::gpu::{GpuContext, GpuSlice, PipelineKey, flat_grid};
use crate::ops::{DxStorage, stores_f16};
use crate::tensor::{DType, Tensor};

const RELU_BACKWARD_SHADER: &str = concat!(
    include_str!("../../shaders/ops/relu_bits.wgsl"),
    include_str!("../../shaders/ops/activation_relu_backward.wgsl")
);
/// The f16-storing backward (activation_grad_f16.wgsl), without and with
/// the loss scaler's saturation flag.
macro_rules! grad_f16 {
    ($flag:literal) => {
        concat!(
            include_str!("../../shaders/ops/relu_bits.wgsl"),
            include_str!("../../shaders/common/f16_bits.wgsl"),
            include_str!("../../shaders/ops/activation_smooth_common.wgsl"),
            include_str!($flag),
            include_str!("../../shaders/ops/activation_grad_f16.wgsl")
        )
    };
}
const GRAD_F16_SHADER: &str = grad_f16!("../../shaders/ops/activation_grad_unflagged.wgsl");
const GRAD_F16_FLAG_SHADER: &str = grad_f16!("../../shaders/ops/activation_grad_flag.wgsl");
const LEAKY_RELU_SHADER: &str = include_str!("../../shaders/ops/activation_leaky_relu.wgsl");
const LEAKY_RELU_BACKWARD_SHADER: &str = concat!(
    include_str!("../../shaders/ops/relu_bits.wgsl"),
    include_str!("../../shaders/ops/activation_leaky_relu_backward.wgsl")
);

/// Threads per workgroup of every elementwise kernel in this module and in dropout.
pub(crate) const WORKGROUP: u32 = 256;

/// ReLU's gradient: `dy` where `x > 0`, else 0. `x` and `dy` are f32 of one shape.
pub fn relu_backward(x: &Tensor, dy: &Tensor) -> Result<Tensor> {
    check_operands("relu_backward", &[x, dy])?;
    if let (Some(xs), Some(dys)) = (x.host_f32(), dy.host_f32()) {
        let dx = xs
            .par_iter()
            .zip(dys)
            .map(|(&v, &d)| if v > 0.0 { d } else { 0.0 })
            .collect();
        return Tensor::from_f32(x.dims().to_vec(), dx, &x.device());
    }
    gpu_elementwise("relu_backward", "main", RELU_BACKWARD_SHADER, &[x, dy], &[])
}

/// Leaky ReLU: `x` where `x > 0`, else `alpha * x`. `alpha` must be finite.
pub fn leaky_relu(x: &Tensor, alpha: f32) -> Result<Tensor> {
    check_operands("leaky_relu", &[x])?;
    check_alpha("leaky_relu", x, alpha)?;
    if let Some(xs) = x.host_f32() {
        let y = xs
            .par_iter()
            .map(|&v| if v > 0.0 { v } else { alpha * v })
            .collect();
        return Tensor::from_f32(x.dims().to_vec(), y, &x.device());
    }
    gpu_elementwise(
        "leaky_relu",
        "main",
        LEAKY_RELU_SHADER,
        &[x],
        &[alpha.to_bits()],
    )
}

/// Leaky ReLU's gradient: `dy` where `x > 0`, else `alpha * dy`.
pub fn leaky_relu_backward(x: &Tensor, dy: &Tensor, alpha: f32) -> Result<Tensor> {
    check_operands("leaky_relu_backward", &[x, dy])?;
    check_alpha("leaky_relu_backward", x, alpha)?;
    if let (Some(xs), Some(dys)) = (x.host_f32(), dy.host_f32()) {
        let dx = xs
            .par_iter()
            .zip(dys)
            .map(|(&v, &d)| if v > 0.0 { d } else { alpha * d })
            .collect();
        return Tensor::from_f32(x.dims().to_vec(), dx, &x.device());
    }
    gpu_elementwise(
        "leaky_relu_backward",
        "main",
        LEAKY_RELU_BACKWARD_SHADER,
        &[x, dy],
        &[alpha.to_bits()],
    )
}

/// The gradient of `activation` at its input `x` for `dy`, stored as `dx`:
/// F32 as [`relu_backward`], [`leaky_relu_backward`] and
/// [`smooth_activation_backward`] return it; F16 clipped to +-65504 (NaN
/// kept) and rounded as `half::f16::from_f32`, exactly as a conv with f16
/// kernels casts the gradient it is given, for a conv before the activation.
pub fn activation_backward_as(
    x: &Tensor,
    dy: &Tensor,
    activation: Activation,
    dx: DType,
) -> Result<Tensor> {
    activation_backward_into(x, dy, activation, DxStorage::plain(dx))
}

/// [`activation_backward_as`] with dx stored as `dx_out` says: an f16 one
/// raises the loss scaler's saturation flag where given, on the GPU.
pub(crate) fn activation_backward_into(
    x: &Tensor,
    dy: &Tensor,
    activation: Activation,
    dx_out: DxStorage<'_>,
) -> Result<Tensor> {
    let f32_grad = || match activation {
        Activation::Relu => relu_backward(x, dy),
        Activation::LeakyRelu(alpha) => leaky_relu_backward(x, dy, alpha),
        Activation::Smooth(kind) => smooth_activation_backward(x, dy, kind),
    };
    // The entry point (and the dispatches' label), its pipelines' kernel
    // names without and with the flag, and leaky ReLU's slope.
    let (entry, [plain, flagged], alpha) = match activation {
        Activation::Relu => (
            "relu_backward",
            ["relu_backward_f16", "relu_backward_f16_flag"],
            0.0,
        ),
        Activation::LeakyRelu(alpha) => (
            "leaky_relu_backward",
            ["leaky_relu_backward_f16", "leaky_relu_backward_f16_flag"],
            alpha,
        ),
        Activation::Smooth(Smooth::Gelu) => (
            "gelu_backward",
            ["gelu_backward_f16", "gelu_backward_f16_flag"],
            0.0,
        ),
        Activation::Smooth(Smooth::Silu) => (
            "silu_backward",
            ["silu_backward_f16", "silu_backward_f16_flag"],
            0.0,
        ),
    };
    if !stores_f16(entry, x.dims(), "dx as", dx_out.dtype)? {
        return f32_grad();
    }
    check_operands(entry, &[x, dy])?;
    check_alpha(entry, x, alpha)?;
    if x.host_f32().is_some() {
        return cast_f16(&f32_grad()?, true);
    }
    let flag = dx_out.flag_beside(entry, x)?;
    let ctx = x.gpu_context().expect("non-host tensor is on a GPU");
    let (kernel, source) = match flag {
        Some(_) => (flagged, GRAD_F16_FLAG_SHADER),
        None => (plain, GRAD_F16_SHADER),
    };
    let pipeline = elementwise_pipeline(ctx, kernel, entry, source)?;
    let dx = Tensor::uninit_gpu(ctx, x.shape().clone(), DType::F16)?;
    let len = x.numel();
    let (grid, row_stride) = elementwise_grid(ctx, len.div_ceil(8));
    let params = [len as u32, row_stride, alpha.to_bits()];
    let mut buffers = vec![
        x.gpu_slice().expect("GPU"),
        dy.gpu_slice().expect("GPU"),
        dx.gpu_slice().expect("GPU"),
    ];
    buffers.extend(flag.map(|s| s.gpu_slice().expect("checked on the GPU")));
    ctx.dispatch(
        entry,
        &pipeline,
        &buffers,
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(dx)
}

fn check_alpha(op: &'static str, x: &Tensor, alpha: f32) -> Result<()> {
    if alpha.is_finite() {
        Ok(())
    } else {
        Err(AetherError::InvalidShape {
            op,
            shape: x.dims().to_vec(),
            reason: format!("alpha must be finite, got {alpha}"),
        })
    }
}

/// Checks that the operands of an elementwise op are f32, on one device, of one
/// shape, and indexable with u32 (the kernels' and the RNG's index type).
pub(crate) fn check_operands(op: &'static str, operands: &[&Tensor]) -> Result<()> {
    let Some((first, rest)) = operands.split_first() else {
        return Ok(());
    };
    for t in operands {
        if t.dtype() != DType::F32 {
            return Err(AetherError::InvalidShape {
                op,
                shape: t.dims().to_vec(),
                reason: format!("expected F32, got {:?}", t.dtype()),
            });
        }
    }
    for t in rest {
        if !t.device().same_as(&first.device()) {
            return Err(AetherError::DeviceMismatch {
                op,
                a: first.device().name(),
                b: t.device().name(),
            });
        }
        if t.dims() != first.dims() {
            return Err(AetherError::ShapeMismatch {
                op,
                expected: first.dims().to_vec(),
                actual: t.dims().to_vec(),
            });
        }
    }
    super::require_u32_elements(op, first)
}

/// The compiled pipeline for `kernel` (entry point `entry` of `source`).
pub(crate) fn elementwise_pipeline(
    ctx: &GpuContext,
    kernel: &'static str,
    entry: &'static str,
    source: &'static str,
) -> Result<Arc<wgpu::ComputePipeline>> {
    ctx.pipelines()
        .require(&PipelineKey::new(kernel, "portable"), entry, || {
            source.into()
        })
}

/// The flat grid over `len` elements and its row stride.
pub(crate) fn elementwise_grid(ctx: &GpuContext, len: usize) -> ([u32; 3], u32) {
    flat_grid(
        len,
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    )
}

/// Records `kernel` over GPU `inputs` (already checked by [`check_operands`])
/// into one new output of the first input's shape; the uniform block is
/// `[len, row_stride, extra...]`.
pub(crate) fn gpu_elementwise(
    kernel: &'static str,
    entry: &'static str,
    source: &'static str,
    inputs: &[&Tensor],
    extra: &[u32],
) -> Result<Tensor> {
    let ctx = inputs[0]
        .gpu_context()
        .expect("non-host tensor is on a GPU");
    let pipeline = elementwise_pipeline(ctx, kernel, entry, source)?;
    record_elementwise(kernel, &pipeline, inputs, inputs[0].numel(), extra)
}

/// Records `pipeline` (of `kernel`) over GPU `inputs`, bound in order and
/// then one new f32 output of the first input's shape, on `invocations`
/// invocations (elements, or lanes of several); the uniform block is
/// `[invocations, row_stride, extra...]`.
pub(crate) fn record_elementwise(
    kernel: &'static str,
    pipeline: &wgpu::ComputePipeline,
    inputs: &[&Tensor],
    invocations: usize,
    extra: &[u32],
) -> Result<Tensor> {
    let first = inputs[0];
    let ctx = first.gpu_context().expect("non-host tensor is on a GPU");
    let output = Tensor::uninit_gpu(ctx, first.shape().clone(), DType::F32)?;
    let (grid, row_stride) = elementwise_grid(ctx, invocations);
    let mut params = vec![invocations as u32, row_stride];
    params.extend_from_slice(extra);
    let mut buffers: Vec<GpuSlice<'_>> =
        inputs.iter().map(|t| t.gpu_slice().expect("GPU")).collect();
    buffers.push(output.gpu_slice().expect("GPU"));
    ctx.dispatch(
        kernel,
        pipeline,
        &buffers,
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(output)
}

const SMOOTH_SHADER: &str = concat!(
    include_str!("../../shaders/ops/activation_smooth_common.wgsl"),
    include_str!("../../shaders/ops/activation_smooth.wgsl")
);
const ACTIVATION_F16_SHADER: &str = concat!(
    include_str!("../../shaders/ops/relu_bits.wgsl"),
    include_str!("../../shaders/common/f16_bits.wgsl"),
    include_str!("../../shaders/ops/activation_smooth_common.wgsl"),
    include_str!("../../shaders/ops/activation_f16.wgsl")
);
const SMOOTH_BACKWARD_SHADER: &str = concat!(
    include_str!("../../shaders/ops/activation_smooth_common.wgsl"),
    include_str!("../../shaders/ops/activation_smooth_backward.wgsl")
);

const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), in f32 in the order
/// the GPU kernels evaluate it, so both devices agree to a few ulps.
fn erf_approx(v: f32) -> f32 {
    let a = v.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152 + t * 1.061_405_4))));
    let e = 1.0 - poly * (-a * a).exp();
    if v < 0.0 { -e } else { e }
}

fn gelu_of(v: f32) -> f32 {
    0.5 * v * (1.0 + erf_approx(v * std::f32::consts::FRAC_1_SQRT_2))
}

fn gelu_slope(v: f32) -> f32 {
    let cdf = 0.5 * (1.0 + erf_approx(v * std::f32::consts::FRAC_1_SQRT_2));
    cdf + v * FRAC_1_SQRT_2PI * (-0.5 * v * v).exp()
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

fn silu_of(v: f32) -> f32 {
    v * sigmoid(v)
}

fn silu_slope(v: f32) -> f32 {
    let s = sigmoid(v);
    s * (1.0 + v * (1.0 - s))
}

/// A smooth activation: GELU (exact, erf form, as PyTorch's `nn.GELU()`) or
/// SiLU (`x * sigmoid(x)`, also called swish).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Smooth {
    Gelu,
    Silu,
}

impl Smooth {
    fn value(self, v: f32) -> f32 {
        match self {
            Self::Gelu => gelu_of(v),
            Self::Silu => silu_of(v),
        }
    }

    fn slope(self, v: f32) -> f32 {
        match self {
            Self::Gelu => gelu_slope(v),
            Self::Silu => silu_slope(v),
        }
    }

    /// Kernel names, which key the pipeline cache, and entry points.
    fn kernels(self) -> (&'static str, &'static str) {
        match self {
            Self::Gelu => ("gelu", "gelu_backward"),
            Self::Silu => ("silu", "silu_backward"),
        }
    }
}

/// An elementwise activation, as a layer that fuses one (a BatchNorm or a
/// residual `Add` applying the activation layer after it to its own output,
/// see `Layer::fuse_activation`) or the f16-storing backward
/// ([`activation_backward_as`]) takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Relu,
    /// Leaky ReLU with this slope below zero.
    LeakyRelu(f32),
    Smooth(Smooth),
}

impl Activation {
    /// The activation an activation layer applies, where it is one of these.
    pub fn of(spec: &crate::nn::LayerSpec) -> Option<Self> {
        use crate::nn::LayerSpec;
        match *spec {
            LayerSpec::ReLU => Some(Self::Relu),
            LayerSpec::LeakyReLU { alpha } => Some(Self::LeakyRelu(alpha)),
            LayerSpec::GELU => Some(Self::Smooth(Smooth::Gelu)),
            LayerSpec::SiLU => Some(Self::Smooth(Smooth::Silu)),
            _ => None,
        }
    }
}

/// The activation `kind` elementwise over f32 `x`; NaN passes through.
pub fn smooth_activation(x: &Tensor, kind: Smooth) -> Result<Tensor> {
    let (kernel, _) = kind.kernels();
    check_operands(kernel, &[x])?;
    if let Some(xs) = x.host_f32() {
        let y = xs.par_iter().map(|&v| kind.value(v)).collect();
        return Tensor::from_f32(x.dims().to_vec(), y, &x.device());
    }
    gpu_elementwise(kernel, kernel, SMOOTH_SHADER, &[x], &[])
}

/// [`smooth_activation`] stored as `output` (see [`activation_as`]).
pub fn smooth_activation_as(x: &Tensor, kind: Smooth, output: DType) -> Result<Tensor> {
    activation_as(x, Activation::Smooth(kind), output)
}

/// `activation` elementwise over f32 `x`, stored as `output`: F32 as
/// [`crate::ops::relu`], [`leaky_relu`] and [`smooth_activation`] return it,
/// or F16 for a consumer that rounds its input to f16 anyway (saturated at
/// +-65504 and rounded as `half::f16::from_f32`, NaN kept: the values it
/// would have rounded to, in half the bytes).
pub fn activation_as(x: &Tensor, activation: Activation, output: DType) -> Result<Tensor> {
    let f32_output = || match activation {
        Activation::Relu => crate::ops::relu(x),
        Activation::LeakyRelu(alpha) => leaky_relu(x, alpha),
        Activation::Smooth(kind) => smooth_activation(x, kind),
    };
    let (kernel, alpha) = match activation {
        Activation::Relu => ("relu", 0.0),
        Activation::LeakyRelu(alpha) => ("leaky_relu", alpha),
        Activation::Smooth(kind) => (kind.kernels().0, 0.0),
    };
    if !stores_f16(kernel, x.dims(), "output", output)? {
        return f32_output();
    }
    check_operands(kernel, &[x])?;
    check_alpha(kernel, x, alpha)?;
    if x.host_f32().is_some() {
        return cast_f16(&f32_output()?, true);
    }
    let ctx = x.gpu_context().expect("non-host tensor is on a GPU");
    let key = PipelineKey::new(kernel, "f16_output");
    let pipeline = ctx
        .pipelines()
        .require(&key, kernel, || ACTIVATION_F16_SHADER.into())?;
    let y = Tensor::uninit_gpu(ctx, x.shape().clone(), DType::F16)?;
    let len = x.numel();
    let (grid, row_stride) = elementwise_grid(ctx, len.div_ceil(8));
    let params = [len as u32, row_stride, alpha.to_bits()];
    ctx.dispatch(
        kernel,
        &pipeline,
        &[x.gpu_slice().expect("GPU"), y.gpu_slice().expect("GPU")],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(y)
}

/// The gradient of [`smooth_activation`]: `dy * f'(x)`.
pub fn smooth_activation_backward(x: &Tensor, dy: &Tensor, kind: Smooth) -> Result<Tensor> {
    let (_, kernel) = kind.kernels();
    check_operands(kernel, &[x, dy])?;
    if let (Some(xs), Some(dys)) = (x.host_f32(), dy.host_f32()) {
        let dx = xs
            .par_iter()
            .zip(dys)
            .map(|(&v, &d)| d * kind.slope(v))
            .collect();
        return Tensor::from_f32(x.dims().to_vec(), dx, &x.device());
    }
    gpu_elementwise(kernel, kernel, SMOOTH_BACKWARD_SHADER, &[x, dy], &[])
}
