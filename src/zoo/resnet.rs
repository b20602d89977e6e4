//! The standard CIFAR ResNet-18, as a graph with residual adds.

use super::TorchNames;
use crate::conv::Padding;
use crate::graph::{Graph, NodeId};
use crate::model::{Loss, Metric, Model};
use crate::nn::{Add, BatchNorm, Conv2d, Dense, Flatten, GlobalAvgPool, ReLU};
use crate::optim::Adam;

/// The standard CIFAR ResNet-18 (He et al. 2016, as in the common CIFAR
/// reimplementations): a 3x3 stem of 64 channels, four stages of two basic
/// blocks of 64, 128, 256 and 512 channels, stages 2-4 starting with a
/// stride-2 block whose shortcut is a 1x1 stride-2 conv with BatchNorm, then
/// global average pooling and a dense head of `classes` logits. Every conv is
/// without bias and followed by BatchNorm (momentum 0.9, epsilon 1e-5,
/// PyTorch's defaults): 11,173,962 parameters for 10 classes, as PyTorch's.
/// Configured like [`super::cifar10_v1`]: label-smoothed (0.05) softmax
/// cross-entropy and AdamW (lr 1e-3, weight decay 0.01). Call
/// `finalize(&[32, 32, 3])` afterwards.
pub fn resnet18_cifar(classes: usize, seed: u64) -> Model {
    let mut model = Model::from_graph(resnet18_graph(classes).0).seed(seed);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(1e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    model
}

/// `(aether tensor, PyTorch state_dict entry)` for [`resnet18_cifar`] and the
/// usual PyTorch CIFAR ResNet-18 (modules `conv1`, `bn1`,
/// `layer{1-4}.{0,1}.{conv1,bn1,conv2,bn2,shortcut.0,shortcut.1}`, `linear`),
/// for [`crate::import::load_pytorch_state_dict`].
pub fn resnet18_cifar_pytorch_names(classes: usize) -> Vec<(String, String)> {
    resnet18_graph(classes).1.0
}

fn resnet18_graph(classes: usize) -> (Graph, TorchNames) {
    let mut g = Graph::new();
    let mut names = TorchNames::default();
    let x = g.input();
    let mut h = conv_bn(&mut g, &mut names, x, 64, (3, 3), 1, ["conv1", "bn1"]);
    h = g.add(ReLU::default(), &[h]);
    let mut channels = 64;
    for (stage, width) in [64, 128, 256, 512].into_iter().enumerate() {
        for block in 0..2 {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let module = format!("layer{}.{block}", stage + 1);
            h = basic_block(&mut g, &mut names, &module, h, channels, width, stride);
            channels = width;
        }
    }
    let pooled = g.add(GlobalAvgPool::default(), &[h]);
    let flat = g.add(Flatten::default(), &[pooled]);
    let head = g.add(Dense::new(classes), &[flat]);
    names.layer(head, "linear", &[("kernel", "weight"), ("bias", "bias")]);
    (g, names)
}

/// A conv ('same' padding, so a stride-2 3x3 conv pads one pixel each side as
/// PyTorch's `padding=1` does) without bias, followed by BatchNorm; `modules`
/// are their PyTorch names.
fn conv_bn(
    g: &mut Graph,
    names: &mut TorchNames,
    x: NodeId,
    filters: usize,
    kernel: (usize, usize),
    stride: usize,
    [conv_module, norm_module]: [&str; 2],
) -> NodeId {
    let padding = if kernel == (1, 1) {
        Padding::Valid
    } else {
        Padding::Same
    };
    let conv = g.add(
        Conv2d::new(filters, kernel, padding)
            .stride((stride, stride))
            .bias(false),
        &[x],
    );
    names.layer(conv, conv_module, &[("kernel", "weight")]);
    let norm = g.add(BatchNorm::new(0.9, 1e-5), &[conv]);
    names.batch_norm(norm, norm_module);
    norm
}

/// ResNet's basic block: two 3x3 conv+BN with a ReLU between, plus the
/// shortcut (the input, or a 1x1 conv+BN where the shape changes), then ReLU.
fn basic_block(
    g: &mut Graph,
    names: &mut TorchNames,
    module: &str,
    x: NodeId,
    in_channels: usize,
    out: usize,
    stride: usize,
) -> NodeId {
    let sub = |name: &str| format!("{module}.{name}");
    let a = conv_bn(
        g,
        names,
        x,
        out,
        (3, 3),
        stride,
        [&sub("conv1"), &sub("bn1")],
    );
    let a = g.add(ReLU::default(), &[a]);
    let a = conv_bn(g, names, a, out, (3, 3), 1, [&sub("conv2"), &sub("bn2")]);
    let shortcut = if stride != 1 || in_channels != out {
        let modules = [&sub("shortcut.0"), &sub("shortcut.1")];
        conv_bn(
            g,
            names,
            x,
            out,
            (1, 1),
            stride,
            modules.map(String::as_str),
        )
    } else {
        x
    };
    let sum = g.add(Add::default(), &[a, shortcut]);
    g.add(ReLU::default(), &[sum])
}
