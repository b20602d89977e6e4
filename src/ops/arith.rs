//! Elementwise sums and constant scaling, on the CPU and the GPU: the residual
//! `Add`, the `Scale` layer, and the sum of the gradients a tensor receives
//! from every layer it feeds.

use rayon::prelude::*;

use super::activation::{check_operands, gpu_elementwise, record_elementwise};
use crate::error::{AetherError, Result};
use crate::gpu::PipelineKey;
use crate::tensor::Tensor;

const RELU_BITS: &str = include_str!("../../shaders/ops/relu_bits.wgsl");
const LANES4: &str = include_str!("../../shaders/ops/arith_lanes4.wgsl");
const LANES1: &str = include_str!("../../shaders/ops/arith_lanes1.wgsl");
const ADD_SHADER: &str = include_str!("../../shaders/ops/add.wgsl");
const ADD_RELU_SHADER: &str = include_str!("../../shaders/ops/add_relu.wgsl");
const ADD_RELU_BACKWARD_SHADER: &str = include_str!("../../shaders/ops/add_relu_backward.wgsl");
const SCALE_SHADER: &str = include_str!("../../shaders/ops/scale.wgsl");

/// Records an arith kernel (written against `Value` and `Bits`,
/// shaders/ops/arith_lanes*.wgsl) over GPU `inputs`, already checked, into
/// one new f32 output of their shape: four values an invocation where the
/// length divides by 4 (16-byte loads), else one.
fn gpu_arith(kernel: &'static str, source: &'static str, inputs: &[&Tensor]) -> Result<Tensor> {
    let first = inputs[0];
    let ctx = first.gpu_context().expect("non-host tensor is on a GPU");
    let (width, variant, lanes) = match first.numel() % 4 {
        0 => (4, "lanes4", LANES4),
        _ => (1, "lanes1", LANES1),
    };
    let pipeline = ctx
        .pipelines()
        .require(&PipelineKey::new(kernel, variant), "main", || {
            [RELU_BITS, lanes, source].concat().into()
        })?;
    record_elementwise(kernel, &pipeline, inputs, first.numel() / width, &[])
}

/// `a + b` elementwise; both f32 of one shape on one device.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    check_operands("add", &[a, b])?;
    if let (Some(xs), Some(ys)) = (a.host_f32(), b.host_f32()) {
        let sum = xs.par_iter().zip(ys).map(|(&x, &y)| x + y).collect();
        return Tensor::from_f32(a.dims().to_vec(), sum, &a.device());
    }
    gpu_arith("add", ADD_SHADER, &[a, b])
}

/// `relu(a + b)` elementwise in one pass (a residual add and the ReLU after
/// it); both f32 of one shape on one device. NaN passes through, as
/// [`relu`](super::relu::relu) lets it.
pub fn add_relu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    check_operands("add_relu", &[a, b])?;
    if let (Some(xs), Some(ys)) = (a.host_f32(), b.host_f32()) {
        let sum = xs
            .par_iter()
            .zip(ys)
            .map(|(&x, &y)| {
                let v = x + y;
                if v < 0.0 { 0.0 } else { v }
            })
            .collect();
        return Tensor::from_f32(a.dims().to_vec(), sum, &a.device());
    }
    gpu_arith("add_relu", ADD_RELU_SHADER, &[a, b])
}

/// `a + b` where `y > 0`, else 0, in one pass: ReLU's gradient
/// ([`relu_backward`](super::activation::relu_backward)`(y, a + b)`) of two
/// gradients summed, as a model sums what a forked tensor receives before
/// the ReLU folded into the layer it flows into. All f32 of one shape on one
/// device; bit for bit the two passes' result.
pub fn add_relu_backward(a: &Tensor, b: &Tensor, y: &Tensor) -> Result<Tensor> {
    check_operands("add_relu_backward", &[a, b, y])?;
    if let (Some(xs), Some(zs), Some(ys)) = (a.host_f32(), b.host_f32(), y.host_f32()) {
        let dx = xs
            .par_iter()
            .zip(zs)
            .zip(ys)
            .map(|((&x, &z), &v)| if v > 0.0 { x + z } else { 0.0 })
            .collect();
        return Tensor::from_f32(a.dims().to_vec(), dx, &a.device());
    }
    gpu_arith("add_relu_backward", ADD_RELU_BACKWARD_SHADER, &[a, b, y])
}

/// `factor * x` elementwise; `factor` must be finite.
pub fn scale(x: &Tensor, factor: f32) -> Result<Tensor> {
    check_operands("scale", &[x])?;
    if !factor.is_finite() {
        return Err(AetherError::InvalidShape {
            op: "scale",
            shape: x.dims().to_vec(),
            reason: format!("factor must be finite, got {factor}"),
        });
    }
    if let Some(xs) = x.host_f32() {
        let y = xs.par_iter().map(|&v| factor * v).collect();
        return Tensor::from_f32(x.dims().to_vec(), y, &x.device());
    }
    gpu_elementwise("scale", "main", SCALE_SHADER, &[x], &[factor.to_bits()])
}
