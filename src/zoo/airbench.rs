//! airbench94's network (Keller Jordan's fast CIFAR-10 recipe, public source
//! in KellerJordan/cifar10-airbench): a whitening 2x2 conv to 24 channels
//! and GELU, three groups of conv / max-pool / BatchNorm / GELU / conv /
//! BatchNorm / GELU of widths 64, 256 and 256, a 3x3 max-pool, a bias-free
//! linear head and a scale of 1/9.

use super::whitening_kernel;
use crate::conv::Padding;
use crate::error::Result;
use crate::model::Model;
use crate::nn::{BatchNorm, Conv2d, Dense, Flatten, GELU, LayerSpec, MaxPool2d, Scale};

/// Group widths of airbench94.
const WIDTHS: [usize; 3] = [64, 256, 256];

/// airbench94's network for 32x32x3 inputs (call `finalize(&[32, 32, 3])`),
/// unconfigured: its convs are bias-free and start with their leading filters
/// as the identity ([`Conv2d::dirac`]); its BatchNorms have no trainable
/// scale, epsilon 1e-12 and momentum 0.6 in aether's convention (PyTorch's
/// 0.4); its first conv has a bias and a kernel to set from data with
/// [`whiten_first_conv`]. airbench trains it with label smoothing 0.2,
/// Nesterov SGD at batch 1024 on a triangular schedule, the first conv's
/// kernel frozen, lookahead and test-time augmentation: the optimizer side of
/// that recipe is not in aether yet, so configure the model yourself.
pub fn airbench94_net(seed: u64) -> Model {
    let mut model = Model::new().seed(seed);
    model
        .add(Conv2d::new(24, (2, 2), Padding::Valid))
        .add(GELU::default());
    for width in WIDTHS {
        model
            .add(
                Conv2d::new(width, (3, 3), Padding::Same)
                    .bias(false)
                    .dirac(true),
            )
            .add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
            .add(norm())
            .add(GELU::default())
            .add(
                Conv2d::new(width, (3, 3), Padding::Same)
                    .bias(false)
                    .dirac(true),
            )
            .add(norm())
            .add(GELU::default());
    }
    model
        .add(MaxPool2d::new((3, 3), (3, 3), Padding::Valid))
        .add(Flatten::default())
        .add(Dense::new(10).bias(false))
        .add(Scale::new(1.0 / 9.0));
    model
}

/// `(aether tensor, PyTorch state_dict entry)` for [`airbench94_net`] and
/// its PyTorch twin as one `nn.Sequential` of the same layers in the same
/// order (`benches/pytorch_models.py`'s `airbench94`: module `i` is layer
/// `i`), for [`crate::import::load_pytorch_state_dict`]. The BatchNorms'
/// scales are fixed at 1 in both and have no entry: leave `{i}.weight` of
/// the BatchNorm modules out of the saved `state_dict`.
pub fn airbench94_pytorch_names() -> Vec<(String, String)> {
    let model = airbench94_net(0);
    let mut names = Vec::new();
    for i in 0.. {
        let Some(spec) = model.layer_spec(i) else {
            break;
        };
        let mut tensors = Vec::new();
        match spec {
            LayerSpec::Conv2d { bias, .. } | LayerSpec::Dense { bias, .. } => {
                tensors.push(("kernel", "weight"));
                if bias {
                    tensors.push(("bias", "bias"));
                }
            }
            LayerSpec::BatchNorm { scale, .. } => {
                if scale {
                    tensors.push(("gamma", "weight"));
                }
                tensors.extend([
                    ("beta", "bias"),
                    ("running_mean", "running_mean"),
                    ("running_var", "running_var"),
                ]);
            }
            _ => {}
        }
        for (mine, theirs) in tensors {
            names.push((format!("layers.{i}.{mine}"), format!("{i}.{theirs}")));
        }
    }
    names
}

fn norm() -> BatchNorm {
    BatchNorm::new(0.6, 1e-12).scale(false)
}

/// Sets the first conv of a finalized [`airbench94_net`] to whiten the 2x2
/// patches of `images` (NHWC 32x32x3, normalised as the training data; airbench
/// uses the first 5000 training images) with [`whitening_kernel`].
pub fn whiten_first_conv(model: &mut Model, images: &[f32]) -> Result<()> {
    let kernel = whitening_kernel(images, 32, 3, (2, 2))?;
    model.set_tensors(&[("layers.0.kernel".into(), kernel)])
}
