//! Lookahead of the weights (airbench's `LookaheadState`): an exponential
//! moving average of the parameters kept beside them, and every `every`
//! steps `ema = lerp(ema, w, 1 - decay)`, then `w = ema`. The average starts
//! from the weights before the first step.
//!
//! On the GPU the average is one packed buffer in the optimizer's layout, so
//! an update is one dispatch over all parameters (which also writes the f16
//! mirror of the weights the conv layers read). Only parameters the
//! optimizer trains take part (airbench's also averages BatchNorm's running
//! statistics).

use super::Param;
use super::packed::{GATE_OPEN, Packed, WORKGROUP, copy_into, fresh_or_same, gpu_buf, pipeline};
use crate::device::Device;
use crate::error::{AetherError, Result, check_hyperparameter};
use crate::gpu::flat_grid;
use crate::tensor::{DType, Shape, Tensor};

const LOOKAHEAD: &str = concat!(
    include_str!("../../shaders/optim/segments.wgsl"),
    include_str!("../../shaders/optim/lookahead.wgsl"),
);
const MAIN: &str = include_str!("../../shaders/optim/lookahead_main.wgsl");
const MIRROR: &str = include_str!("../../shaders/optim/lookahead_f16.wgsl");
const F16_BITS: &str = include_str!("../../shaders/common/f16_bits.wgsl");

/// How often and how strongly a model pulls its weights to their average
/// ([`crate::Model::set_lookahead`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lookahead {
    /// Steps between updates (airbench: 5).
    pub every: u32,
    /// The average's decay per update, in [0, 1] (airbench: 0.95^5 early,
    /// rising; 1 copies the average into the weights).
    pub decay: f32,
}

impl Lookahead {
    /// `Ok` where `every` is at least 1 and `decay` in [0, 1].
    pub fn validate(&self) -> Result<()> {
        check_hyperparameter(
            "lookahead every",
            self.every as f32,
            self.every >= 1,
            ">= 1",
        )?;
        check_hyperparameter(
            "lookahead decay",
            self.decay,
            (0.0..=1.0).contains(&self.decay),
            "in [0, 1]",
        )
    }
}

/// Makes `packed`'s average from `restored` (a checkpoint's, per parameter,
/// sizes checked; an empty vector: that parameter's weights) or else from
/// `params` as they are (before the step).
pub(crate) fn start(
    packed: &mut Packed,
    params: &[Param],
    device: &Device,
    restored: Option<Vec<Vec<f32>>>,
) -> Result<()> {
    let total = packed.total();
    if let Some(r) = &restored {
        let saved: Vec<usize> = r.iter().map(Vec::len).collect();
        if !fresh_or_same(&saved, &packed.lengths) {
            return Err(AetherError::ShapeMismatch {
                op: "lookahead (parameter sizes of the restored average)",
                expected: saved,
                actual: packed.lengths.clone(),
            });
        }
    }
    let mut flat = vec![0.0; total];
    for (k, (p, &at)) in params.iter().zip(&packed.offsets).enumerate() {
        let values = match &restored {
            Some(r) if !r[k].is_empty() => r[k].clone(),
            _ => p.value.to_vec_f32()?,
        };
        flat[at..at + values.len()].copy_from_slice(&values);
    }
    packed.ema = Some(match device {
        Device::Gpu(ctx) if restored.is_none() => {
            // Copies, not an upload: an upload would flush the pending batch.
            let ema = Tensor::uninit_gpu(ctx, Shape::new([total])?, DType::F32)?;
            for (p, &at) in params.iter().zip(&packed.offsets) {
                copy_into(ctx, p.value, &ema, at as u64 * 4);
            }
            ema
        }
        _ => Tensor::from_f32(vec![total], flat, device)?,
    });
    Ok(())
}

/// The average per parameter, for a checkpoint (a read back on the GPU).
pub(crate) fn unpack(packed: &Packed) -> Result<Option<Vec<Vec<f32>>>> {
    let Some(ema) = &packed.ema else {
        return Ok(None);
    };
    let all = ema.to_vec_f32()?;
    Ok(Some(
        packed
            .lengths
            .iter()
            .zip(&packed.offsets)
            .map(|(&len, &at)| all[at..at + len].to_vec())
            .collect(),
    ))
}

/// One lookahead update of `params` (right after a step, which left them as
/// the packed buffer's views on the GPU) with `decay`; nothing before the
/// average exists.
pub(crate) fn update(packed: &mut Packed, params: &mut [Param], decay: f32) -> Result<()> {
    let Some(ema) = &packed.ema else {
        return Ok(());
    };
    let weight = 1.0 - decay;
    let total = packed.total();
    match &ema.device() {
        Device::Cpu => {
            if packed.gate.to_vec_u32()?[0] != GATE_OPEN {
                return Ok(());
            }
            let mut average = ema.to_vec_f32()?;
            for (p, &at) in params.iter_mut().zip(&packed.offsets) {
                let mut w = p.value.to_vec_f32()?;
                for (x, e) in w.iter_mut().zip(&mut average[at..]) {
                    *e = lerp(*e, *x, weight);
                    *x = *e;
                }
                *p.value = Tensor::from_f32(p.value.dims().to_vec(), w, &Device::Cpu)?;
            }
            packed.ema = Some(Tensor::from_f32(vec![total], average, &Device::Cpu)?);
            Ok(())
        }
        Device::Gpu(ctx) => {
            let (Some(flat), Some(segments)) = (packed.flat_params(), packed.segment_tensor())
            else {
                return Ok(());
            };
            let (grid, row_stride) = flat_grid(
                total,
                WORKGROUP,
                ctx.caps().limits.max_compute_workgroups_per_dimension,
            );
            let uniform = [
                total as u32,
                row_stride,
                params.len() as u32,
                weight.to_bits(),
            ];
            let mut buffers = vec![
                gpu_buf(flat),
                gpu_buf(ema),
                gpu_buf(segments),
                gpu_buf(&packed.gate),
            ];
            let kernel = match &packed.packed_f16 {
                Some((mirror, _)) => {
                    buffers.push(gpu_buf(mirror));
                    pipeline(ctx, "lookahead", "f16_mirror", || {
                        ["enable f16;\n", F16_BITS, LOOKAHEAD, MIRROR].concat()
                    })?
                }
                None => pipeline(ctx, "lookahead", "portable", || [LOOKAHEAD, MAIN].concat())?,
            };
            ctx.dispatch(
                "lookahead",
                &kernel,
                &buffers,
                bytemuck::cast_slice(&uniform),
                grid,
            )
        }
    }
}

/// `torch.lerp(start, end, weight)`, as the kernel computes it.
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}
