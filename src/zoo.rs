//! Reference models.

use crate::conv::Padding;
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
