//! Dropout and SpatialDropout: masks from the counter-based RNG keyed by the
//! model seed, the layer and the step, so a run is reproducible on any device.

use super::{Layer, LayerSpec, Mode, cached};
use crate::device::Device;
use crate::error::Result;
use crate::ops::dropout::{dropout, dropout_backward, spatial_dropout};
use crate::tensor::Tensor;

macro_rules! dropout_layer {
    ($name:ident, $spec:ident, $op:ident, $doc:literal) => {
        #[doc = $doc]
        pub struct $name {
            pub rate: f32,
            seed: u64,
            mask: Option<Tensor>,
        }

        impl $name {
            pub fn new(rate: f32) -> Self {
                Self {
                    rate,
                    seed: 0,
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
                self.seed = seed;
                Ok(input.to_vec())
            }

            fn forward(&mut self, x: &Tensor, mode: Mode) -> Result<Tensor> {
                let Mode::Train { seed, step } = mode else {
                    return Ok(x.clone());
                };
                let (y, mask) = $op(x, self.rate, seed ^ self.seed, step)?;
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
    dropout,
    "Inverted dropout of single elements."
);
dropout_layer!(
    SpatialDropout,
    SpatialDropout,
    spatial_dropout,
    "Inverted dropout of whole feature maps (one draw per sample and channel)."
);
