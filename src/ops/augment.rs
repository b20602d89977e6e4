//! Data augmentation on the device the batch is on: a random crop of the
//! zero-padded image and a random horizontal flip per image
//! ([`random_crop_flip`]), and airbench's pair: a random translate of the
//! reflect-padded image ([`reflect_translate`]) and the alternating flip
//! ([`alternating_flip`]), also in one pass
//! ([`reflect_translate_alternating_flip`]). Draws come from Philox4x32-10
//! keyed by (seed, step, image) or, for the alternating flip, (seed, dataset
//! row), so the CPU and the GPU produce identical batches and a run is
//! reproducible. Every op here only moves pixels: its output holds exactly
//! input values, on either device.

use crate::device::Device;
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
/// The Philox stream of [`reflect_translate`]'s shifts.
pub const TRANSLATE_STREAM: u32 = 3;
/// The Philox stream of [`alternating_flips`]' fixed half.
pub const ALTERNATING_FLIP_STREAM: u32 = 4;
const TRANSLATE_FLIP_SHADER: &str = concat!(
    include_str!("../../shaders/ops/philox.wgsl"),
    include_str!("../../shaders/ops/augment_translate_flip.wgsl")
);
const WORKGROUP: u32 = 256;

/// The crop offsets `(dy, dx)` in `0..=2 pad` and the flip of image `n`.
fn draw(n: u32, pad: u32, seed: u64, step: u32) -> (u32, u32, bool) {
    let key = [seed as u32, (seed >> 32) as u32];
    let r = philox4x32_10([n, step, AUGMENT_STREAM, 0], key)[0];
    let span = 2 * pad + 1;
    (r % span, (r >> 8) % span, r >> 31 == 1)
}

/// Each image of the NHWC batch `x` (F32, or F16 as a model whose first conv
/// takes f16 uploads it) cropped at a random offset of the image padded with
/// `pad` zeros per side and mirrored left-right with probability 1/2.
pub fn random_crop_flip(x: &Tensor, pad: usize, seed: u64, step: u32) -> Result<Tensor> {
    if !matches!(x.dtype(), DType::F32 | DType::F16) {
        return Err(AetherError::InvalidShape {
            op: "random_crop_flip",
            shape: x.dims().to_vec(),
            reason: format!("expected F32 or F16, got {:?}", x.dtype()),
        });
    }
    let [_, h, w, c] = x.shape().nhwc("random_crop_flip")?;
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
    // Output pixel p = (image, y, x) reads pixel `source(p)`, or 0 in the padding.
    let source = |p: usize| {
        let (image, y, xx) = (p / (h * w), p / w % h, p % w);
        let (dy, dx, flip) = draw(image as u32, pad, seed, step);
        let cx = if flip { w - 1 - xx } else { xx };
        let sy = (y + dy as usize).checked_sub(pad as usize)?;
        let sx = (cx + dx as usize).checked_sub(pad as usize)?;
        (sy < h && sx < w).then(|| (image * h + sy) * w + sx)
    };
    if let Some(ctx) = x.gpu_context() {
        return crop_flip_gpu(ctx, x, [h, w, c], pad, seed, step);
    }
    host_permute(x, c, source)
}

/// [`random_crop_flip`]'s kernel.
fn crop_flip_gpu(
    ctx: &std::sync::Arc<crate::gpu::GpuContext>,
    x: &Tensor,
    [h, w, c]: [usize; 3],
    pad: u32,
    seed: u64,
    step: u32,
) -> Result<Tensor> {
    let (kernel, source) = elem_kernel(
        x.dtype(),
        ("augment_crop_flip", "augment_crop_flip_f16"),
        SHADER,
    );
    let pipeline =
        ctx.pipelines()
            .require(&PipelineKey::new(kernel, "portable"), "main", || {
                source.into()
            })?;
    let out = Tensor::uninit_gpu(ctx, Shape::new(x.dims().to_vec())?, x.dtype())?;
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
        kernel,
        &pipeline,
        &[x.gpu_slice().expect("GPU"), out.gpu_slice().expect("GPU")],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(out)
}

/// The kernel name and WGSL source of a permutation kernel (`shader`, which
/// reads and writes `Elem`) for `dtype`: `names.0` in f32, `names.1` in f16
/// (with `enable f16`), each its own pipeline.
fn elem_kernel(
    dtype: DType,
    names: (&'static str, &'static str),
    shader: &str,
) -> (&'static str, String) {
    match dtype {
        DType::F16 => (names.1, format!("enable f16;\nalias Elem = f16;\n{shader}")),
        _ => (names.0, format!("alias Elem = f32;\n{shader}")),
    }
}

/// The shift `(dy, dx)`, each in `-max_shift..=max_shift`, that
/// [`reflect_translate`] gives image `n` (its place in the batch) at `step`
/// under `seed`: public so a caller can see or replay the draws.
pub fn translate_shift(n: u32, max_shift: u32, seed: u64, step: u32) -> (i32, i32) {
    if max_shift == 0 {
        return (0, 0);
    }
    let key = [seed as u32, (seed >> 32) as u32];
    let r = philox4x32_10([n, step, TRANSLATE_STREAM, 0], key)[0];
    let span = 2 * max_shift + 1;
    let centred = |v: u32| (v % span) as i32 - max_shift as i32;
    (centred(r & 0xffff), centred(r >> 16))
}

/// Whether [`alternating_flip`] mirrors each of the dataset rows `rows` in
/// epoch `epoch`: a fixed half of the data set (each row with probability
/// 1/2, drawn once from `seed`) in even epochs, the other half in odd ones,
/// so every image is seen both ways in any two consecutive epochs (airbench's
/// scheme; it gave more accuracy per epoch there than flips drawn afresh).
pub fn alternating_flips(rows: &[usize], seed: u64, epoch: usize) -> Vec<bool> {
    let key = [seed as u32, (seed >> 32) as u32];
    let odd = epoch % 2 == 1;
    rows.iter()
        .map(|&row| {
            let row = row as u64;
            let counter = [row as u32, (row >> 32) as u32, ALTERNATING_FLIP_STREAM, 0];
            (philox4x32_10(counter, key)[0] >> 31 == 1) != odd
        })
        .collect()
}

/// Each image of the NHWC batch `x` (F32, or F16 as a model whose first
/// conv takes f16 uploads it) translated by its own random shift of up to
/// `max_shift` pixels along each axis ([`translate_shift`]), pixels beyond
/// the edge read from the mirror image (PyTorch's reflect padding, the edge
/// pixel not repeated): airbench's `batch_crop` of reflect-padded images,
/// which keeps the image statistics that zero padding would dilute.
/// `max_shift` must be below the height and the width (a reflection reaches
/// at most that far), else an `InvalidShape` error names it.
pub fn reflect_translate(x: &Tensor, max_shift: usize, seed: u64, step: u32) -> Result<Tensor> {
    translate_flip("reflect_translate", x, max_shift, None, seed, step)
}

/// Each image of the NHWC batch `x` mirrored left-right where
/// [`alternating_flips`] says so for its dataset row (`rows[n]` is the row
/// image `n` of the batch came from) in epoch `epoch`. `rows` must have one
/// entry per image.
pub fn alternating_flip(x: &Tensor, rows: &[usize], seed: u64, epoch: usize) -> Result<Tensor> {
    let flips = alternating_flips(rows, seed, epoch);
    translate_flip("alternating_flip", x, 0, Some(&flips), seed, 0)
}

/// airbench's training augmentation in one pass: [`reflect_translate`] by up
/// to `max_shift` pixels with the shifts of `step`, then [`alternating_flip`]
/// of the rows `rows` in epoch `epoch`. (airbench flips before it crops; a
/// flip after the crop is the same transform with the horizontal shift
/// negated, which the draw makes equally likely.)
pub fn reflect_translate_alternating_flip(
    x: &Tensor,
    max_shift: usize,
    rows: &[usize],
    seed: u64,
    step: u32,
    epoch: usize,
) -> Result<Tensor> {
    let flips = alternating_flips(rows, seed, epoch);
    translate_flip(
        "reflect_translate_alternating_flip",
        x,
        max_shift,
        Some(&flips),
        seed,
        step,
    )
}

/// The shared body: checks, then the CPU gather or the GPU kernel.
fn translate_flip(
    op: &'static str,
    x: &Tensor,
    max_shift: usize,
    flips: Option<&[bool]>,
    seed: u64,
    step: u32,
) -> Result<Tensor> {
    let bad = |reason: String| AetherError::InvalidShape {
        op,
        shape: x.dims().to_vec(),
        reason,
    };
    if !matches!(x.dtype(), DType::F32 | DType::F16) {
        return Err(bad(format!("expected F32 or F16, got {:?}", x.dtype())));
    }
    let [n, h, w, c] = x.shape().nhwc(op)?;
    if max_shift >= h || max_shift >= w {
        return Err(bad(format!(
            "a translate by up to {max_shift} pixels needs images larger than that in both \
             directions (reflect padding mirrors at most size - 1 pixels), got {h}x{w}"
        )));
    }
    if let Some(flips) = flips
        && flips.len() != n
    {
        return Err(bad(format!(
            "{} dataset rows given for a batch of {n} images",
            flips.len()
        )));
    }
    // Indices are u32 in the kernel.
    if x.numel() > u32::MAX as usize / 2 {
        return Err(bad("more than 2^31 values".into()));
    }
    let shift = max_shift as u32;
    let source = |p: usize| {
        let (image, y, xx) = (p / (h * w), p / w % h, p % w);
        let (dy, dx) = translate_shift(image as u32, shift, seed, step);
        let flip = flips.is_some_and(|f| f[image]);
        let cx = if flip { w - 1 - xx } else { xx };
        let sy = reflect(y as i64 + i64::from(dy), h);
        let sx = reflect(cx as i64 + i64::from(dx), w);
        Some((image * h + sy) * w + sx)
    };
    let Some(ctx) = x.gpu_context() else {
        return host_permute(x, c, source);
    };
    // The flags go up before the kernel is recorded: an upload after it would
    // submit the step's work so far (see `GpuContext::upload_with`).
    let flags = flips
        .map(|f| {
            Tensor::from_u32(
                vec![n],
                f.iter().map(|&b| u32::from(b)).collect(),
                &x.device(),
            )
        })
        .transpose()?;
    let (kernel, source) = elem_kernel(
        x.dtype(),
        ("augment_translate_flip", "augment_translate_flip_f16"),
        TRANSLATE_FLIP_SHADER,
    );
    let pipeline =
        ctx.pipelines()
            .require(&PipelineKey::new(kernel, "portable"), "main", || {
                source.into()
            })?;
    let out = Tensor::uninit_gpu(ctx, Shape::new(x.dims().to_vec())?, x.dtype())?;
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
        shift,
        seed as u32,
        (seed >> 32) as u32,
        step,
        TRANSLATE_STREAM,
        u32::from(flags.is_some()),
    ];
    let input = x.gpu_slice().expect("GPU");
    // Without flags the binding is never read: the input stands in for it.
    let flag_slice = flags
        .as_ref()
        .map_or(input, |f| f.gpu_slice().expect("GPU"));
    ctx.dispatch(
        kernel,
        &pipeline,
        &[input, flag_slice, out.gpu_slice().expect("GPU")],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(out)
}

/// The host tensor `x` (F32 or F16, `c` values a pixel) with output pixel
/// `p` taken from input pixel `source(p)`, or zeros where that is `None`.
fn host_permute(x: &Tensor, c: usize, source: impl Fn(usize) -> Option<usize>) -> Result<Tensor> {
    fn permute<T: Copy>(
        data: &[T],
        c: usize,
        zero: T,
        source: impl Fn(usize) -> Option<usize>,
    ) -> Vec<T> {
        let mut out = vec![zero; data.len()];
        for (p, dst) in out.chunks_exact_mut(c).enumerate() {
            if let Some(from) = source(p) {
                dst.copy_from_slice(&data[from * c..(from + 1) * c]);
            }
        }
        out
    }
    let dims = x.dims().to_vec();
    match x.host_f32() {
        Some(data) => Tensor::from_f32(dims, permute(data, c, 0.0, source), &Device::Cpu),
        None => {
            let data = x.to_vec_f16()?;
            let out = permute(&data, c, half::f16::ZERO, source);
            Tensor::from_f16(dims, out, &Device::Cpu)
        }
    }
}

/// `i` in `-(size - 1)..=2 (size - 1)` mirrored into `0..size`, the edge not
/// repeated (PyTorch's reflect padding).
fn reflect(i: i64, size: usize) -> usize {
    let last = size as i64 - 1;
    let i = i.abs();
    (if i > last { 2 * last - i } else { i }) as usize
}
