//! Networks nobody tuned for: graphs drawn at random from a seed (convs of
//! 1x1 to 7x7, square or not, stride 1 or 2, every padding kind, with or
//! without bias; BatchNorm with or without its scale; five activations; max
//! and average pools; residual adds and channel concats; three heads), on
//! inputs of odd sizes and channel counts. On each: the GPU's logits, loss
//! and gradients against the CPU path's, a few training steps that stay
//! finite, and a save/load round trip that predicts the same. A drawn graph
//! whose shapes do not fit is refused with a typed error, never a panic.

mod common;

use aether::conv::Padding;
use aether::model::{Loss, Metric};
use aether::nn::{
    Add, AvgPool2d, BatchNorm, Concat, Conv2d, Dense, Flatten, GELU, GlobalAvgPool, GlobalMaxPool,
    Identity, LeakyReLU, MaxPool2d, ReLU, SiLU,
};
use aether::optim::Adam;
use aether::{AetherError, Device, Graph, Model, NodeId};
use common::{Rng, report};

/// A node of the drawn graph and its output's `[h, w, c]`.
#[derive(Clone, Copy)]
struct Node {
    id: NodeId,
    shape: [usize; 3],
}

/// The graph drawn from `seed`, its per-sample input shape and class count.
/// Shapes are tracked here only to keep the draw mostly valid (adds of equal
/// shapes, convs that fit); the model checks them itself.
fn drawn(seed: u64) -> (Model, [usize; 3], usize, String) {
    let mut rng = Rng::seeded(seed);
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    let input = [5 + pick(8), 5 + pick(8), [1, 2, 3, 5][pick(4)]];
    let classes = 2 + pick(9);
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
        let filters = [3, 4, 8, 12, 16, 24][pick(6)];
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
    let last = nodes[nodes.len() - 1].id;
    let head = match pick(3) {
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

/// Per tensor, `got`'s distance from `want` relative to `want`'s norm, or to
/// 2% of the whole gradient's where a tensor's own is below that: some
/// gradients are 0 but for rounding (a bias before BatchNorm, or before a
/// padless conv into one) or nearly cancel (a one-input-channel 1x1 conv into
/// BatchNorm, whose output does not depend on the weight's scale), where the
/// GPU's f16 operands leave rounding noise.
fn errors(got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)]) -> Vec<f64> {
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let total = want
        .iter()
        .map(|(_, c)| norm(c).powi(2))
        .sum::<f64>()
        .sqrt();
    got.iter()
        .zip(want)
        .map(|((_, g), (_, c))| norm_rel(g, c) * norm(c) / norm(c).max(2e-2 * total))
        .collect()
}

fn norm_rel(got: &[f32], want: &[f32]) -> f64 {
    let (mut d, mut n) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        d += (f64::from(g) - f64::from(w)).powi(2);
        n += f64::from(w).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

/// The model of `seed` on `device`, or `None` where its shapes do not fit
/// (a typed error naming the shape: the draw may make a conv larger than its
/// input).
fn built(seed: u64, device: &Device) -> Option<(Model, [usize; 3], usize, String)> {
    let (mut model, input, classes, text) = drawn(seed);
    model.to(device).unwrap();
    match model.finalize(&input) {
        Ok(()) => Some((model, input, classes, text)),
        Err(AetherError::InvalidShape { .. } | AetherError::ShapeMismatch { .. }) => None,
        Err(e) => panic!("seed {seed} ({text}): {e}"),
    }
}

#[test]
fn drawn_networks_on_the_gpu_match_the_cpu() {
    let Some(gpu) = common::gpu() else { return };
    let mut rng = Rng::fresh();
    let count: usize = std::env::var("AETHER_TEST_NETWORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let mut checked = 0;
    let dir = common::TempDir::new("unseen-networks");
    while checked < count {
        let seed = match std::env::var("AETHER_TEST_NETWORK") {
            Ok(v) => v.parse().expect("AETHER_TEST_NETWORK is a u64 seed"),
            Err(_) => rng.next_u64(),
        };
        let Some((mut cpu, input, classes, text)) = built(seed, &Device::Cpu) else {
            continue;
        };
        let (mut on_gpu, ..) = built(seed, &gpu).unwrap();
        checked += 1;
        let batch = 3 + (seed % 4) as usize;
        // The batch drawn from the network's seed too: one seed replays a case.
        let x = Rng::seeded(seed ^ 0x5eed).vec(batch * input.iter().product::<usize>());
        let y: Vec<u32> = (0..batch)
            .map(|i| ((seed as usize + i * 7) % classes) as u32)
            .collect();
        let context = format!("seed {seed}: {text}");
        // Parameters moved off their initial values, as after some training:
        // zero biases and betas put whole regions exactly on ReLU's kink at
        // initialisation (a padded conv's border is its bias; a BatchNorm over
        // a zero-mean input has a mean of 0 but for rounding), where the CPU
        // and the GPU each take one side of it, both right.
        let mut jitter = Rng::seeded(seed ^ 0x1177);
        let moved: Vec<(String, Vec<f32>)> = cpu
            .tensors()
            .unwrap()
            .into_iter()
            .map(|(n, t)| {
                let v = t.to_vec_f32().unwrap();
                (
                    n,
                    v.into_iter().map(|v| v + 0.1 * jitter.uniform()).collect(),
                )
            })
            .collect();
        cpu.set_tensors(&moved).unwrap();
        on_gpu.set_tensors(&moved).unwrap();
        let logits_cpu = cpu.predict(&x, 2, true).unwrap();
        let logits_gpu = on_gpu.predict(&x, 2, true).unwrap();
        let err = norm_rel(&logits_gpu, &logits_cpu);
        assert!(err < 3e-2, "logits differ by {err:e} ({context})");
        let want = cpu.gradients(&x, &y).unwrap();
        let got = on_gpu.gradients(&x, &y).unwrap();
        assert!(
            (got.loss - want.loss).abs() < 2e-2 * want.loss.abs(),
            "loss {} vs {} ({context})",
            got.loss,
            want.loss
        );
        // Where a max (a pool, a ReLU) has a near tie, the f16 rounding of
        // the GPU's operands may route a gradient to the other side, as any
        // perturbation of that size would: the CPU's own gradients at two
        // inputs nudged by 1e-3 give each tensor's sensitivity, which widens
        // its bound (on the random draws, most tensors move by less than 1e-2).
        let sensitivity: Vec<f64> = [1.0f32, -1.0]
            .into_iter()
            .map(|sign| {
                let nudged: Vec<f32> = x
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| v * (1.0 + sign * 1e-3 * ((i % 5) as f32 - 2.0) / 2.0))
                    .collect();
                cpu.gradients(&nudged, &y).unwrap().tensors
            })
            .fold(vec![0.0; want.tensors.len()], |acc, moved| {
                acc.iter()
                    .zip(errors(&moved, &want.tensors))
                    .map(|(a, e)| a.max(e))
                    .collect()
            });
        let mut worst = (0.0, 0.0, String::new());
        for ((err, sens), (name, _)) in errors(&got.tensors, &want.tensors)
            .into_iter()
            .zip(&sensitivity)
            .zip(&want.tensors)
        {
            if err - 2.0 * sens > worst.0 - 2.0 * worst.1 {
                worst = (err, *sens, name.clone());
            }
        }
        report(&format!(
            "[aether-test] {context}: logits {err:.1e}, worst gradient {:.1e} ({}, the CPU's own sensitivity {:.1e})",
            worst.0, worst.2, worst.1
        ));
        assert!(
            worst.0 < 0.1 + 2.0 * worst.1,
            "gradient {} off by {:e}, the CPU's own sensitivity {:e} ({context})",
            worst.2,
            worst.0,
            worst.1
        );
        for _ in 0..3 {
            on_gpu.train_batch(&x, &y).unwrap();
        }
        on_gpu.check_steps().unwrap();
        let after = on_gpu.predict(&x, batch, true).unwrap();
        assert!(
            after.iter().all(|v| v.is_finite()),
            "non-finite logits ({context})"
        );
        // The trained graph through a file: on the GPU the same bits, on the
        // CPU the same logits within the GPU's f16 operands.
        let path = dir.0.join(format!("{seed}.safetensors"));
        on_gpu.save(&path).unwrap();
        let mut loaded = Model::load(&path, &gpu).unwrap();
        let again = loaded.predict(&x, batch, true).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&again), bits(&after), "loaded on the GPU ({context})");
        let mut on_cpu = Model::load(&path, &Device::Cpu).unwrap();
        let err = norm_rel(&after, &on_cpu.predict(&x, batch, true).unwrap());
        assert!(
            err < 3e-2,
            "loaded on the CPU: logits off by {err:e} ({context})"
        );
    }
}
