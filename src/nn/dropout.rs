//! Dropout and SpatialDropout: masks from the counter-based RNG keyed by the
//! model seed, the layer and the step, so a run is reproducible on any device.

use super::{Layer, LayerSpec, Mode, cached};
use crate::device::Device;
use crate::error::{Result, check_hyperparameter};
use crate::ops::dropout::{dropout, dropout_backward, spatial_dropout_as};
use crate::tensor::{DType, Tensor};

/// Elementwise dropout has no f16 output: `y` is always F32.
fn dropout_as(
    x: &Tensor,
    rate: f32,
    seed: u64,
    step: u32,
    _output: DType,
) -> Result<(Tensor, Tensor)> {
    dropout(x, rate, seed, step)
}

/// The mask key of a dropout layer built with `layer_seed` in a training
/// step seeded `seed` (`Mode::Train`). A model's layer seed is already its
/// seed XOR a per-layer constant, so a plain `seed ^ layer_seed` cancelled the
/// model seed and every seed drew seed 0's masks; the SplitMix64 finalizer
/// (a bijection that keeps 0) on `seed` first keeps it in the key, and seed
/// 0's masks as they were.
pub(crate) fn mask_key(seed: u64, layer_seed: u64) -> u64 {
    let mut z = seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    layer_seed ^ z ^ (z >> 31)
}

macro_rules! dropout_layer {
    ($name:ident, $spec:ident, $op:ident, $f16_output:literal, $doc:literal) => {
        #[doc = $doc]
        pub struct $name {
            pub rate: f32,
            seed: u64,
            /// Channels of the input (its last dimension), from `build`.
            channels: usize,
            /// How the training forward stores `y` (see
            /// `Layer::output_rounded_to_f16`).
            output: DType,
            mask: Option<Tensor>,
        }

        impl $name {
            /// Drops with probability `rate` in `[0, 1)` (checked at
            /// `finalize`) while training, scaling what stays by
            /// `1 / (1 - rate)`; inference passes the input through.
            pub fn new(rate: f32) -> Self {
                Self {
                    rate,
                    seed: 0,
                    channels: 0,
                    output: DType::F32,
                    mask: None,
                }
            }
        }

        impl Layer for $name {
            fn spec(&self) -> LayerSpec {
                LayerSpec::$spec { rate: self.rate }
            }

            fn build(
                &mut self,
                input: &[usize],
                seed: u64,
                _device: &Device,
            ) -> Result<Vec<usize>> {
                let rate = self.rate;
                check_hyperparameter(
                    "dropout rate",
                    rate,
                    (0.0..1.0).contains(&rate),
                    "in [0, 1)",
                )?;
                self.seed = seed;
                self.channels = input.last().copied().unwrap_or(0);
                Ok(input.to_vec())
            }

            /// In training, `y` goes out as f16 where the kernel can store
            /// it so (spatial dropout over channels in fours); evaluation
            /// passes the input through.
            fn output_rounded_to_f16(&mut self, rounded: bool) -> bool {
                let f16 = $f16_output && rounded && self.channels.is_multiple_of(4);
                self.output = if f16 { DType::F16 } else { DType::F32 };
                f16
            }

            fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
                let Mode::Train { seed, step } = mode else {
                    return Ok(x.clone());
                };
                let key = mask_key(seed, self.seed);
                let (y, mask) = $op(x, self.rate, key, step, self.output)?;
                self.mask = Some(mask);
                Ok(y)
            }

            fn end_step(&mut self) {
                self.mask = None;
            }

            fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
                if !need_dx {
                    return Ok(None);
                }
                dropout_backward(dy, cached(&self.mask, stringify!($name))?).map(Some)
            }
        }
    };
}

dropout_layer!(
    Dropout,
    Dropout,
    dropout_as,
    false,
    "Inverted dropout of single elements."
);
dropout_layer!(
    SpatialDropout,
    SpatialDropout,
    spatial_dropout_as,
    true,
    "Inverted dropout of whole feature maps (one draw per sample and channel)."
);
