//! Data augmentation on the device the batch is on: a random crop of the
//! zero-padded image and a random horizontal flip per image. Draws come from
//! Philox4x32-10 keyed by (seed, step, image), so the CPU and the GPU produce
//! identical batches and a run is reproducible.

use crate::error::{AetherError, Result};
use crate::gpu::{PipelineKey, flat_grid};
use crate::ops::dropout::philox4x32_10;
use crate::tensor::{DType, Shape, Tensor};

const SHADER: &str = concat!(
    include_str!("../../shaders/ops/philox.wgsl"),
    include_str!("../../shaders/ops/augment.wgsl")
);
/// The Philox stream of augmentation draws (dropout uses 0 and 1).
pub const AUGMENT_STREAM: u32 = 2;
const WORKGROUP: u32 = 256;

/// The crop offsets `(dy, dx)` in `0..=2 pad` and the flip of image `n`.
fn draw(n: u32, pad: u32, seed: u64, step: u32) -> (u32, u32, bool) {
    let key = [seed as u32, (seed >> 32) as u32];
    let r = philox4x32_10([n, step, AUGMENT_STREAM, 0], key)[0];
    let span = 2 * pad + 1;
    (r % span, (r >> 8) % span, r >> 31 == 1)
}

/// Each image of the NHWC f32 batch `x` cropped at a random offset of the image
/// padded with `pad` zeros per side and mirrored left-right with probability 1/2.
pub fn random_crop_flip(x: &Tensor, pad: usize, seed: u64, step: u32) -> Result<Tensor> {
    x.expect_dtype("random_crop_flip", DType::F32)?;
    let [n, h, w, c] = x.shape().nhwc("random_crop_flip")?;
    // 2 pad + 1 offsets are drawn in u32.
    let pad_fits = pad < h.max(w) * 4 && pad <= (u32::MAX as usize - 1) / 2;
    if !pad_fits || x.numel() > u32::MAX as usize / 2 {
        return Err(AetherError::InvalidShape {
            op: "random_crop_flip",
            shape: x.dims().to_vec(),
            reason: format!("padding {pad} or size out of range"),
        });
    }
    let pad = pad as u32;
    if let Some(data) = x.host_f32() {
        let mut out = vec![0.0; data.len()];
        for image in 0..n {
            let (dy, dx, flip) = draw(image as u32, pad, seed, step);
            for y in 0..h {
                let sy = (y + dy as usize) as isize - pad as isize;
                for xx in 0..w {
                    let cx = if flip { w - 1 - xx } else { xx };
                    let sx = (cx + dx as usize) as isize - pad as isize;
                    if sy < 0 || sx < 0 || sy >= h as isize || sx >= w as isize {
                        continue;
                    }
                    let src = ((image * h + sy as usize) * w + sx as usize) * c;
                    let dst = ((image * h + y) * w + xx) * c;
                    out[dst..dst + c].copy_from_slice(&data[src..src + c]);
                }
            }
        }
        return Tensor::from_f32(x.dims().to_vec(), out, &x.device());
    }
    let ctx = x.gpu_context().expect("non-host tensor is on a GPU");
    let pipeline = ctx.pipelines().require(
        &PipelineKey::new("augment_crop_flip", "portable"),
        "main",
        || SHADER.into(),
    )?;
    let out = Tensor::uninit_gpu(ctx, Shape::new(x.dims().to_vec())?, DType::F32)?;
    let (grid, row_stride) = flat_grid(
        x.numel(),
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    let params = [
        x.numel() as u32,
        row_stride,
        h as u32,
        w as u32,
        c as u32,
        pad,
        seed as u32,
        (seed >> 32) as u32,
        step,
        AUGMENT_STREAM,
    ];
    ctx.dispatch(
        "augment_crop_flip",
        &pipeline,
        &[x.gpu_slice().expect("GPU"), out.gpu_slice().expect("GPU")],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(out)
}
