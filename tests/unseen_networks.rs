//! Networks nobody tuned for: graphs drawn at random from a seed (convs of
//! 1x1 to 7x7, square or not, stride 1 or 2, every padding kind, with or
//! without bias; BatchNorm with or without its scale; five activations; max
//! and average pools; residual adds and channel concats; three heads), on
//! inputs of odd sizes and channel counts. On each: the GPU's logits, loss
//! and gradients against the CPU path's, a few training steps that stay
//! finite, and a save/load round trip that predicts the same. A drawn graph
//! whose shapes do not fit is refused with a typed error, never a panic.

mod common;

use aether::{Device, Model};
use common::drawn::{Draw, Scale, drawn, finalized, network_count, next_network_seed};
use common::{Rng, report};

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

/// The small network of `seed` on `device`, or `None` where its shapes do
/// not fit.
fn built(seed: u64, device: &Device) -> Option<Draw> {
    finalized(seed, &Scale::SMALL, device)
        .unwrap_or_else(|e| panic!("seed {seed} ({}): {e}", drawn(seed, &Scale::SMALL).3))
}

#[test]
fn drawn_networks_on_the_gpu_match_the_cpu() {
    let Some(gpu) = common::gpu() else { return };
    let mut rng = Rng::fresh();
    let count = network_count();
    let mut checked = 0;
    let dir = common::TempDir::new("unseen-networks");
    while checked < count {
        let seed = next_network_seed(&mut rng);
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
        // Where a max (a pool, a ReLU) or a kink (LeakyReLU's) has a value
        // near its tie, the f16 rounding of the GPU's operands may route a
        // gradient to the other side, as any perturbation of that size
        // would. The CPU's own gradients at four nudged points (the input by
        // 3e-3, the parameters by 1e-3, each both ways, in a pattern) give
        // each tensor's sensitivity, which widens its bound; smooth tensors
        // move by about the nudge.
        let pattern =
            |i: usize, sign: f32, size: f32| 1.0 + sign * size * ((i % 5) as f32 - 2.0) / 2.0;
        let mut nudged_gradients = Vec::new();
        for sign in [1.0f32, -1.0] {
            let nudged: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| v * pattern(i, sign, 3e-3))
                .collect();
            nudged_gradients.push(cpu.gradients(&nudged, &y).unwrap().tensors);
            let params: Vec<(String, Vec<f32>)> = moved
                .iter()
                .map(|(n, v)| {
                    let v = v
                        .iter()
                        .enumerate()
                        .map(|(i, &w)| w * pattern(i + 1, sign, 1e-3));
                    (n.clone(), v.collect())
                })
                .collect();
            cpu.set_tensors(&params).unwrap();
            nudged_gradients.push(cpu.gradients(&x, &y).unwrap().tensors);
            cpu.set_tensors(&moved).unwrap();
        }
        let sensitivity =
            nudged_gradients
                .iter()
                .fold(vec![0.0f64; want.tensors.len()], |acc, moved| {
                    acc.iter()
                        .zip(errors(moved, &want.tensors))
                        .map(|(a, e)| a.max(e))
                        .collect::<Vec<f64>>()
                });
        // Each tensor within 0.1 plus twice its sensitivity; the one nearest
        // its bound is reported.
        let (err_worst, sens_worst, name) = errors(&got.tensors, &want.tensors)
            .into_iter()
            .zip(sensitivity)
            .zip(&want.tensors)
            .map(|((err, sens), (name, _))| (err, sens, name.as_str()))
            .max_by(|a, b| (a.0 - 2.0 * a.1).total_cmp(&(b.0 - 2.0 * b.1)))
            .expect("a model with parameters");
        report(&format!(
            "[aether-test] {context}: logits {err:.1e}, worst gradient {err_worst:.1e} ({name}, the CPU's own sensitivity {sens_worst:.1e})"
        ));
        assert!(
            err_worst < 0.1 + 2.0 * sens_worst,
            "gradient {name} off by {err_worst:e}, the CPU's own sensitivity {sens_worst:e} ({context})"
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
