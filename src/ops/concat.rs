//! Concatenation along the last axis (channels, in NHWC) and its inverse
//! split, on the CPU and the GPU: `Concat`'s forward and backward.

use crate::error::{AetherError, Result};
use crate::gpu::GpuSlice;
use crate::tensor::{DType, Tensor};

use super::activation::{check_operands, elementwise_grid, elementwise_pipeline};

const SHADER: &str = include_str!("../../shaders/ops/channel_copy.wgsl");

/// The inputs joined along their last axis; every other axis must agree.
pub fn concat_channels(inputs: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = inputs.first() else {
        return Err(AetherError::InvalidShape {
            op: "concat_channels",
            shape: vec![],
            reason: "needs at least one input".into(),
        });
    };
    let (lead, widths) = split_last_axes("concat_channels", inputs)?;
    let total: usize = widths.iter().sum();
    let rows: usize = lead.iter().product();
    let dims: Vec<usize> = lead.iter().copied().chain([total]).collect();
    if inputs.iter().all(|t| t.host_f32().is_some()) {
        let mut out = Vec::with_capacity(rows * total);
        for row in 0..rows {
            for (t, &w) in inputs.iter().zip(&widths) {
                let data = t.host_f32().expect("host");
                out.extend_from_slice(&data[row * w..(row + 1) * w]);
            }
        }
        return Tensor::from_f32(dims, out, &first.device());
    }
    let ctx = first.gpu_context().expect("non-host tensor is on a GPU");
    let out = Tensor::uninit_gpu(ctx, crate::tensor::Shape::new(dims)?, DType::F32)?;
    let mut offset = 0;
    for (t, &w) in inputs.iter().zip(&widths) {
        copy_channels(t, &out, rows, w, (w, 0), (total, offset))?;
        offset += w;
    }
    Ok(out)
}

/// `dy` split along its last axis into pieces of `widths` channels.
pub fn split_channels(dy: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
    check_operands("split_channels", &[dy])?;
    let (&total, lead) = dy
        .dims()
        .split_last()
        .ok_or_else(|| AetherError::InvalidShape {
            op: "split_channels",
            shape: dy.dims().to_vec(),
            reason: "needs at least one axis".into(),
        })?;
    if widths.iter().sum::<usize>() != total {
        return Err(AetherError::InvalidShape {
            op: "split_channels",
            shape: dy.dims().to_vec(),
            reason: format!("widths {widths:?} do not sum to the last axis {total}"),
        });
    }
    let rows: usize = lead.iter().product();
    let dims = |w: usize| -> Vec<usize> { lead.iter().copied().chain([w]).collect() };
    let mut pieces = Vec::with_capacity(widths.len());
    let mut offset = 0;
    for &w in widths {
        if let Some(data) = dy.host_f32() {
            let mut piece = Vec::with_capacity(rows * w);
            for row in 0..rows {
                let start = row * total + offset;
                piece.extend_from_slice(&data[start..start + w]);
            }
            pieces.push(Tensor::from_f32(dims(w), piece, &dy.device())?);
        } else {
            let ctx = dy.gpu_context().expect("non-host tensor is on a GPU");
            let piece = Tensor::uninit_gpu(ctx, crate::tensor::Shape::new(dims(w))?, DType::F32)?;
            copy_channels(dy, &piece, rows, w, (total, offset), (w, 0))?;
            pieces.push(piece);
        }
        offset += w;
    }
    Ok(pieces)
}

/// The leading axes the inputs share and each one's last-axis width.
fn split_last_axes(op: &'static str, inputs: &[&Tensor]) -> Result<(Vec<usize>, Vec<usize>)> {
    check_operands_devices(op, inputs)?;
    let lead = inputs[0].dims()[..inputs[0].dims().len() - 1].to_vec();
    let mut widths = Vec::with_capacity(inputs.len());
    for t in inputs {
        let (&w, rest) = t.dims().split_last().expect("checked non-empty");
        if rest != lead.as_slice() {
            return Err(AetherError::ShapeMismatch {
                op,
                expected: inputs[0].dims().to_vec(),
                actual: t.dims().to_vec(),
            });
        }
        widths.push(w);
    }
    Ok((lead, widths))
}

/// f32, one device, at least one axis, u32-indexable (shapes may differ).
fn check_operands_devices(op: &'static str, inputs: &[&Tensor]) -> Result<()> {
    for t in inputs {
        check_operands(op, &[t])?;
        if t.dims().is_empty() {
            return Err(AetherError::InvalidShape {
                op,
                shape: vec![],
                reason: "needs at least one axis".into(),
            });
        }
        if !t.device().same_as(&inputs[0].device()) {
            return Err(AetherError::DeviceMismatch {
                op,
                a: inputs[0].device().name(),
                b: t.device().name(),
            });
        }
    }
    Ok(())
}

/// Records one channel copy: `width` channels of each of `rows` pixels from
/// `src` (`(channels, offset)`) into `dst` (`(channels, offset)`).
fn copy_channels(
    src: &Tensor,
    dst: &Tensor,
    rows: usize,
    width: usize,
    (src_channels, src_offset): (usize, usize),
    (dst_channels, dst_offset): (usize, usize),
) -> Result<()> {
    let ctx = dst.gpu_context().expect("GPU");
    let pipeline = elementwise_pipeline(ctx, "channel_copy", "main", SHADER)?;
    let len = rows * width;
    super::require_u32_elements("channel_copy", dst)?;
    let (grid, row_stride) = elementwise_grid(ctx, len);
    let params = [
        len as u32,
        row_stride,
        width as u32,
        src_channels as u32,
        src_offset as u32,
        dst_channels as u32,
        dst_offset as u32,
    ];
    let buffers: [GpuSlice<'_>; 2] = [src.gpu_slice().expect("GPU"), dst.gpu_slice().expect("GPU")];
    ctx.dispatch(
        "channel_copy",
        &pipeline,
        &buffers,
        bytemuck::cast_slice(&params),
        grid,
    )
}
