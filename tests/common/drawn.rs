//! Graphs drawn at random from a seed, for tests on networks nobody tuned
//! for: convs of 1x1 to 7x7 (non-square included), stride 1 or 2, every
//! padding kind, with or without bias; BatchNorm with or without its scale;
//! five activations; max and average pools; residual adds and channel
//! concats; three heads.

use aether::conv::Padding;
use aether::model::{Loss, Metric};
use aether::nn::{
    Add, AvgPool2d, BatchNorm, Concat, Conv2d, Dense, Flatten, GELU, GlobalAvgPool, GlobalMaxPool,
    Identity, LeakyReLU, MaxPool2d, ReLU, SiLU,
};
use aether::optim::Adam;
use aether::{AetherError, Device, Graph, Model, NodeId};

use super::Rng;

/// A node of the drawn graph and its output's `[h, w, c]`.
#[derive(Clone, Copy)]
pub struct Node {
    id: NodeId,
    shape: [usize; 3],
}

/// How many networks a test draws: `AETHER_TEST_NETWORKS`, else 6.
pub fn network_count() -> usize {
    std::env::var("AETHER_TEST_NETWORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

/// The next network's seed: `AETHER_TEST_NETWORK`, which replays one, else
/// one drawn from `rng`.
pub fn next_network_seed(rng: &mut Rng) -> u64 {
    match std::env::var("AETHER_TEST_NETWORK") {
        Ok(v) => v.parse().expect("AETHER_TEST_NETWORK is a u64 seed"),
        Err(_) => rng.next_u64(),
    }
}

/// The sizes a draw picks from.
pub struct Scale {
    /// Input height and width, each in `sides.0..=sides.1`.
    pub sides: (usize, usize),
    pub input_channels: &'static [usize],
    pub filters: &'static [usize],
    pub classes: (usize, usize),
}

impl Scale {
    /// Small enough for lavapipe to train and the CPU to check.
    pub const SMALL: Self = Self {
        sides: (5, 12),
        input_channels: &[1, 2, 3, 5],
        filters: &[3, 4, 8, 12, 16, 24],
        classes: (2, 10),
    };
    /// Real networks' sizes, for planning and recording only (the noop
    /// backend): widths up to 1024, odd ones included, inputs up to 72 px.
    pub const LARGE: Self = Self {
        sides: (9, 72),
        input_channels: &[1, 3, 4],
        filters: &[16, 24, 32, 48, 64, 96, 100, 128, 160, 256, 320, 512, 1024],
        classes: (10, 1000),
    };
}

/// A drawn model, its per-sample input shape, class count and a line
/// describing it.
pub type Draw = (Model, [usize; 3], usize, String);

/// The network of `seed` at `scale`, moved to `device` and finalized;
/// `Ok(None)` where its shapes do not fit (a typed error naming the shape:
/// the draw may make a conv larger than its input). Any other error is the
/// caller's to judge.
pub fn finalized(seed: u64, scale: &Scale, device: &Device) -> Result<Option<Draw>, AetherError> {
    let (mut model, input, classes, text) = drawn(seed, scale);
    model.to(device)?;
    match model.finalize(&input) {
        Ok(()) => Ok(Some((model, input, classes, text))),
        Err(AetherError::InvalidShape { .. } | AetherError::ShapeMismatch { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The graph drawn from `seed` at `scale`. Shapes are tracked here only to
/// keep the draw mostly valid (adds of equal shapes, convs that fit); the
/// model checks them itself.
pub fn drawn(seed: u64, scale: &Scale) -> Draw {
    let mut rng = Rng::seeded(seed);
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    let side = scale.sides.1 - scale.sides.0 + 1;
    let input = [
        scale.sides.0 + pick(side),
        scale.sides.0 + pick(side),
        scale.input_channels[pick(scale.input_channels.len())],
    ];
    let classes = scale.classes.0 + pick(scale.classes.1 - scale.classes.0 + 1);
    let mut g = Graph::new();
    let mut text = format!("input {input:?}");
    let mut nodes = vec![Node {
        id: g.input(),
        shape: input,
    }];
    let blocks = 2 + pick(3);
    for _ in 0..blocks {
        let from = nodes[nodes.len() - 1];
        let [h, w, _] = from.shape;
        let kernels: Vec<(usize, usize)> = [(1, 1), (3, 3), (5, 5), (3, 1), (1, 3), (2, 2), (7, 7)]
            .into_iter()
            .filter(|&(r, s)| r <= h && s <= w)
            .collect();
        let kernel = kernels[pick(kernels.len())];
        let stride = if h >= 6 && w >= 6 && pick(3) == 0 {
            (2, 2)
        } else {
            (1, 1 + pick(2).min(w / 6))
        };
        let (padding, pad) = match pick(3) {
            0 => (
                Padding::Same,
                ((kernel.0 - 1) / 2 * 2, (kernel.1 - 1) / 2 * 2),
            ),
            1 => (Padding::Valid, (0, 0)),
            _ => {
                let (t, b, l, r) = (pick(2), pick(3), pick(2), pick(2));
                (
                    Padding::Explicit {
                        top: t,
                        bottom: b,
                        left: l,
                        right: r,
                    },
                    (t + b, l + r),
                )
            }
        };
        let filters = scale.filters[pick(scale.filters.len())];
        let bias = pick(2) == 0;
        let out_h = (h + pad.0 - kernel.0) / stride.0 + 1;
        let out_w = (w + pad.1 - kernel.1) / stride.1 + 1;
        text += &format!(
            " | conv {filters} {kernel:?} s{stride:?} {padding:?} bias {bias} -> {out_h}x{out_w}"
        );
        let conv = Conv2d::new(filters, kernel, padding)
            .stride(stride)
            .bias(bias);
        let mut node = Node {
            id: g.add(conv, &[from.id]),
            shape: [out_h, out_w, filters],
        };
        if pick(3) != 0 {
            let scale = pick(4) != 0;
            text += &format!(" bn(scale {scale})");
            node.id = g.add(BatchNorm::new(0.9, 1e-5).scale(scale), &[node.id]);
        }
        // A residual add onto an earlier node of the same shape, or a concat
        // with one of the same spatial size.
        let partner = nodes.iter().rev().find(|n| n.shape == node.shape).copied();
        let beside = nodes
            .iter()
            .rev()
            .find(|n| n.shape[..2] == node.shape[..2] && n.id != node.id)
            .copied();
        match (pick(3), partner, beside) {
            (0, Some(p), _) => {
                text += " add";
                node.id = g.add(Add::default(), &[node.id, p.id]);
            }
            (1, _, Some(b)) => {
                text += &format!(" concat +{}", b.shape[2]);
                node.id = g.add(Concat::default(), &[node.id, b.id]);
                node.shape[2] += b.shape[2];
            }
            _ => {}
        }
        let activation = pick(5);
        text += [" relu", " leaky", " gelu", " silu", " identity"][activation];
        node.id = match activation {
            0 => g.add(ReLU::default(), &[node.id]),
            1 => g.add(LeakyReLU::new(0.1), &[node.id]),
            2 => g.add(GELU::default(), &[node.id]),
            3 => g.add(SiLU::default(), &[node.id]),
            _ => g.add(Identity, &[node.id]),
        };
        let [h, w, c] = node.shape;
        if h >= 4 && w >= 4 && pick(3) == 0 {
            let (pool, stride) = ([(2, 2), (3, 3), (2, 3)][pick(3)], (2, 1 + pick(2)));
            let max = pick(2) == 0;
            text += &format!(
                " {}pool {pool:?} s{stride:?}",
                if max { "max" } else { "avg" }
            );
            node.id = if max {
                g.add(MaxPool2d::new(pool, stride, Padding::Valid), &[node.id])
            } else {
                g.add(AvgPool2d::new(pool, stride, Padding::Valid), &[node.id])
            };
            node.shape = [(h - pool.0) / stride.0 + 1, (w - pool.1) / stride.1 + 1, c];
        }
        nodes.push(node);
    }
    let last = nodes[nodes.len() - 1];
    // Flattened features into the dense layer only where they are few, as in
    // real networks (a 1024-wide map of 40x3 would make a 50M-weight layer).
    let heads = if last.shape.iter().product::<usize>() <= 1 << 13 {
        3
    } else {
        2
    };
    let last = last.id;
    let head = match pick(heads) {
        0 => {
            text += " | global avg";
            g.add(GlobalAvgPool::default(), &[last])
        }
        1 => {
            text += " | global max";
            g.add(GlobalMaxPool::default(), &[last])
        }
        _ => {
            text += " | flatten";
            last
        }
    };
    let flat = g.add(Flatten::default(), &[head]);
    g.add(Dense::new(classes), &[flat]);
    text += &format!(" | dense {classes}");
    let mut model = Model::from_graph(g).seed(seed);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.1,
        },
        Adam::adamw(1e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    (model, input, classes, text)
}
