//! The loss side of a classifier: softmax and its backward, the fused softmax +
//! cross-entropy, cross-entropy on probabilities, and the count of correct rows.
//!
//! Operands are `[N, K]` f32 (a row per sample, a column per class) and labels a
//! U32 `[N]` tensor of class indices. Label smoothing `s` turns the one-hot target
//! into `t = (1 - s) * onehot + s / K`.
//!
//! The GPU runs one thread per row (K is a classifier head's class count, so a
//! row is a short loop), writes each row's loss already divided by N, and then
//! sums the rows by a fixed 256-wide tree, level by level, so the loss is the
//! same bit for bit on every run (no atomics). The kernels use their own exp and
//! log (see `shaders/ops/loss_common.wgsl`) so that the tiny loss and gradient of
//! a confident, correct row keep their relative accuracy even for logits of
//! magnitude 80; the CPU path gets the same by working in f64.
//!
//! Out-of-range labels: the CPU path checks every label and returns
//! [`AetherError::InvalidShape`] for one `>= K`. The GPU path cannot look at the
//! labels without a read back, so there such a label matches no class: it is never
//! counted correct, and its row's target is `s / K` for every class (with `s = 0`
//! the row contributes nothing).

use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{AetherError, Result};
use crate::gpu::{GpuContext, GpuSlice, PipelineKey, flat_grid};
use crate::tensor::{DType, Shape, Tensor};

const COMMON: &str = include_str!("../../shaders/ops/loss_common.wgsl");
const SOFTMAX: &str = include_str!("../../shaders/ops/loss_softmax.wgsl");
const SOFTMAX_BACKWARD: &str = include_str!("../../shaders/ops/loss_softmax_backward.wgsl");
const SOFTMAX_CROSS_ENTROPY: &str = concat!(
    include_str!("../../shaders/ops/loss_softmax_cross_entropy_row.wgsl"),
    include_str!("../../shaders/ops/loss_softmax_cross_entropy.wgsl")
);
const SOFTMAX_CROSS_ENTROPY_SUMS: &str = concat!(
    include_str!("../../shaders/ops/loss_softmax_cross_entropy_row.wgsl"),
    include_str!("../../shaders/ops/loss_softmax_cross_entropy_sums.wgsl")
);
const CROSS_ENTROPY: &str = include_str!("../../shaders/ops/loss_cross_entropy.wgsl");
const CORRECT: &str = include_str!("../../shaders/ops/loss_correct.wgsl");
const SUM: &str = include_str!("../../shaders/ops/loss_sum.wgsl");

/// `@workgroup_size` of the row kernels (one thread per row).
const ROWS_PER_WORKGROUP: u32 = 64;
/// `@workgroup_size` of `loss_sum.wgsl`: values added per workgroup and level;
/// also the most rows `loss_softmax_cross_entropy_sums.wgsl` takes.
const SUM_WORKGROUP: u32 = 256;

/// Probabilities are clipped to `[P_MIN, P_MAX]` before the log, as in Aether-ML
/// (the bounds are those f32 values; the kernel uses the same).
const P_MIN: f32 = 1e-7;
const P_MAX: f32 = 1.0 - 1e-7;

/// Row-wise softmax of `[N, K]` logits, computed as `exp(x - max) / sum`.
pub fn softmax(logits: &Tensor) -> Result<Tensor> {
    let (rows, classes) = matrix("softmax", logits)?;
    if let Some(x) = logits.host_f32() {
        let mut probs = vec![0.0f32; x.len()];
        probs
            .par_chunks_mut(classes)
            .zip(x.par_chunks(classes))
            .for_each(|(out, row)| {
                let m = f64::from(row[row_max(row).0]);
                let exps: Vec<f64> = row.iter().map(|&v| (f64::from(v) - m).exp()).collect();
                let total: f64 = exps.iter().sum();
                for (o, e) in out.iter_mut().zip(exps) {
                    *o = (e / total) as f32;
                }
            });
        return Tensor::from_f32(logits.dims().to_vec(), probs, &logits.device());
    }
    let ctx = gpu_context(logits);
    let probs = Tensor::uninit_gpu(ctx, logits.shape().clone(), DType::F32)?;
    dispatch_rows(
        ctx,
        "loss_softmax",
        SOFTMAX,
        &[buffer(logits), buffer(&probs)],
        false,
        (rows, classes),
        0.0,
    )?;
    Ok(probs)
}

/// Gradient of the loss through [`softmax`]: given the forward output `probs` and
/// the incoming gradient `dprobs` (both `[N, K]`), `dx = p * (dp - sum(dp * p))`
/// per row. The GPU forms `dp - sum(dp * p)` around the row's largest `p` so a
/// near one-hot row does not cancel in f32 (see the kernel); the CPU uses f64.
pub fn softmax_backward(probs: &Tensor, dprobs: &Tensor) -> Result<Tensor> {
    let op = "softmax_backward";
    let (rows, classes) = matrix(op, probs)?;
    matrix(op, dprobs)?;
    if dprobs.dims() != probs.dims() {
        return Err(AetherError::ShapeMismatch {
            op,
            expected: probs.dims().to_vec(),
            actual: dprobs.dims().to_vec(),
        });
    }
    same_device(op, probs, dprobs)?;
    if let (Some(p), Some(dp)) = (probs.host_f32(), dprobs.host_f32()) {
        let mut dx = vec![0.0f32; p.len()];
        dx.par_chunks_mut(classes)
            .zip(p.par_chunks(classes).zip(dp.par_chunks(classes)))
            .for_each(|(out, (p, dp))| {
                let dot: f64 = p
                    .iter()
                    .zip(dp)
                    .map(|(&p, &d)| f64::from(p) * f64::from(d))
                    .sum();
                for ((o, &p), &d) in out.iter_mut().zip(p).zip(dp) {
                    *o = (f64::from(p) * (f64::from(d) - dot)) as f32;
                }
            });
        return Tensor::from_f32(probs.dims().to_vec(), dx, &probs.device());
    }
    let ctx = gpu_context(probs);
    let dx = Tensor::uninit_gpu(ctx, probs.shape().clone(), DType::F32)?;
    dispatch_rows(
        ctx,
        "loss_softmax_backward",
        SOFTMAX_BACKWARD,
        &[buffer(probs), buffer(dprobs), buffer(&dx)],
        false,
        (rows, classes),
        0.0,
    )?;
    Ok(dx)
}

/// The fused SoftmaxCategoricalCrossEntropy on `[N, K]` logits and `[N]` labels.
///
/// Returns `(loss, dlogits)`: `loss` is a `[1]` tensor, the mean over rows of
/// `-sum_k t_k log softmax(x)_k` (by log-sum-exp, stable for any magnitude), and
/// `dlogits = (softmax(x) - t) / N`. A label `>= K` is an error on the CPU; on the
/// GPU it matches no class (target `s / K` everywhere), see the module docs.
pub fn softmax_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    label_smoothing: f32,
) -> Result<(Tensor, Tensor)> {
    softmax_cross_entropy_scaled(logits, labels, label_smoothing, None)
}

/// [`softmax_cross_entropy`] with the gradient multiplied by a loss scale
/// `S` (`dlogits = (softmax(x) - t) S / N`; the loss itself is not scaled):
/// `scale` is a U32 tensor on the logits' device whose first word holds `S`
/// as f32 bits (a [`crate::optim::LossScaler`]'s state), read where the
/// kernel runs, so a scale the GPU moved needs no read back. `S` is a power
/// of two, so the gradient is exactly `S` times the unscaled one.
pub fn softmax_cross_entropy_scaled(
    logits: &Tensor,
    labels: &Tensor,
    label_smoothing: f32,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let op = "softmax_cross_entropy";
    let (rows, classes) = matrix(op, logits)?;
    check_labels(op, logits, labels, rows)?;
    check_smoothing(op, logits, label_smoothing)?;
    if let (Some(x), Some(y)) = (logits.host_f32(), labels.host_u32()) {
        check_label_range(op, y, classes)?;
        let s = f64::from(label_smoothing);
        let inv_rows = 1.0 / rows as f64;
        let grad_scale = host_scale(op, scale, logits)?;
        let mut dlogits = vec![0.0f32; x.len()];
        let row_losses: Vec<f64> = dlogits
            .par_chunks_mut(classes)
            .zip(x.par_chunks(classes).zip(y.par_iter()))
            .map(|(grad, (row, &label))| {
                softmax_cross_entropy_row(row, label as usize, s, inv_rows, grad_scale, grad)
            })
            .collect();
        let loss = row_losses.iter().sum::<f64>() as f32;
        let device = logits.device();
        return Ok((
            Tensor::from_f32(vec![1], vec![loss], &device)?,
            Tensor::from_f32(logits.dims().to_vec(), dlogits, &device)?,
        ));
    }
    check_scale(op, scale, logits)?;
    let ctx = gpu_context(logits);
    let dlogits = Tensor::uninit_gpu(ctx, logits.shape().clone(), DType::F32)?;
    let row_losses = Tensor::uninit_gpu(ctx, Shape::new([rows])?, DType::F32)?;
    dispatch_rows(
        ctx,
        "loss_softmax_cross_entropy",
        SOFTMAX_CROSS_ENTROPY,
        &[
            buffer(logits),
            buffer(labels),
            buffer(&dlogits),
            buffer(&row_losses),
            buffer(scale.unwrap_or(labels)),
        ],
        scale.is_some(),
        (rows, classes),
        label_smoothing,
    )?;
    Ok((sum_in_order(ctx, row_losses)?, dlogits))
}

/// [`softmax_cross_entropy`] and [`correct_count`] of the same logits and
/// labels, as a training step needs them: `(loss, correct, dlogits)`. On a GPU
/// up to 256 rows take one dispatch for all three, with the same bits as the
/// two functions' four dispatches (the row losses are added by the same tree).
pub fn softmax_cross_entropy_with_correct(
    logits: &Tensor,
    labels: &Tensor,
    label_smoothing: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    softmax_cross_entropy_with_correct_scaled(logits, labels, label_smoothing, None)
}

/// [`softmax_cross_entropy_with_correct`] with the gradient scaled as
/// [`softmax_cross_entropy_scaled`] scales it.
pub fn softmax_cross_entropy_with_correct_scaled(
    logits: &Tensor,
    labels: &Tensor,
    label_smoothing: f32,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "softmax_cross_entropy_with_correct";
    let (rows, classes) = matrix(op, logits)?;
    check_labels(op, logits, labels, rows)?;
    check_smoothing(op, logits, label_smoothing)?;
    if logits.host_f32().is_some() || rows > SUM_WORKGROUP as usize {
        let (loss, dlogits) = softmax_cross_entropy_scaled(logits, labels, label_smoothing, scale)?;
        return Ok((loss, correct_count(logits, labels)?, dlogits));
    }
    check_scale(op, scale, logits)?;
    let ctx = gpu_context(logits);
    let dlogits = Tensor::uninit_gpu(ctx, logits.shape().clone(), DType::F32)?;
    let loss = Tensor::uninit_gpu(ctx, Shape::new([1])?, DType::F32)?;
    let correct = Tensor::uninit_gpu(ctx, Shape::new([1])?, DType::U32)?;
    let pipeline = pipeline(
        ctx,
        "loss_softmax_cross_entropy_sums",
        scale.is_some(),
        || format!("{COMMON}\n{SOFTMAX_CROSS_ENTROPY_SUMS}"),
    )?;
    // One workgroup; `matrix` checked that rows * classes fits in u32.
    let params = [rows as u32, classes as u32, 0, label_smoothing.to_bits()];
    ctx.dispatch(
        "loss_softmax_cross_entropy_sums",
        &pipeline,
        &[
            buffer(logits),
            buffer(labels),
            buffer(&dlogits),
            buffer(&loss),
            buffer(&correct),
            buffer(scale.unwrap_or(labels)),
        ],
        bytemuck::cast_slice(&params),
        [1, 1, 1],
    )?;
    Ok((loss, correct, dlogits))
}

/// One row of [`softmax_cross_entropy`] in f64: writes `(p - t) S / N` into `grad`
/// and returns the row's loss divided by N. With `m` the maximum at index `a` and
/// `rest = sum_{j != a} exp(x_j - m)`, the loss is `sum_k t_k (m - x_k) + log1p(rest)`
/// and `p_a - t_a = (1 - t_a) - rest / (1 + rest)`: no cancellation, so a
/// confident correct row keeps its tiny loss and gradient.
fn softmax_cross_entropy_row(
    row: &[f32],
    label: usize,
    smoothing: f64,
    inv_rows: f64,
    grad_scale: f64,
    grad: &mut [f32],
) -> f64 {
    let classes = row.len();
    let (top, m) = row_max(row);
    let m = f64::from(m);
    let exps: Vec<f64> = row.iter().map(|&v| (f64::from(v) - m).exp()).collect();
    let rest: f64 = exps
        .iter()
        .enumerate()
        .filter(|&(k, _)| k != top)
        .map(|(_, e)| e)
        .sum();
    let off_target = smoothing / classes as f64;
    let on_target = (1.0 - smoothing) + off_target;
    let mut weighted_gap = 0.0;
    for (k, ((g, &x), e)) in grad.iter_mut().zip(row).zip(exps).enumerate() {
        let t = if k == label { on_target } else { off_target };
        weighted_gap += t * (m - f64::from(x));
        let p_minus_t = if k == top {
            let one_minus_t = if k == label {
                smoothing - off_target
            } else {
                1.0 - off_target
            };
            one_minus_t - rest / (1.0 + rest)
        } else {
            e / (1.0 + rest) - t
        };
        *g = (p_minus_t * inv_rows * grad_scale) as f32;
    }
    (weighted_gap + rest.ln_1p()) * inv_rows
}

/// CategoricalCrossEntropy on `[N, K]` probabilities and `[N]` labels, with `p`
/// clipped to `[1e-7, 1 - 1e-7]` as Aether-ML does.
///
/// Returns `(loss, dprobs)`: `loss` is a `[1]` tensor, the mean over rows of
/// `-sum_k t_k log p_k`, and `dprobs = -t / p_clipped / N`. A label `>= K` is an
/// error on the CPU; on the GPU it matches no class (target `s / K` everywhere),
/// see the module docs.
pub fn cross_entropy(
    probs: &Tensor,
    labels: &Tensor,
    label_smoothing: f32,
) -> Result<(Tensor, Tensor)> {
    cross_entropy_scaled(probs, labels, label_smoothing, None)
}

/// [`cross_entropy`] with the gradient scaled as [`softmax_cross_entropy_scaled`]
/// scales it: `dprobs = -t / p S / N`.
pub fn cross_entropy_scaled(
    probs: &Tensor,
    labels: &Tensor,
    label_smoothing: f32,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let op = "cross_entropy";
    let (rows, classes) = matrix(op, probs)?;
    check_labels(op, probs, labels, rows)?;
    check_smoothing(op, probs, label_smoothing)?;
    if let (Some(p), Some(y)) = (probs.host_f32(), labels.host_u32()) {
        check_label_range(op, y, classes)?;
        let s = f64::from(label_smoothing);
        let off_target = s / classes as f64;
        let on_target = (1.0 - s) + off_target;
        let inv_rows = 1.0 / rows as f64;
        let grad_scale = host_scale(op, scale, probs)?;
        let mut dprobs = vec![0.0f32; p.len()];
        let row_losses: Vec<f64> = dprobs
            .par_chunks_mut(classes)
            .zip(p.par_chunks(classes).zip(y.par_iter()))
            .map(|(grad, (row, &label))| {
                let mut loss = 0.0;
                for (k, (g, &p)) in grad.iter_mut().zip(row).enumerate() {
                    let p = f64::from(p.clamp(P_MIN, P_MAX));
                    let t = if k == label as usize {
                        on_target
                    } else {
                        off_target
                    };
                    loss -= t * p.ln();
                    *g = (-(t / p) * inv_rows * grad_scale) as f32;
                }
                loss * inv_rows
            })
            .collect();
        let loss = row_losses.iter().sum::<f64>() as f32;
        let device = probs.device();
        return Ok((
            Tensor::from_f32(vec![1], vec![loss], &device)?,
            Tensor::from_f32(probs.dims().to_vec(), dprobs, &device)?,
        ));
    }
    check_scale(op, scale, probs)?;
    let ctx = gpu_context(probs);
    let dprobs = Tensor::uninit_gpu(ctx, probs.shape().clone(), DType::F32)?;
    let row_losses = Tensor::uninit_gpu(ctx, Shape::new([rows])?, DType::F32)?;
    dispatch_rows(
        ctx,
        "loss_cross_entropy",
        CROSS_ENTROPY,
        &[
            buffer(probs),
            buffer(labels),
            buffer(&dprobs),
            buffer(&row_losses),
            buffer(scale.unwrap_or(labels)),
        ],
        scale.is_some(),
        (rows, classes),
        label_smoothing,
    )?;
    Ok((sum_in_order(ctx, row_losses)?, dprobs))
}

/// The number of rows of `[N, K]` scores whose argmax (the first maximum on ties;
/// a NaN is never the maximum unless it comes first) equals the row's label, as a
/// U32 `[1]` tensor. A label `>= K` is an error on the CPU and never correct on
/// the GPU, see the module docs.
pub fn correct_count(scores: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let op = "correct_count";
    let (rows, classes) = matrix(op, scores)?;
    check_labels(op, scores, labels, rows)?;
    if let (Some(x), Some(y)) = (scores.host_f32(), labels.host_u32()) {
        check_label_range(op, y, classes)?;
        let correct = x
            .par_chunks(classes)
            .zip(y.par_iter())
            .filter(|(row, label)| row_max(row).0 == **label as usize)
            .count();
        // `matrix` checked that the row count fits in u32.
        return Tensor::from_u32(vec![1], vec![correct as u32], &scores.device());
    }
    let ctx = gpu_context(scores);
    let hits = Tensor::uninit_gpu(ctx, Shape::new([rows])?, DType::U32)?;
    dispatch_rows(
        ctx,
        "loss_correct",
        CORRECT,
        &[buffer(scores), buffer(labels), buffer(&hits)],
        false,
        (rows, classes),
        0.0,
    )?;
    sum_in_order(ctx, hits)
}

/// The first index of the row's maximum, and the maximum (the kernels' rule).
fn row_max(row: &[f32]) -> (usize, f32) {
    let mut best = (0, row[0]);
    for (k, &v) in row.iter().enumerate().skip(1) {
        if v > best.1 {
            best = (k, v);
        }
    }
    best
}

/// `(N, K)` of an f32 `[N, K]` operand whose sizes fit the kernels' u32 indices.
fn matrix(op: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    let invalid = |reason: String| AetherError::InvalidShape {
        op,
        shape: t.dims().to_vec(),
        reason,
    };
    if t.dtype() != DType::F32 {
        return Err(invalid(format!("expected F32, got {:?}", t.dtype())));
    }
    let &[rows, classes] = t.dims() else {
        return Err(invalid("expected rank 2 (N, K)".into()));
    };
    super::require_u32_elements(op, t)?;
    // The kernels scan a row's classes a few times in one invocation (4 at
    // most, with the reductions): refused where the driver would cut that
    // short silently (lavapipe, past 65535 loop iterations).
    if let Some(ctx) = t.device().gpu_context()
        && let Some(limit) = ctx.caps().loop_iteration_limit()
        && 4 * classes as u64 >= limit
    {
        return Err(AetherError::TooLarge {
            what: format!(
                "{op}: {classes} classes, scanned in up to {} loop iterations an invocation on \
                 {:?}, whose driver stops invocations after {limit}",
                4 * classes,
                ctx.caps().adapter_name
            ),
            bytes: 4 * classes as u64,
            limit,
        });
    }
    Ok((rows, classes))
}

/// Labels must be a U32 `[N]` tensor on the operand's device.
fn check_labels(op: &'static str, operand: &Tensor, labels: &Tensor, rows: usize) -> Result<()> {
    if labels.dtype() != DType::U32 {
        return Err(AetherError::InvalidShape {
            op,
            shape: labels.dims().to_vec(),
            reason: format!("labels must be U32 class indices, got {:?}", labels.dtype()),
        });
    }
    if labels.dims() != [rows] {
        return Err(AetherError::ShapeMismatch {
            op,
            expected: vec![rows],
            actual: labels.dims().to_vec(),
        });
    }
    same_device(op, operand, labels)
}

/// The CPU path's check that every label names one of the `classes` classes.
fn check_label_range(op: &'static str, labels: &[u32], classes: usize) -> Result<()> {
    match labels.iter().position(|&l| l as usize >= classes) {
        None => Ok(()),
        Some(row) => Err(AetherError::InvalidShape {
            op,
            shape: vec![labels.len()],
            reason: format!(
                "label {} at row {row} is out of range for {classes} classes",
                labels[row]
            ),
        }),
    }
}

fn check_smoothing(op: &'static str, operand: &Tensor, smoothing: f32) -> Result<()> {
    if (0.0..=1.0).contains(&smoothing) {
        Ok(())
    } else {
        Err(AetherError::InvalidShape {
            op,
            shape: operand.dims().to_vec(),
            reason: format!("label_smoothing must be in [0, 1], got {smoothing}"),
        })
    }
}

fn same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device().same_as(&b.device()) {
        Ok(())
    } else {
        Err(AetherError::DeviceMismatch {
            op,
            a: a.device().name(),
            b: b.device().name(),
        })
    }
}

/// The context of an f32/u32 operand that is not on the host.
fn gpu_context(t: &Tensor) -> &Arc<GpuContext> {
    t.gpu_context().expect("non-host tensor is on a GPU")
}

fn buffer(t: &Tensor) -> GpuSlice<'_> {
    t.gpu_slice().expect("operand checked to be on the GPU")
}

fn pipeline(
    ctx: &GpuContext,
    kernel: &'static str,
    scaled: bool,
    source: impl FnOnce() -> String,
) -> Result<Arc<wgpu::ComputePipeline>> {
    // Only the loss kernels declare SCALED (default 0).
    let mut key = PipelineKey::new(kernel, "portable");
    if scaled {
        key = key.with("SCALED", 1);
    }
    ctx.pipelines().require(&key, "main", || source().into())
}

/// `Ok` where `scale` (the loss scale's state: `S` as f32 bits in word 0)
/// is a U32 tensor on `operand`'s device.
fn check_scale(op: &'static str, scale: Option<&Tensor>, operand: &Tensor) -> Result<()> {
    match scale {
        Some(t) if t.dtype() != DType::U32 || t.numel() == 0 => Err(AetherError::InvalidShape {
            op,
            shape: t.dims().to_vec(),
            reason: "the loss scale is a U32 tensor holding S as f32 bits first".into(),
        }),
        Some(t) => same_device(op, operand, t),
        None => Ok(()),
    }
}

/// The loss scale `S` on the CPU path (1 without one).
fn host_scale(op: &'static str, scale: Option<&Tensor>, operand: &Tensor) -> Result<f64> {
    check_scale(op, scale, operand)?;
    Ok(match scale {
        Some(t) => f64::from(f32::from_bits(t.to_vec_u32()?[0])),
        None => 1.0,
    })
}

/// Records a row kernel (one thread per row) over `rows` rows of `classes`.
fn dispatch_rows(
    ctx: &GpuContext,
    kernel: &'static str,
    source: &'static str,
    buffers: &[GpuSlice<'_>],
    scaled: bool,
    (rows, classes): (usize, usize),
    smoothing: f32,
) -> Result<()> {
    let pipeline = pipeline(ctx, kernel, scaled, || format!("{COMMON}\n{source}"))?;
    let (grid, row_stride) = flat_grid(
        rows,
        ROWS_PER_WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    // `matrix` checked that rows * classes fits in u32.
    let params = [rows as u32, classes as u32, row_stride, smoothing.to_bits()];
    ctx.dispatch(
        kernel,
        &pipeline,
        buffers,
        bytemuck::cast_slice(&params),
        grid,
    )
}

/// The sum of a 1-D f32 or u32 GPU tensor as a `[1]` tensor, by fixed 256-wide
/// trees level after level: the same additions in the same order on every run.
fn sum_in_order(ctx: &Arc<GpuContext>, values: Tensor) -> Result<Tensor> {
    let (kernel, element) = match values.dtype() {
        DType::U32 => ("loss_sum_u32", "u32"),
        _ => ("loss_sum_f32", "f32"),
    };
    let pipeline = pipeline(ctx, kernel, false, || {
        format!("alias Elem = {element};\n{SUM}")
    })?;
    let mut level = values;
    loop {
        let len = level.numel();
        let groups = len.div_ceil(SUM_WORKGROUP as usize);
        let sums = Tensor::uninit_gpu(ctx, Shape::new([groups])?, level.dtype())?;
        let (grid, row_stride) = flat_grid(
            len,
            SUM_WORKGROUP,
            ctx.caps().limits.max_compute_workgroups_per_dimension,
        );
        let params = [len as u32, row_stride];
        ctx.dispatch(
            kernel,
            &pipeline,
            &[buffer(&level), buffer(&sums)],
            bytemuck::cast_slice(&params),
            grid,
        )?;
        if groups == 1 {
            return Ok(sums);
        }
        level = sums;
    }
}
