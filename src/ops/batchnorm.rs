//! Batch normalization over the last (channel) axis, on the CPU and the GPU.
//!
//! The input is NHWC `[N, H, W, C]` or dense `[N, C]` (any rank >= 2 works: the last
//! axis is the channel); statistics are taken over every other element, so each
//! channel has `count = numel / C` values, seen as `count` rows of `C`.
//!
//! Numerics: the variance is always a mean of squared deviations, never the
//! one-pass `E[x^2] - E[x]^2`, which cancels catastrophically when activations
//! carry an offset, exactly when batch norm matters. The CPU takes the mean
//! first, then the deviations from it, in f64. The GPU reads the input once for
//! both: each chunk gives its sum and its squared deviations from its own mean,
//! and the finalize pass merges the chunks exactly (Chan et al.'s pairwise
//! update), so a training forward is three dispatches (moments, finalize,
//! normalize) and a backward three (sums, finalize, dx).
//!
//! Determinism: every reduction sums fixed chunks of [`CHUNK_ROWS`] rows into a
//! per-channel partials buffer `[chunks, C]` (on the GPU: in-order row lanes, then
//! a fixed workgroup tree), and a second pass adds the partials in a fixed order
//! (the CPU: chunk order in f64; the GPU: strided lanes, then a tree).
//! No atomics, so two runs on the same input give identical bits. The CPU path
//! accumulates in f64 over the same chunks.

use std::sync::Arc;

use rayon::prelude::*;

use crate::conv::cast_f16;
use crate::device::Device;
use crate::error::{AetherError, Result, check_hyperparameter};
use crate::gpu::{GpuContext, GpuSlice, PipelineKey, flat_grid};
use crate::ops::DxStorage;
use crate::ops::activation::{Activation, Smooth, activation_as, activation_backward_as};
use crate::tensor::{DType, Shape, Tensor};

const REDUCE_SHADER: &str = include_str!("../../shaders/ops/batchnorm_reduce.wgsl");
const MOMENTS_SHADER: &str = include_str!("../../shaders/ops/batchnorm_moments.wgsl");
const BACKWARD_SUMS_SHADER: &str = include_str!("../../shaders/ops/batchnorm_backward_sums.wgsl");
const FINALIZE_SHADER: &str = include_str!("../../shaders/ops/batchnorm_finalize.wgsl");
const RELU_BITS: &str = include_str!("../../shaders/ops/relu_bits.wgsl");
const SMOOTH_FORMULAS: &str = include_str!("../../shaders/ops/activation_smooth_common.wgsl");
const ACTIVATION_SHADER: &str = include_str!("../../shaders/ops/batchnorm_activation.wgsl");
const NORMALIZE_SHADER: &str = include_str!("../../shaders/ops/batchnorm_normalize.wgsl");
const BACKWARD_DX_SHADER: &str = include_str!("../../shaders/ops/batchnorm_backward_dx.wgsl");
const GRAD_FLAG: &str = include_str!("../../shaders/ops/batchnorm_grad_flag.wgsl");
const GRAD_UNFLAGGED: &str = include_str!("../../shaders/ops/batchnorm_grad_unflagged.wgsl");
const F16_BITS: &str = include_str!("../../shaders/common/f16_bits.wgsl");
const RUNNING_SHADER: &str = include_str!("../../shaders/ops/batchnorm_running.wgsl");
const GATE_SHADER: &str = include_str!("../../shaders/ops/batchnorm_gate.wgsl");

/// Rows summed into one partial, on both paths. Fixed, so the grouping (and thus
/// the rounding) never depends on the hardware or the thread count.
pub const CHUNK_ROWS: usize = 256;
/// Channel lanes per partial-sum workgroup (`TILE_LANES` in batchnorm_reduce.wgsl).
const TILE_LANES: usize = 8;
/// Row lanes of a partial-sum workgroup and the rows of a chunk each takes
/// (`ROW_LANES`, `ROWS_PER_LANE` in batchnorm_reduce.wgsl): together a chunk.
const ROW_LANES: usize = 32;
const ROWS_PER_LANE: usize = 8;
const _: () = assert!(ROW_LANES * ROWS_PER_LANE == CHUNK_ROWS);
const ELEMENTWISE_WORKGROUP: u32 = 256;
/// Workgroup size of the per-channel kernels (finalize, running statistics).
const CHANNEL_WORKGROUP: u32 = 64;

/// Batch statistics of one training step, both `[C]` f32: what the backward pass
/// and the running-statistics update need.
#[derive(Clone, Debug)]
pub struct BatchNormStats {
    pub mean: Tensor,
    /// `1 / sqrt(var + eps)`, `var` the biased batch variance.
    pub inv_std: Tensor,
}

/// What the normalize pass writes: the output's dtype, and the fused
/// activation it goes through, if any.
///
/// `DType::F16` stores each value saturated at +-65504 and rounded as `half::f16::from_f32` (NaN kept),
/// for a consumer that rounds its input to f16 anyway (a conv with f16
/// kernels): the same values it would have used, in half the bytes, and no
/// cast of its own. On the GPU it needs a channel count divisible by 4.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormOutput {
    pub activation: Option<Activation>,
    pub dtype: DType,
}

impl NormOutput {
    /// An f32 output, through `activation` where given.
    pub fn f32(activation: Option<Activation>) -> Self {
        Self {
            activation,
            dtype: DType::F32,
        }
    }
}

/// The kernels' words for a fused activation (shaders/ops/batchnorm_activation.wgsl):
/// its number (0 for none) and leaky ReLU's slope (0 for the others).
fn activation_words(activation: Option<Activation>) -> [u32; 2] {
    let (code, alpha) = match activation {
        None => (0, 0.0),
        Some(Activation::Relu) => (1, 0.0),
        Some(Activation::Smooth(Smooth::Gelu)) => (2, 0.0),
        Some(Activation::Smooth(Smooth::Silu)) => (3, 0.0),
        Some(Activation::LeakyRelu(alpha)) => (4, alpha),
    };
    [code, f32::to_bits(alpha)]
}

/// A leaky ReLU's slope must be finite.
fn check_activation(op: &'static str, x: &Tensor, activation: Option<Activation>) -> Result<()> {
    match activation {
        Some(Activation::LeakyRelu(alpha)) if !alpha.is_finite() => {
            Err(AetherError::InvalidShape {
                op,
                shape: x.dims().to_vec(),
                reason: format!("leaky ReLU's alpha must be finite, got {alpha}"),
            })
        }
        _ => Ok(()),
    }
}

/// The activation a training forward fused ([`NormOutput::activation`]) and
/// the beta it normalized with: the backward takes the activation's gradient
/// first, at the normalized value recomputed from `x`, the statistics, gamma
/// and beta as the forward computed it (nothing of the forward's output is
/// kept or read), as the activation layer's own backward would at its input.
#[derive(Clone, Copy, Debug)]
pub struct FusedGrad<'a> {
    pub activation: Activation,
    pub beta: &'a Tensor,
}

/// Training-mode forward: normalizes `x` with its own batch statistics,
/// `y = (x - mean) * inv_std * gamma + beta`, and returns them for the backward
/// pass. `gamma` and `beta` are `[C]`.
pub fn batch_norm_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<(Tensor, BatchNormStats)> {
    train(x, gamma, beta, eps, NormOutput::f32(None), None).map(|(y, stats, _)| (y, stats))
}

/// [`batch_norm_train`] followed by ReLU (`relu(y)`, NaN passing through), in
/// the same kernel on the GPU: the pair a conv block ends with, without a pass
/// over the activations of its own. Bit-identical to the two ops in turn.
pub fn batch_norm_relu_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<(Tensor, BatchNormStats)> {
    let out = NormOutput::f32(Some(Activation::Relu));
    train(x, gamma, beta, eps, out, None).map(|(y, stats, _)| (y, stats))
}

/// [`batch_norm_train`] through `out.activation` (ReLU, leaky ReLU, GELU or
/// SiLU), its output stored as `out.dtype`: on the GPU the activation runs in
/// the normalize kernel, computed by its layer's formula.
pub fn batch_norm_train_as(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    out: NormOutput,
) -> Result<(Tensor, BatchNormStats)> {
    train(x, gamma, beta, eps, out, None).map(|(y, stats, _)| (y, stats))
}

/// The running statistics a training step folds its batch statistics into,
/// and how fast (see [`update_running_stats`]).
#[derive(Clone, Copy, Debug)]
pub struct RunningStats<'a> {
    pub mean: &'a Tensor,
    pub var: &'a Tensor,
    pub momentum: f32,
}

/// [`batch_norm_train`] (through `out.activation`, as [`batch_norm_relu_train`];
/// its output as `out.dtype`) followed by [`update_running_stats`] with its batch
/// statistics: returns the new running mean and variance too. On the GPU the
/// pass that finishes the batch statistics writes the running ones as well,
/// so they take no dispatch of their own. Bit-identical to the separate calls.
pub fn batch_norm_train_running(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    out: NormOutput,
    running: RunningStats<'_>,
) -> Result<(Tensor, BatchNormStats, (Tensor, Tensor))> {
    let (y, stats, new) = train(x, gamma, beta, eps, out, Some(running))?;
    Ok((y, stats, new.expect("asked for the running statistics")))
}

/// New running mean and variance.
type NewRunning = (Tensor, Tensor);
/// A training forward, with the running statistics updated where `running` is given.
type Trained = (Tensor, BatchNormStats, Option<NewRunning>);

fn train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    out: NormOutput,
    running: Option<RunningStats<'_>>,
) -> Result<Trained> {
    const OP: &str = "batch_norm_train";
    check_epsilon(eps)?;
    if let Some(running) = &running {
        check_momentum(running.momentum)?;
    }
    let layout = Layout::of(OP, x)?;
    require_channel_vectors(OP, layout.channels, &[gamma, beta])?;
    same_device(OP, &[x, gamma, beta])?;
    let lanes = Lanes::of(layout).holding(OP, out.dtype, x)?;
    check_activation(OP, x, out.activation)?;
    // The running statistics, checked, with their unbiased-variance scale.
    let running = running
        .map(|r| {
            require_channel_vectors(OP, layout.channels, &[r.mean, r.var])?;
            same_device(OP, &[x, r.mean, r.var])?;
            Ok((r, unbiased_scale(OP, layout.rows, layout.channels)?))
        })
        .transpose()?;
    if let (Some(xs), Some(g), Some(b)) = (x.host_f32(), gamma.host_f32(), beta.host_f32()) {
        let (y, mean, inv_std) = train_cpu(xs, g, b, layout, eps);
        let device = x.device();
        let stats = BatchNormStats {
            mean: Tensor::from_f32(vec![layout.channels], mean, &device)?,
            inv_std: Tensor::from_f32(vec![layout.channels], inv_std, &device)?,
        };
        let new = running
            .map(|(r, _)| update_running_stats(r.mean, r.var, &stats, layout.rows, r.momentum, eps))
            .transpose()?;
        return Ok((output_cpu(x, y, out)?, stats, new));
    }
    let ctx = gpu_context(x);
    let moments = partial_sums(
        ctx,
        "batchnorm_moments",
        MOMENTS_SHADER,
        &[x],
        layout,
        Lanes::of(layout),
        activation_words(None),
    )?;
    let ([mean, inv_std], new) = finalize(
        ctx,
        &moments,
        layout,
        Finish::MeanInvStd,
        eps,
        running,
        None,
    )?;
    let y = normalize_gpu(ctx, x, lanes, [&mean, &inv_std], [gamma, beta], None, out)?;
    Ok((y, BatchNormStats { mean, inv_std }, new))
}

/// `count / (count - 1)`, which makes the batch variance unbiased; a typed
/// error below 2 values per channel.
fn unbiased_scale(op: &'static str, count: usize, channels: usize) -> Result<f32> {
    if count < 2 {
        return Err(AetherError::InvalidShape {
            op,
            shape: vec![count, channels],
            reason: "the unbiased variance needs at least 2 values per channel".into(),
        });
    }
    Ok((count as f64 / (count as f64 - 1.0)) as f32)
}

/// The running statistics after one training step, as new tensors, in the
/// Keras/Aether-ML convention `running = momentum * running + (1 - momentum) * batch`
/// (so `momentum` near 1, e.g. 0.99, moves slowly). The batch variance is
/// recovered from `stats.inv_std` as `1 / inv_std^2 - eps` and made unbiased,
/// times `count / (count - 1)`, before it enters the running variance; `count`
/// is the number of values per channel (`numel / C`) of the batch and must be at
/// least 2. `eps` must be the one the statistics were computed with.
pub fn update_running_stats(
    running_mean: &Tensor,
    running_var: &Tensor,
    stats: &BatchNormStats,
    count: usize,
    momentum: f32,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "update_running_stats";
    check_epsilon(eps)?;
    check_momentum(momentum)?;
    let channels = running_mean.numel();
    require_channel_vectors(
        OP,
        channels,
        &[running_mean, running_var, &stats.mean, &stats.inv_std],
    )?;
    same_device(
        OP,
        &[running_mean, running_var, &stats.mean, &stats.inv_std],
    )?;
    let unbiased_scale = unbiased_scale(OP, count, channels)?;
    if let (Some(rm), Some(rv), Some(mean), Some(inv_std)) = (
        running_mean.host_f32(),
        running_var.host_f32(),
        stats.mean.host_f32(),
        stats.inv_std.host_f32(),
    ) {
        let mut new_mean = Vec::with_capacity(channels);
        let mut new_var = Vec::with_capacity(channels);
        for c in 0..channels {
            let s = inv_std[c];
            let batch_var = (1.0 / (s * s) - eps).max(0.0) * unbiased_scale;
            new_mean.push(momentum * rm[c] + (1.0 - momentum) * mean[c]);
            new_var.push(momentum * rv[c] + (1.0 - momentum) * batch_var);
        }
        let device = running_mean.device();
        return Ok((
            Tensor::from_f32(vec![channels], new_mean, &device)?,
            Tensor::from_f32(vec![channels], new_var, &device)?,
        ));
    }
    let ctx = gpu_context(running_mean);
    let pipeline = pipeline(ctx, "batchnorm_running", || RUNNING_SHADER.into())?;
    let new_mean = Tensor::uninit_gpu(ctx, Shape::new([channels])?, DType::F32)?;
    let new_var = Tensor::uninit_gpu(ctx, Shape::new([channels])?, DType::F32)?;
    let (grid, row_stride) = flat_grid(channels, CHANNEL_WORKGROUP, max_groups(ctx));
    let params = [
        channels as u32,
        row_stride,
        momentum.to_bits(),
        eps.to_bits(),
        unbiased_scale.to_bits(),
    ];
    ctx.dispatch(
        "batchnorm_running",
        &pipeline,
        &[
            buf(running_mean),
            buf(running_var),
            buf(&stats.mean),
            buf(&stats.inv_std),
            buf(&new_mean),
            buf(&new_var),
        ],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok((new_mean, new_var))
}

/// The running statistics to keep after a training step that proposed
/// `(new_mean, new_var)` over `(old_mean, old_var)`: the new ones where the
/// optimizer's `gate` (see [`crate::optim::Adam::gate`]) is open, else the
/// old ones, so a step with a non-finite loss or gradient leaves them as they
/// were. On the GPU one small dispatch decides, with no read-back; it writes
/// into the new tensors, which the caller no longer shares.
pub fn gated_running_stats(
    old: (&Tensor, &Tensor),
    new: (Tensor, Tensor),
    gate: &Tensor,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "gated_running_stats";
    let channels = old.0.numel();
    require_channel_vectors(OP, channels, &[old.0, old.1, &new.0, &new.1])?;
    same_device(OP, &[old.0, old.1, &new.0, &new.1, gate])?;
    if gate.dtype() != DType::U32 || gate.numel() != 1 {
        return Err(AetherError::InvalidShape {
            op: OP,
            shape: gate.dims().to_vec(),
            reason: "the gate is one U32 value".into(),
        });
    }
    let Device::Gpu(ctx) = gate.device() else {
        let open = gate.to_vec_u32()?[0] == u32::MAX;
        return Ok(if open {
            new
        } else {
            (old.0.clone(), old.1.clone())
        });
    };
    let pipeline = pipeline(&ctx, "batchnorm_gate", || GATE_SHADER.into())?;
    let (grid, row_stride) = flat_grid(channels, CHANNEL_WORKGROUP, max_groups(&ctx));
    ctx.dispatch(
        "batchnorm_gate",
        &pipeline,
        &[buf(old.0), buf(old.1), buf(gate), buf(&new.0), buf(&new.1)],
        bytemuck::cast_slice(&[channels as u32, row_stride]),
        grid,
    )?;
    Ok(new)
}

/// Inference-mode forward with the running statistics:
/// `y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta`; all four
/// vectors are `[C]`.
pub fn batch_norm_inference(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    let out = NormOutput::f32(None);
    batch_norm_inference_as(x, gamma, beta, running_mean, running_var, eps, out)
}

/// [`batch_norm_inference`] followed by ReLU, in one kernel on the GPU.
pub fn batch_norm_relu_inference(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    let out = NormOutput::f32(Some(Activation::Relu));
    batch_norm_inference_as(x, gamma, beta, running_mean, running_var, eps, out)
}

/// [`batch_norm_inference`] (through `out.activation`, as [`batch_norm_relu_inference`]),
/// its output as `out.dtype`.
pub fn batch_norm_inference_as(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    eps: f32,
    out: NormOutput,
) -> Result<Tensor> {
    const OP: &str = "batch_norm_inference";
    check_epsilon(eps)?;
    let layout = Layout::of(OP, x)?;
    let vectors = [gamma, beta, running_mean, running_var];
    require_channel_vectors(OP, layout.channels, &vectors)?;
    same_device(OP, &[x, gamma, beta, running_mean, running_var])?;
    let lanes = Lanes::of(layout).holding(OP, out.dtype, x)?;
    check_activation(OP, x, out.activation)?;
    if let (Some(xs), Some(g), Some(b), Some(rm), Some(rv)) = (
        x.host_f32(),
        gamma.host_f32(),
        beta.host_f32(),
        running_mean.host_f32(),
        running_var.host_f32(),
    ) {
        let inv_std: Vec<f32> = rv.iter().map(|&v| 1.0 / (v + eps).sqrt()).collect();
        return output_cpu(x, normalize_cpu(xs, rm, &inv_std, g, b), out);
    }
    let ctx = gpu_context(x);
    let stats = [running_mean, running_var];
    normalize_gpu(ctx, x, lanes, stats, [gamma, beta], Some(eps), out)
}

/// The CPU path's output: `y` through the fused activation (the activation
/// layer's own op), then stored as `out.dtype`.
fn output_cpu(x: &Tensor, y: Vec<f32>, out: NormOutput) -> Result<Tensor> {
    let y = Tensor::from_f32(x.dims().to_vec(), y, &x.device())?;
    let y = match out.activation {
        None => y,
        Some(activation) => activation_as(&y, activation, DType::F32)?,
    };
    match out.dtype {
        DType::F16 => cast_f16(&y, true),
        _ => Ok(y),
    }
}

/// Training-mode backward: `(dx, dgamma, dbeta)` for the upstream gradient `dy`
/// (shaped like `x`), with the statistics [`batch_norm_train`] returned:
/// `dgamma = sum(dy * xhat)`, `dbeta = sum(dy)` per channel and
/// `dx = gamma * inv_std / count * (count * dy - dbeta - xhat * dgamma)`,
/// `xhat = (x - mean) * inv_std`.
pub fn batch_norm_backward(
    dy: &Tensor,
    x: &Tensor,
    gamma: &Tensor,
    stats: &BatchNormStats,
) -> Result<(Tensor, Tensor, Tensor)> {
    backward_into(
        dy,
        x,
        gamma,
        stats,
        None,
        None,
        DxStorage::plain(DType::F32),
    )
}

/// The backward of [`batch_norm_relu_train`] with the `beta` it was given:
/// `dy` is taken where the normalized value, recomputed from `x`, is > 0
/// (ReLU's gradient at its input, 0 for NaN) inside the batch-norm kernels,
/// so no masked copy of `dy` is made and the output is not read.
/// Bit-identical to `relu_backward` of the unfused output followed by
/// [`batch_norm_backward`] where the compiler evaluates the recomputation as
/// the forward did (the CPU, lavapipe).
pub fn batch_norm_relu_backward(
    dy: &Tensor,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    stats: &BatchNormStats,
) -> Result<(Tensor, Tensor, Tensor)> {
    let fused = FusedGrad {
        activation: Activation::Relu,
        beta,
    };
    let dx = DxStorage::plain(DType::F32);
    backward_into(dy, x, gamma, stats, Some(fused), None, dx)
}

/// [`batch_norm_backward`] (through the fused activation's gradient first
/// where given, as [`batch_norm_relu_backward`]) with dx stored as `dx`:
/// `DType::F16` clips it to +-65504 (NaN kept, +-inf clamped) and rounds it
/// as `half::f16::from_f32`, exactly as a conv with f16 kernels casts the
/// gradient it is given, for a conv before this layer. On the GPU that needs
/// a channel count divisible by 4.
pub fn batch_norm_backward_as(
    dy: &Tensor,
    x: &Tensor,
    gamma: &Tensor,
    stats: &BatchNormStats,
    fused: Option<FusedGrad<'_>>,
    dx: DType,
) -> Result<(Tensor, Tensor, Tensor)> {
    backward_into(dy, x, gamma, stats, fused, None, DxStorage::plain(dx))
}

/// Whether backward dx can flag its f16 saturation on `ctx`: its kernel then
/// binds 10 storage buffers, one past the least device aether accepts (9).
pub(crate) fn flags_dx_saturation(ctx: &GpuContext) -> bool {
    ctx.caps().limits.max_storage_buffers_per_shader_stage >= 10
}

/// [`batch_norm_backward_as`] with dx stored as `dx_out` says; on the GPU,
/// writing `(dgamma, dbeta)` into `outputs` when given (a layer's segments of
/// the optimizer's packed gradients).
pub(crate) fn backward_into(
    dy: &Tensor,
    x: &Tensor,
    gamma: &Tensor,
    stats: &BatchNormStats,
    fused: Option<FusedGrad<'_>>,
    outputs: Option<&(Tensor, Tensor)>,
    dx_out: DxStorage<'_>,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "batch_norm_backward";
    let dx_dtype = dx_out.dtype;
    let layout = Layout::of(OP, x)?;
    require_f32(OP, dy)?;
    if dy.dims() != x.dims() {
        return Err(AetherError::ShapeMismatch {
            op: OP,
            expected: x.dims().to_vec(),
            actual: dy.dims().to_vec(),
        });
    }
    require_channel_vectors(OP, layout.channels, &[gamma, &stats.mean, &stats.inv_std])?;
    same_device(OP, &[dy, x, gamma, &stats.mean, &stats.inv_std])?;
    if let Some((dgamma, dbeta)) = outputs {
        dgamma.expect_output_for("batch_norm_backward dgamma output", &[layout.channels], x)?;
        dbeta.expect_output_for("batch_norm_backward dbeta output", &[layout.channels], x)?;
    }
    let lanes = Lanes::of(layout);
    let dx_lanes = lanes.with_gradients(OP, dx_dtype, x)?;
    if let Some(fused) = fused {
        require_channel_vectors(OP, layout.channels, &[fused.beta])?;
        same_device(OP, &[dy, fused.beta])?;
        check_activation(OP, x, Some(fused.activation))?;
        if dy.host_f32().is_some() {
            // The CPU path takes the activation's gradient first, by the
            // activation layer's own op, then the plain backward.
            let through = activation_grad_cpu(fused, dy, x, gamma, stats)?;
            return backward_into(&through, x, gamma, stats, None, None, dx_out);
        }
    }
    if let (Some(dys), Some(xs), Some(g), Some(mean), Some(inv_std)) = (
        dy.host_f32(),
        x.host_f32(),
        gamma.host_f32(),
        stats.mean.host_f32(),
        stats.inv_std.host_f32(),
    ) {
        let (dx, dgamma, dbeta) = backward_cpu(dys, xs, g, mean, inv_std, layout);
        let device = x.device();
        let dx = Tensor::from_f32(x.dims().to_vec(), dx, &device)?;
        return Ok((
            match dx_dtype {
                DType::F16 => cast_f16(&dx, true)?,
                _ => dx,
            },
            Tensor::from_f32(vec![layout.channels], dgamma, &device)?,
            Tensor::from_f32(vec![layout.channels], dbeta, &device)?,
        ));
    }
    let ctx = gpu_context(x);
    // An f32 dx is not rounded: nothing to flag. Checked before anything is
    // recorded.
    let flag = dx_out.saturation_flag.filter(|_| dx_dtype == DType::F16);
    if let Some(scaler) = flag {
        same_device(OP, &[x, scaler])?;
        if !flags_dx_saturation(ctx) {
            return Err(AetherError::Gpu {
                during: "batch_norm_backward",
                message: "asked to flag dx's saturation where the kernel cannot bind the scaler"
                    .into(),
            });
        }
    }
    let [code, alpha] = activation_words(fused.map(|f| f.activation));
    // Without an activation beta is not read: gamma stands in for it.
    let beta = fused.map_or(gamma, |f| f.beta);
    let sums = partial_sums(
        ctx,
        "batchnorm_backward_sums",
        BACKWARD_SUMS_SHADER,
        &[dy, x, &stats.mean, &stats.inv_std, gamma, beta],
        layout,
        lanes,
        [code, alpha],
    )?;
    let into = outputs.map(|(dgamma, dbeta)| [dbeta, dgamma]);
    let ([dbeta, dgamma], _) = finalize(ctx, &sums, layout, Finish::Sums, 0.0, None, into)?;
    let (kernel, flag_source) = match flag {
        Some(_) => ("batchnorm_backward_dx_flag", GRAD_FLAG),
        None => ("batchnorm_backward_dx", GRAD_UNFLAGGED),
    };
    let pipeline = dx_lanes.pipeline(ctx, kernel, &[flag_source, BACKWARD_DX_SHADER])?;
    let dx = Tensor::uninit_gpu(ctx, x.shape().clone(), dx_dtype)?;
    let len = x.numel() / lanes.width;
    let (grid, row_stride) = flat_grid(len, ELEMENTWISE_WORKGROUP, max_groups(ctx));
    let params = [
        len as u32,
        (layout.channels / lanes.width) as u32,
        layout.rows as u32,
        row_stride,
        code,
        alpha,
    ];
    let mut buffers = vec![
        buf(dy),
        buf(x),
        buf(&stats.mean),
        buf(&stats.inv_std),
        buf(gamma),
        buf(beta),
        buf(&dbeta),
        buf(&dgamma),
        buf(&dx),
    ];
    if let Some(scaler) = flag {
        buffers.push(buf(scaler));
    }
    ctx.dispatch(
        "batchnorm_backward_dx",
        &pipeline,
        &buffers,
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok((dx, dgamma, dbeta))
}

/// `eps` must be finite and positive: 0 divides by a zero variance, NaN or
/// a negative one takes the square root of less than 0.
pub(crate) fn check_epsilon(eps: f32) -> Result<()> {
    let valid = eps > 0.0 && eps.is_finite();
    check_hyperparameter("BatchNorm epsilon", eps, valid, "finite and > 0")
}

/// `momentum` weighs the running statistics against the batch's: in [0, 1].
pub(crate) fn check_momentum(momentum: f32) -> Result<()> {
    let valid = (0.0..=1.0).contains(&momentum);
    check_hyperparameter("BatchNorm momentum", momentum, valid, "in [0, 1]")
}

/// `x` seen as `rows` rows of `channels` values.
#[derive(Clone, Copy)]
struct Layout {
    channels: usize,
    rows: usize,
}

impl Layout {
    fn of(op: &'static str, x: &Tensor) -> Result<Self> {
        require_f32(op, x)?;
        if x.host_f32().is_none() {
            super::require_u32_elements(op, x)?;
        }
        match x.dims() {
            [.., _, channels] => Ok(Self {
                channels: *channels,
                rows: x.numel() / channels,
            }),
            dims => Err(AetherError::InvalidShape {
                op,
                shape: dims.to_vec(),
                reason: "expected rank >= 2 with channels last ([N, H, W, C] or [N, C])".into(),
            }),
        }
    }
}

/// Checks that each tensor is an f32 `[channels]` vector.
fn require_channel_vectors(op: &'static str, channels: usize, tensors: &[&Tensor]) -> Result<()> {
    for t in tensors {
        require_f32(op, t)?;
        if t.dims() != [channels] {
            return Err(AetherError::ShapeMismatch {
                op,
                expected: vec![channels],
                actual: t.dims().to_vec(),
            });
        }
    }
    Ok(())
}

fn require_f32(op: &'static str, t: &Tensor) -> Result<()> {
    t.expect_dtype(op, DType::F32)
}

fn same_device(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    let first = tensors[0].device();
    match tensors.iter().find(|t| !t.device().same_as(&first)) {
        None => Ok(()),
        Some(other) => Err(AetherError::DeviceMismatch {
            op,
            a: first.name(),
            b: other.device().name(),
        }),
    }
}

// ---- CPU path -------------------------------------------------------------

/// Per-channel sums of `K` terms, `term(flat index)` for every element: f64
/// partials over chunks of [`CHUNK_ROWS`] rows (in parallel), added in chunk order.
fn cpu_channel_sums<const K: usize>(
    layout: Layout,
    term: impl Fn(usize) -> [f64; K] + Sync,
) -> [Vec<f64>; K] {
    let Layout { channels, rows } = layout;
    let zeros = || std::array::from_fn(|_| vec![0.0; channels]);
    let partials: Vec<[Vec<f64>; K]> = (0..rows.div_ceil(CHUNK_ROWS))
        .into_par_iter()
        .map(|chunk| {
            let mut sums: [Vec<f64>; K] = zeros();
            let end = ((chunk + 1) * CHUNK_ROWS).min(rows);
            for row in chunk * CHUNK_ROWS..end {
                for c in 0..channels {
                    let terms = term(row * channels + c);
                    for (sum, t) in sums.iter_mut().zip(terms) {
                        sum[c] += t;
                    }
                }
            }
            sums
        })
        .collect();
    let mut total: [Vec<f64>; K] = zeros();
    for partial in &partials {
        for (sum, part) in total.iter_mut().zip(partial) {
            for (s, p) in sum.iter_mut().zip(part) {
                *s += p;
            }
        }
    }
    total
}

/// `(y, mean, inv_std)` of the training forward.
fn train_cpu(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    layout: Layout,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let channels = layout.channels;
    let count = layout.rows as f64;
    let [sums] = cpu_channel_sums(layout, |i| [f64::from(x[i])]);
    let mean: Vec<f64> = sums.iter().map(|s| s / count).collect();
    let [squares] = cpu_channel_sums(layout, |i| {
        let d = f64::from(x[i]) - mean[i % channels];
        [d * d]
    });
    let inv_std: Vec<f32> = squares
        .iter()
        .map(|s| (1.0 / (s / count + f64::from(eps)).sqrt()) as f32)
        .collect();
    let mean: Vec<f32> = mean.iter().map(|&m| m as f32).collect();
    let y = normalize_cpu(x, &mean, &inv_std, gamma, beta);
    (y, mean, inv_std)
}

/// `(x - mean) * inv_std * gamma + beta` per channel, in the GPU kernel's order.
fn normalize_cpu(
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    gamma: &[f32],
    beta: &[f32],
) -> Vec<f32> {
    let channels = mean.len();
    let mut y = vec![0.0; x.len()];
    y.par_chunks_mut(channels * CHUNK_ROWS)
        .zip(x.par_chunks(channels * CHUNK_ROWS))
        .for_each(|(y_rows, x_rows)| {
            for (y_row, x_row) in y_rows.chunks_mut(channels).zip(x_rows.chunks(channels)) {
                for c in 0..channels {
                    y_row[c] = (x_row[c] - mean[c]) * inv_std[c] * gamma[c] + beta[c];
                }
            }
        });
    y
}

/// `(dx, dgamma, dbeta)` of the training backward.
fn backward_cpu(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    layout: Layout,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let channels = layout.channels;
    let count = layout.rows as f64;
    let xhat = |i: usize| {
        let c = i % channels;
        (f64::from(x[i]) - f64::from(mean[c])) * f64::from(inv_std[c])
    };
    let [sum_dy, sum_dy_xhat] = cpu_channel_sums(layout, |i| {
        let g = f64::from(dy[i]);
        [g, g * xhat(i)]
    });
    let mut dx = vec![0.0; x.len()];
    dx.par_chunks_mut(channels * CHUNK_ROWS)
        .enumerate()
        .for_each(|(chunk, dx_rows)| {
            let first = chunk * channels * CHUNK_ROWS;
            for (offset, d) in dx_rows.iter_mut().enumerate() {
                let i = first + offset;
                let c = i % channels;
                let scale = f64::from(gamma[c]) * f64::from(inv_std[c]);
                let centered =
                    f64::from(dy[i]) - sum_dy[c] / count - xhat(i) * (sum_dy_xhat[c] / count);
                *d = (scale * centered) as f32;
            }
        });
    let narrow = |v: Vec<f64>| v.into_iter().map(|s| s as f32).collect();
    (dx, narrow(sum_dy_xhat), narrow(sum_dy))
}

/// `dy` through the fused activation's gradient on the CPU, as the activation
/// layer's backward takes it at its input: the normalized value, recomputed
/// by [`normalize_cpu`] as the forward computed it.
fn activation_grad_cpu(
    fused: FusedGrad<'_>,
    dy: &Tensor,
    x: &Tensor,
    gamma: &Tensor,
    stats: &BatchNormStats,
) -> Result<Tensor> {
    // Checked f32 and on dy's device, the host, by the caller.
    fn host(t: &Tensor) -> &[f32] {
        t.host_f32().expect("an f32 operand on the host")
    }
    let z = normalize_cpu(
        host(x),
        host(&stats.mean),
        host(&stats.inv_std),
        host(gamma),
        host(fused.beta),
    );
    let z = Tensor::from_f32(x.dims().to_vec(), z, &Device::Cpu)?;
    activation_backward_as(&z, dy, fused.activation, DType::F32)
}

// ---- GPU path -------------------------------------------------------------

/// What the second reduction pass makes of a channel's two partials.
#[derive(Clone, Copy)]
enum Finish {
    /// (sum, m2 about the chunk mean) -> (mean, inv_std).
    MeanInvStd = 0,
    /// Two plain sums.
    Sums = 1,
}

fn gpu_context(t: &Tensor) -> &Arc<GpuContext> {
    t.gpu_context()
        .expect("a tensor not on the host is on a GPU")
}

fn buf(t: &Tensor) -> GpuSlice<'_> {
    t.gpu_slice().expect("operand checked to be on the GPU")
}

fn max_groups(ctx: &GpuContext) -> u32 {
    ctx.caps().limits.max_compute_workgroups_per_dimension
}

fn pipeline(
    ctx: &GpuContext,
    kernel: &'static str,
    source: impl FnOnce() -> std::borrow::Cow<'static, str>,
) -> Result<Arc<wgpu::ComputePipeline>> {
    ctx.pipelines()
        .require(&PipelineKey::new(kernel, "portable"), "main", source)
}

/// How many consecutive channels an invocation of the elementwise and
/// partial-sum kernels moves: 4 where the channel count divides by 4
/// (shaders/ops/batchnorm_lanes4.wgsl), else 1; and how normalize stores
/// its output and backward dx its gradient.
#[derive(Clone, Copy)]
struct Lanes {
    width: usize,
    /// F32, or F16 (width 4 only; shaders/ops/batchnorm_act_f16.wgsl).
    activations: DType,
    /// How backward dx is stored: F32, or clipped F16 (width 4 only;
    /// shaders/ops/batchnorm_grad_f16.wgsl).
    gradients: DType,
}

impl Lanes {
    fn of(layout: Layout) -> Self {
        Self {
            width: if layout.channels.is_multiple_of(4) {
                4
            } else {
                1
            },
            activations: DType::F32,
            gradients: DType::F32,
        }
    }

    /// These lanes with activations stored as `dtype`: f32, or f16 where the
    /// GPU kernels can pack it (4 lanes) or on the CPU; else a typed error
    /// naming `x`'s shape.
    fn holding(self, op: &'static str, dtype: DType, x: &Tensor) -> Result<Self> {
        Self::check_storage(op, "activations", dtype, self.width, x)?;
        Ok(Self {
            activations: dtype,
            ..self
        })
    }

    /// These lanes with backward dx stored as `dtype`, checked as in
    /// [`Lanes::holding`].
    fn with_gradients(self, op: &'static str, dtype: DType, x: &Tensor) -> Result<Self> {
        Self::check_storage(op, "dx", dtype, self.width, x)?;
        Ok(Self {
            gradients: dtype,
            ..self
        })
    }

    /// `Ok` for f32, and for f16 where the GPU kernels can pack it (4 lanes)
    /// or on the CPU; else a typed error naming `x`'s shape.
    fn check_storage(
        op: &'static str,
        what: &str,
        dtype: DType,
        width: usize,
        x: &Tensor,
    ) -> Result<()> {
        let packs = width == 4 || x.host_f32().is_some();
        match dtype {
            DType::F32 => Ok(()),
            DType::F16 if packs => Ok(()),
            _ => Err(AetherError::InvalidShape {
                op,
                shape: x.dims().to_vec(),
                reason: format!(
                    "{what} as {dtype:?}: f32, or f16 where the channel count divides by 4"
                ),
            }),
        }
    }

    /// `kernel`'s pipeline at this width and activation storage: ReLU's bit
    /// tests, the smooth activations' formulas, the fused-activation switch,
    /// the lane and storage headers, then `sources`.
    fn pipeline(
        self,
        ctx: &GpuContext,
        kernel: &'static str,
        sources: &[&'static str],
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        const LANES4: &str = include_str!("../../shaders/ops/batchnorm_lanes4.wgsl");
        const LANES1: &str = include_str!("../../shaders/ops/batchnorm_lanes1.wgsl");
        const ACT_F32: &str = include_str!("../../shaders/ops/batchnorm_act_f32.wgsl");
        const ACT_F16: &str = include_str!("../../shaders/ops/batchnorm_act_f16.wgsl");
        const GRAD_F32: &str = include_str!("../../shaders/ops/batchnorm_grad_f32.wgsl");
        const GRAD_F16: &str = include_str!("../../shaders/ops/batchnorm_grad_f16.wgsl");
        use DType::F16;
        let (variant, headers): (_, &[&str]) = match (self.width, self.activations, self.gradients)
        {
            (4, F16, F16) => (
                "lanes4_f16act_f16grad",
                &[LANES4, F16_BITS, ACT_F16, GRAD_F16],
            ),
            (4, F16, _) => ("lanes4_f16act", &[LANES4, F16_BITS, ACT_F16, GRAD_F32]),
            (4, _, F16) => ("lanes4_f16grad", &[LANES4, F16_BITS, ACT_F32, GRAD_F16]),
            (4, _, _) => ("lanes4", &[LANES4, ACT_F32, GRAD_F32]),
            _ => ("lanes1", &[LANES1, ACT_F32, GRAD_F32]),
        };
        ctx.pipelines()
            .require(&PipelineKey::new(kernel, variant), "main", || {
                [
                    &[RELU_BITS, SMOOTH_FORMULAS, ACTIVATION_SHADER],
                    headers,
                    sources,
                ]
                .concat()
                .concat()
                .into()
            })
    }
}

/// Records a partial-sum kernel (`source` after the reduce prelude): one workgroup
/// per (channel tile, chunk of rows), a [`Lanes`] of channels per invocation,
/// writing two partials buffers `[chunks, C]` bound after `inputs`.
fn partial_sums(
    ctx: &Arc<GpuContext>,
    kernel: &'static str,
    source: &'static str,
    inputs: &[&Tensor],
    layout: Layout,
    lanes: Lanes,
    [activation, alpha]: [u32; 2],
) -> Result<[Tensor; 2]> {
    let pipeline = lanes.pipeline(ctx, kernel, &[REDUCE_SHADER, source])?;
    let chunks = layout.rows.div_ceil(CHUNK_ROWS);
    let partial = || Tensor::uninit_gpu(ctx, Shape::new([chunks, layout.channels])?, DType::F32);
    let partials = [partial()?, partial()?];
    let channel_lanes = layout.channels / lanes.width;
    let channel_tiles = channel_lanes.div_ceil(TILE_LANES);
    let groups = channel_tiles * chunks;
    let (grid, group_stride) = flat_grid(groups, 1, max_groups(ctx));
    let params = [
        channel_lanes as u32,
        layout.rows as u32,
        CHUNK_ROWS as u32,
        channel_tiles as u32,
        groups as u32,
        group_stride,
        activation,
        alpha,
    ];
    let buffers: Vec<GpuSlice<'_>> = inputs.iter().copied().chain(&partials).map(buf).collect();
    ctx.dispatch(
        kernel,
        &pipeline,
        &buffers,
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(partials)
}

/// Records the second reduction pass: per channel (one workgroup each), both
/// partials summed in a fixed order and finished as `finish` says, into
/// `outputs` when given; with `running` (and its unbiased-variance scale), the
/// new running statistics too.
fn finalize(
    ctx: &Arc<GpuContext>,
    [partial_a, partial_b]: &[Tensor; 2],
    layout: Layout,
    finish: Finish,
    eps: f32,
    running: Option<(RunningStats<'_>, f32)>,
    outputs: Option<[&Tensor; 2]>,
) -> Result<([Tensor; 2], Option<NewRunning>)> {
    let pipeline = pipeline(ctx, "batchnorm_finalize", || FINALIZE_SHADER.into())?;
    let out = || Tensor::uninit_gpu(ctx, Shape::new([layout.channels])?, DType::F32);
    let (out_a, out_b) = match outputs {
        Some([a, b]) => (a.clone(), b.clone()),
        None => (out()?, out()?),
    };
    let new = match running {
        Some(_) => Some((out()?, out()?)),
        None => None,
    };
    // Without an update, the running bindings are stand-ins the kernel never
    // touches: read-only ones share the partials, writable ones the outputs.
    let (running_in, new_out, momentum, unbiased) = match (running, &new) {
        (Some((r, unbiased)), Some((new_mean, new_var))) => (
            [buf(r.mean), buf(r.var)],
            [buf(new_mean), buf(new_var)],
            r.momentum,
            unbiased,
        ),
        _ => (
            [buf(partial_a), buf(partial_b)],
            [buf(&out_a), buf(&out_b)],
            0.0,
            0.0,
        ),
    };
    // One workgroup per channel: a "grid row" is `row_stride` workgroups.
    let (grid, row_stride) = flat_grid(layout.channels, 1, max_groups(ctx));
    let params = [
        layout.channels as u32,
        layout.rows.div_ceil(CHUNK_ROWS) as u32,
        layout.rows as u32,
        CHUNK_ROWS as u32,
        eps.to_bits(),
        finish as u32,
        row_stride,
        u32::from(new.is_some()),
        momentum.to_bits(),
        unbiased.to_bits(),
    ];
    ctx.dispatch(
        "batchnorm_finalize",
        &pipeline,
        &[
            buf(partial_a),
            buf(partial_b),
            buf(&out_a),
            buf(&out_b),
            running_in[0],
            running_in[1],
            new_out[0],
            new_out[1],
        ],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(([out_a, out_b], new))
}

/// Records the normalize kernel. `spread` is inv_std, or with `variance_eps` the
/// variance to turn into `1 / sqrt(var + eps)`; `out` says which fused
/// activation runs and the output's dtype (`lanes`' activations).
fn normalize_gpu(
    ctx: &Arc<GpuContext>,
    x: &Tensor,
    lanes: Lanes,
    [mean, spread]: [&Tensor; 2],
    [gamma, beta]: [&Tensor; 2],
    variance_eps: Option<f32>,
    out: NormOutput,
) -> Result<Tensor> {
    let pipeline = lanes.pipeline(ctx, "batchnorm_normalize", &[NORMALIZE_SHADER])?;
    let y = Tensor::uninit_gpu(ctx, x.shape().clone(), out.dtype)?;
    let len = x.numel() / lanes.width;
    let (grid, row_stride) = flat_grid(len, ELEMENTWISE_WORKGROUP, max_groups(ctx));
    let params = [
        len as u32,
        (mean.numel() / lanes.width) as u32,
        row_stride,
        u32::from(variance_eps.is_some()),
        variance_eps.unwrap_or(0.0).to_bits(),
        activation_words(out.activation)[0],
        activation_words(out.activation)[1],
    ];
    ctx.dispatch(
        "batchnorm_normalize",
        &pipeline,
        &[
            buf(x),
            buf(mean),
            buf(spread),
            buf(gamma),
            buf(beta),
            buf(&y),
        ],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(y)
}
