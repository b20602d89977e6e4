//! Inverted dropout (elementwise and spatial) and its backward pass, on the CPU
//! and the GPU, with masks that are bit-identical on both.
//!
//! Why a counter-based RNG: the mask of element `i` is a pure function of
//! `(seed, step, i)`, so there is no RNG state to carry between kernels or
//! devices, any thread can draw its own number, and a run replays exactly on
//! either device. The generator is Philox4x32-10 (Salmon et al., "Parallel
//! random numbers: as easy as 1, 2, 3", SC'11) in u32 arithmetic only; WGSL
//! has no 64-bit integers, so the shader forms the high half of each 32x32
//! product from 16-bit pieces, which is exact.
//!
//! The contract, the same in Rust and `shaders/ops/dropout.wgsl`:
//! - key `[seed as u32, (seed >> 32) as u32]`, counter `[draw, step, stream, 0]`;
//!   the draw is lane 0 of [`philox4x32_10`];
//! - `stream` is [`ELEMENT_STREAM`] with `draw = i` for [`dropout`], and
//!   [`SPATIAL_STREAM`] with `draw = n * C + c` for [`spatial_dropout`];
//! - the element is dropped when `draw_bits < round(rate * 2^32)`, so it is
//!   kept with probability `1 - rate` (to within 2^-33), and the mask value is
//!   then `0`, else `1 / (1 - rate)` computed in f32; `y = x * mask` in f32.

use half::f16;
use rayon::prelude::*;

use super::activation::{check_operands, elementwise_grid, elementwise_pipeline, gpu_elementwise};
use crate::error::{AetherError, Result};
use crate::tensor::{DType, Tensor};

const SHADER: &str = concat!(
    include_str!("../../shaders/ops/philox.wgsl"),
    include_str!("../../shaders/ops/spatial_mask.wgsl"),
    include_str!("../../shaders/common/f16_bits.wgsl"),
    include_str!("../../shaders/ops/dropout.wgsl")
);

/// Pixels of one spatial-dropout map that one GPU invocation masks with one
/// draw (`PIXELS_PER_DRAW` in dropout.wgsl).
const PIXELS_PER_DRAW: u32 = 8;
/// Pixels one invocation of the f16-output kernel masks, four channels each
/// (`PIXELS_PER_LANE_F16` in dropout.wgsl).
const PIXELS_PER_LANE_F16: u32 = 4;

/// The counter's third word for elementwise [`dropout`].
pub const ELEMENT_STREAM: u32 = 0;
/// The counter's third word for [`spatial_dropout`], so its draws never repeat
/// an elementwise mask built from the same seed and step.
pub const SPATIAL_STREAM: u32 = 1;

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds: four uniform u32s for one 128-bit counter under a
/// 64-bit key. Matches the Random123 reference (and its known-answer vectors).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(PHILOX_W0);
            k1 = k1.wrapping_add(PHILOX_W1);
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(c0);
        let p1 = u64::from(PHILOX_M1) * u64::from(c2);
        [c0, c1, c2, c3] = [
            (p1 >> 32) as u32 ^ c1 ^ k0,
            p1 as u32,
            (p0 >> 32) as u32 ^ c3 ^ k1,
            p0 as u32,
        ];
    }
    [c0, c1, c2, c3]
}

/// Inverted dropout: keeps each element with probability `1 - rate` and scales
/// it by `1 / (1 - rate)`, so the expectation is unchanged and inference needs
/// no rescaling. Returns `(y, mask)` with `y = x * mask`; pass the mask to
/// [`dropout_backward`]. The same `(seed, step)` gives the same mask on every
/// device; use a new `step` for every training step. `rate` must be in
/// `[0, 1)`; at 0, `y` is `x` itself and the mask is all ones.
pub fn dropout(x: &Tensor, rate: f32, seed: u64, step: u32) -> Result<(Tensor, Tensor)> {
    check_operands("dropout", &[x])?;
    let plan = MaskPlan::new("dropout", x.dims(), rate, seed, step, ELEMENT_STREAM, 1, 1)?;
    masked(x, rate, &plan, DType::F32)
}

/// Spatial dropout for NHWC `x`: one draw per (n, c) drops or keeps a whole
/// feature map, which regularises convolutional layers where neighbouring
/// pixels are strongly correlated. The mask has `x`'s shape (constant over h, w);
/// otherwise as [`dropout`].
pub fn spatial_dropout(x: &Tensor, rate: f32, seed: u64, step: u32) -> Result<(Tensor, Tensor)> {
    spatial_dropout_as(x, rate, seed, step, DType::F32)
}

/// [`spatial_dropout`] with `y` stored as `output`: F32, or F16 rounded as
/// `half::f16::from_f32` of the F32 result (for a conv that rounds its input
/// to f16 anyway: the same values in half the bytes, and no cast). F16 needs
/// a channel count that divides by 4; at rate 0 it is `x` rounded. The mask
/// stays F32.
pub fn spatial_dropout_as(
    x: &Tensor,
    rate: f32,
    seed: u64,
    step: u32,
    output: DType,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "spatial_dropout";
    check_operands(OP, &[x])?;
    let [n, h, w, c] = x.shape().nhwc(OP)?;
    if !(output == DType::F32 || output == DType::F16 && c.is_multiple_of(4)) {
        return Err(AetherError::InvalidShape {
            op: OP,
            shape: x.dims().to_vec(),
            reason: format!(
                "output {output:?}: F32, or F16 where the channels divide by 4 ({c} here)"
            ),
        });
    }
    let plan = SpatialMask::new(OP, [n, h, w, c], rate, seed, step)?.plan;
    masked(x, rate, &plan, output)
}

/// The spatial mask of NHWC `dims` for a kernel that folds spatial dropout
/// in (max pooling): the words of its `MaskDraws` (spatial_mask.wgsl), checked
/// as [`spatial_dropout`] checks them, and on the host the mask itself.
pub(crate) struct SpatialMask {
    plan: MaskPlan,
}

impl SpatialMask {
    pub(crate) fn new(
        op: &'static str,
        [n, h, w, c]: [usize; 4],
        rate: f32,
        seed: u64,
        step: u32,
    ) -> Result<Self> {
        // Element counts are bounded by u32 (`check_operands`), and so these.
        let (channels, map_span) = (c as u32, (h * w * c) as u32);
        let plan = MaskPlan::new(
            op,
            &[n, h, w, c],
            rate,
            seed,
            step,
            SPATIAL_STREAM,
            channels,
            map_span,
        )?;
        Ok(Self { plan })
    }

    /// The words of its `MaskDraws` (spatial_mask.wgsl).
    pub(crate) fn draw_words(&self) -> [u32; 6] {
        self.plan.draw_words()
    }

    /// The mask of `len` elements, as [`spatial_dropout`] returns it.
    pub(crate) fn host(&self, len: usize) -> Vec<f32> {
        self.plan.host_mask(len)
    }
}

/// Dropout's gradient: `dx = dy * mask`, with the mask from the forward pass.
pub fn dropout_backward(dy: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check_operands("dropout_backward", &[dy, mask])?;
    if let (Some(dys), Some(ms)) = (dy.host_f32(), mask.host_f32()) {
        let dx = dys.par_iter().zip(ms).map(|(&d, &m)| d * m).collect();
        return Tensor::from_f32(dy.dims().to_vec(), dx, &dy.device());
    }
    // The shader's entry points share one uniform block; only `len` and
    // `row_stride` matter here, the mask fields are zero.
    gpu_elementwise("dropout_backward", "backward", SHADER, &[dy, mask], &[0; 9])
}

/// Everything that decides one mask: the uniform block of the forward kernel.
struct MaskPlan {
    drop_threshold: u32,
    scale: f32,
    key: [u32; 2],
    step: u32,
    stream: u32,
    /// Draws per map (C for spatial, 1 for elementwise).
    channels: u32,
    /// Elements sharing one row of draws (H * W * C for spatial, 1 for elementwise).
    map_span: u32,
}

impl MaskPlan {
    #[allow(clippy::too_many_arguments)]
    fn new(
        op: &'static str,
        shape: &[usize],
        rate: f32,
        seed: u64,
        step: u32,
        stream: u32,
        channels: u32,
        map_span: u32,
    ) -> Result<Self> {
        if !(0.0..1.0).contains(&rate) {
            return Err(AetherError::InvalidShape {
                op,
                shape: shape.to_vec(),
                reason: format!("dropout rate must be in [0, 1), got {rate}"),
            });
        }
        // rate < 1 in f32 is at most 1 - 2^-24, so this is below 2^32.
        let drop_threshold = (f64::from(rate) * 4_294_967_296.0).round() as u32;
        Ok(Self {
            drop_threshold,
            scale: 1.0 / (1.0 - rate),
            key: [seed as u32, (seed >> 32) as u32],
            step,
            stream,
            channels,
            map_span,
        })
    }

    /// The mask value of draw number `draw`.
    fn mask_value(&self, draw: u32) -> f32 {
        let kept = self.drop_threshold == 0
            || philox4x32_10([draw, self.step, self.stream, 0], self.key)[0] >= self.drop_threshold;
        if kept { self.scale } else { 0.0 }
    }

    /// The mask of `len` elements on the host: one draw per (map, channel),
    /// spread over the map.
    fn host_mask(&self, len: usize) -> Vec<f32> {
        let (span, channels) = (self.map_span as usize, self.channels as usize);
        let draw_count = (len / span * channels) as u32;
        let draws: Vec<f32> = (0..draw_count)
            .into_par_iter()
            .map(|d| self.mask_value(d))
            .collect();
        if span == channels {
            return draws;
        }
        (0..len)
            .into_par_iter()
            .map(|i| draws[i / span * channels + i % channels])
            .collect()
    }

    /// Invocations per map of the forward kernel: one per `channels_each`
    /// channels and `pixels_each` pixels.
    fn map_lanes(&self, [channels_each, pixels_each]: [u32; 2]) -> u32 {
        let pixels = self.map_span / self.channels;
        pixels.div_ceil(pixels_each) * (self.channels / channels_each)
    }

    /// The draws' words of the uniform blocks (`MaskDraws` in
    /// spatial_mask.wgsl): threshold, scale, key, step, stream.
    fn draw_words(&self) -> [u32; 6] {
        [
            self.drop_threshold,
            self.scale.to_bits(),
            self.key[0],
            self.key[1],
            self.step,
            self.stream,
        ]
    }

    /// The forward kernel's uniform block, for `lanes` invocations, each of
    /// `lane` = (channels, pixels).
    fn gpu_params(&self, lanes: u32, row_stride: u32, lane: [u32; 2]) -> [u32; 11] {
        let [threshold, scale, key0, key1, step, stream] = self.draw_words();
        [
            lanes,
            row_stride,
            threshold,
            scale,
            key0,
            key1,
            step,
            stream,
            self.channels,
            self.map_span,
            self.map_lanes(lane),
        ]
    }
}

/// `(x * mask, mask)` for an f32 `x` already checked, the product stored as
/// `output`: F32 (`x` itself at rate 0), or F16 rounded from the f32 product
/// (`x` NHWC with channels in fours).
fn masked(x: &Tensor, rate: f32, plan: &MaskPlan, output: DType) -> Result<(Tensor, Tensor)> {
    let keep_x = rate == 0.0 && output == DType::F32;
    let Some(xs) = x.host_f32() else {
        let (y, mask) = gpu_masked(x, plan, output)?;
        return Ok((if keep_x { x.clone() } else { y }, mask));
    };
    let (dims, device) = (x.dims().to_vec(), x.device());
    let mask = plan.host_mask(xs.len());
    let products = || xs.par_iter().zip(&mask).map(|(&v, &m)| v * m);
    let y = match output {
        _ if keep_x => x.clone(),
        DType::F16 => Tensor::from_f16(
            dims.clone(),
            products()
                .map(|v| f16::from_f32(crate::conv::clip_f16_range(v)))
                .collect(),
            &device,
        )?,
        _ => Tensor::from_f32(dims.clone(), products().collect(), &device)?,
    };
    Ok((y, Tensor::from_f32(dims, mask, &device)?))
}

/// Records the forward kernel over GPU `x`: `(y, mask)` with `y` as F32
/// (`main`, one channel of [`PIXELS_PER_DRAW`] pixels an invocation) or F16
/// (`main_f16`, four channels of [`PIXELS_PER_LANE_F16`] pixels).
fn gpu_masked(x: &Tensor, plan: &MaskPlan, output: DType) -> Result<(Tensor, Tensor)> {
    let ctx = x.gpu_context().expect("non-host tensor is on a GPU");
    let (kernel, entry, lane) = match output {
        DType::F16 => ("dropout_f16", "main_f16", [4, PIXELS_PER_LANE_F16]),
        _ => ("dropout", "main", [1, PIXELS_PER_DRAW]),
    };
    let pipeline = elementwise_pipeline(ctx, kernel, entry, SHADER)?;
    let mask = Tensor::uninit_gpu(ctx, x.shape().clone(), DType::F32)?;
    let y = Tensor::uninit_gpu(ctx, x.shape().clone(), output)?;
    let maps = x.numel() / plan.map_span as usize;
    let lanes = maps * plan.map_lanes(lane) as usize;
    let (grid, row_stride) = elementwise_grid(ctx, lanes);
    let params = plan.gpu_params(lanes as u32, row_stride, lane);
    ctx.dispatch(
        "dropout",
        &pipeline,
        &[
            x.gpu_slice().expect("GPU"),
            mask.gpu_slice().expect("GPU"),
            y.gpu_slice().expect("GPU"),
        ],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok((y, mask))
}
