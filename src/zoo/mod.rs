//! Reference models: Aether-ML's v1, the CIFAR ResNet-18 and airbench94's
//! network, with the PyTorch names of their tensors where they have a common
//! PyTorch twin.

mod airbench;
mod resnet;
mod whitening;

pub use airbench::{airbench94_net, airbench94_pytorch_names, whiten_first_conv};
pub use resnet::{resnet18_cifar, resnet18_cifar_pytorch_names};
pub use whitening::whitening_kernel;

use crate::conv::Padding;
use crate::graph::NodeId;
use crate::model::{Loss, Metric, Model};
use crate::nn::{BatchNorm, Conv2d, Dense, GlobalAvgPool, MaxPool2d, ReLU, SpatialDropout};
use crate::optim::Adam;

/// The Aether-ML v1 CIFAR-10 model: five 3x3 'same' convs 3-32-32-64-64-128,
/// each with BatchNorm and ReLU, a 2x2 max-pool and spatial dropout (0.1, 0.15,
/// 0.2) after convs 2, 4 and 5, global average pooling and a dense 128 -> 10
/// head on logits; label-smoothed (0.05) softmax cross-entropy, AdamW (lr 1e-3,
/// weight decay 0.01). BatchNorm uses momentum 0.9 and epsilon 1e-5, PyTorch's
/// defaults, as in the PyTorch reference the step times are compared against.
/// Call `finalize(&[H, W, 3])` (CIFAR: 32x32) afterwards.
pub fn cifar10_v1(seed: u64) -> Model {
    let mut model = Model::new().seed(seed);
    let stages: [(&[usize], f32); 3] = [(&[32, 32], 0.1), (&[64, 64], 0.15), (&[128], 0.2)];
    for (filters, dropout) in stages {
        for &f in filters {
            model.add(Conv2d::new(f, (3, 3), Padding::Same));
            model.add(BatchNorm::new(0.9, 1e-5));
            model.add(ReLU::default());
        }
        model.add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid));
        model.add(SpatialDropout::new(dropout));
    }
    model.add(GlobalAvgPool::default());
    model.add(Dense::new(10));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(1e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    model
}

/// The PyTorch names of a zoo model's tensors, recorded as its graph is built.
#[derive(Default)]
pub(crate) struct TorchNames(Vec<(String, String)>);

impl TorchNames {
    /// Layer `node`'s tensors `(aether, PyTorch)` under PyTorch module `module`.
    pub(crate) fn layer(&mut self, node: NodeId, module: &str, tensors: &[(&str, &str)]) {
        let NodeId::Layer(i) = node else {
            unreachable!("zoo graphs name layers, not the input")
        };
        for (mine, theirs) in tensors {
            self.0
                .push((format!("layers.{i}.{mine}"), format!("{module}.{theirs}")));
        }
    }

    pub(crate) fn batch_norm(&mut self, node: NodeId, module: &str) {
        self.layer(
            node,
            module,
            &[
                ("gamma", "weight"),
                ("beta", "bias"),
                ("running_mean", "running_mean"),
                ("running_var", "running_var"),
            ],
        );
    }
}
