//! The regularization loss of all parameters: one deterministic GPU reduction.

use std::sync::Arc;

use super::packed::{Segment, WORKGROUP, copy_into, gpu_buf, pipeline, segment_tensor};
use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::gpu::{GpuContext, flat_grid};
use crate::tensor::{DType, Shape, Tensor, packed_offsets};

const REGULARIZATION: &str = concat!(
    include_str!("../../shaders/optim/segments.wgsl"),
    include_str!("../../shaders/optim/regularization.wgsl")
);
const SUM_IN_ORDER: &str = include_str!("../../shaders/optim/sum_in_order.wgsl");
/// The most values one `sum_in_order` dispatch adds (its one invocation's loop).
const SUM_IN_ORDER_STEP: usize = 1 << 14;

/// Packs `tensors` end to end into one flat f32 tensor with buffer copies.
fn pack(ctx: &Arc<GpuContext>, tensors: &[&Tensor]) -> Result<Tensor> {
    let offsets = packed_offsets(tensors.iter().map(|t| t.numel()), 1);
    let total = *offsets.last().expect("offsets end with the total");
    let flat = Tensor::uninit_gpu(ctx, Shape::new([total])?, DType::F32)?;
    for (t, &offset) in tensors.iter().zip(&offsets) {
        copy_into(ctx, t, &flat, offset as u64 * 4);
    }
    Ok(flat)
}

/// `sum(l1 * |p| + l2 * p^2)` over `(tensor, l1, l2)` triples, as a `[1]` tensor on
/// the tensors' device, computed by one deterministic reduction over all of them.
pub fn regularization_loss(terms: &[(&Tensor, f32, f32)]) -> Result<Tensor> {
    let Some(&(first, _, _)) = terms.first() else {
        return Err(AetherError::InvalidShape {
            op: "regularization_loss",
            shape: vec![],
            reason: "no parameters given".into(),
        });
    };
    let device = first.device();
    if let Some((t, _, _)) = terms
        .iter()
        .find(|(t, _, _)| !t.device().same_as(&device) || t.dtype() != DType::F32)
    {
        return Err(AetherError::InvalidShape {
            op: "regularization_loss",
            shape: t.dims().to_vec(),
            reason: format!("every term must be F32 on {}", device.name()),
        });
    }
    let Device::Gpu(ctx) = &device else {
        let mut total = 0.0f32;
        for (t, l1, l2) in terms {
            for &p in t.host_f32().expect("checked F32 on the CPU") {
                total += l1 * p.abs() + l2 * p * p;
            }
        }
        return Tensor::from_f32(vec![1], vec![total], &device);
    };
    let tensors: Vec<&Tensor> = terms.iter().map(|(t, _, _)| *t).collect();
    let flat = pack(ctx, &tensors)?;
    let starts = packed_offsets(terms.iter().map(|(t, _, _)| t.numel()), 1);
    let segs: Vec<Segment> = terms
        .iter()
        .zip(&starts)
        .map(|((t, l1, l2), &start)| Segment {
            start: start as u32,
            end: (start + t.numel()) as u32,
            l1: *l1,
            l2: *l2,
            decay: 0.0,
            lr: 0.0,
        })
        .collect();
    let seg_tensor = segment_tensor(ctx, &segs)?;
    let total = flat.numel();
    let (grid, _) = flat_grid(
        total,
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    let groups = (grid[0] * grid[1]) as usize;
    let partials = Tensor::uninit_gpu(ctx, Shape::new([groups])?, DType::F32)?;
    ctx.dispatch(
        "regularization_partial",
        &*pipeline(ctx, "regularization_partial", "portable", || {
            REGULARIZATION.into()
        })?,
        &[gpu_buf(&flat), gpu_buf(&seg_tensor), gpu_buf(&partials)],
        bytemuck::cast_slice(&[total as u32, segs.len() as u32]),
        grid,
    )?;
    let out = Tensor::uninit_gpu(ctx, Shape::new([1])?, DType::F32)?;
    // In order, in dispatches of at most SUM_IN_ORDER_STEP additions, the
    // total carried in `out` between them (lavapipe stops an invocation after
    // 65535 loop iterations).
    for first in (0..groups).step_by(SUM_IN_ORDER_STEP) {
        let end = (first + SUM_IN_ORDER_STEP).min(groups);
        ctx.dispatch(
            "sum_in_order",
            &*pipeline(ctx, "sum_in_order", "portable", || SUM_IN_ORDER.into())?,
            &[gpu_buf(&partials), gpu_buf(&out)],
            bytemuck::cast_slice(&[first as u32, end as u32]),
            [1, 1, 1],
        )?;
    }
    Ok(out)
}
