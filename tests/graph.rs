//! Graph models and the layers they need: Add, Concat, GELU, SiLU, Identity,
//! Scale and convs without bias, each against a reference written here; a
//! graph's gradients against finite differences on a DAG with a fork; GPU
//! against CPU; files of graph models; and bad graphs refused naming the layer.

mod common;

use std::collections::HashMap;

use aether::conv::Padding;
use aether::conv::clip_f16_range;
use aether::data::synthetic_images;
use aether::gpu::DevicePreference;
use aether::model::{Loss, Metric};
use aether::nn::{
    Add, BatchNorm, Concat, Conv2d, Dense, Flatten, GELU, GlobalAvgPool, Identity, ReLU, Scale,
    SiLU,
};
use aether::ops::activation::{
    Smooth, smooth_activation, smooth_activation_as, smooth_activation_backward,
};
use aether::ops::arith::{add, add_relu, add_relu_backward, scale};
use aether::ops::concat::{concat_channels, split_channels};
use aether::optim::Adam;
use aether::tensor::DType;
use aether::{AetherError, Device, Graph, Model, NodeId, Tensor, TrainOptions};
use common::{Rng, f32_bits, report};

fn norm_rel(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut d, mut n) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        d += (f64::from(g) - w).powi(2);
        n += w.powi(2);
    }
    (d / n).sqrt()
}

/// erf in f64 by its Maclaurin series (|z| < 4 here: every term is far below
/// f64's rounding once the series has converged).
fn erf64(z: f64) -> f64 {
    let (mut term, mut sum, mut n) = (z, z, 0.0f64);
    while term.abs() > 1e-17 * sum.abs().max(1e-300) || n < 3.0 {
        n += 1.0;
        term *= -z * z / n;
        sum += term / (2.0 * n + 1.0);
        if n > 200.0 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn gelu64(x: f64) -> (f64, f64) {
    let cdf = 0.5 * (1.0 + erf64(x / std::f64::consts::SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    (x * cdf, cdf + x * pdf)
}

fn silu64(x: f64) -> (f64, f64) {
    let s = 1.0 / (1.0 + (-x).exp());
    (x * s, s * (1.0 + x * (1.0 - s)))
}

/// Odd: the last workgroup of 256 is partly empty.
const LEN: usize = 3 * 257 + 11;

test_device!(add_and_scale_are_one_rounding, |device: &Device| {
    // The arith kernels move four values an invocation where the length
    // divides by 4, else one: both lengths, each ending in a partial workgroup.
    for len in [LEN, 4 * 257 + 12] {
        add_and_scale_are_one_rounding_at(device, len);
    }
});

fn add_and_scale_are_one_rounding_at(device: &Device, len: usize) {
    let mut rng = Rng::fresh();
    let (a, mut b) = (rng.vec(len), rng.vec(len));
    // A NaN must pass add_relu's ReLU, as ReLU lets it; -0.0 sums stay -0.0.
    b[5] = f32::NAN;
    let factor = 1.0 / 9.0 + rng.uniform() * 0.01;
    let ta = Tensor::from_f32(vec![len], a.clone(), device).unwrap();
    let tb = Tensor::from_f32(vec![len], b.clone(), device).unwrap();
    let sum = f32_bits(&add(&ta, &tb).unwrap());
    let scaled = f32_bits(&scale(&ta, factor).unwrap());
    let rectified = f32_bits(&add_relu(&ta, &tb).unwrap());
    // The ReLU's output for the masked sum: positive, zero, -0.0, negative and NaN.
    let mut y: Vec<f32> = (0..len).map(|i| rng.vec(1)[0] * (i % 3) as f32).collect();
    y[7] = f32::NAN;
    y[8] = -0.0;
    let ty = Tensor::from_f32(vec![len], y.clone(), device).unwrap();
    let masked = f32_bits(&add_relu_backward(&ta, &tb, &ty).unwrap());
    for i in 0..len {
        let want_sum = (f64::from(a[i]) + f64::from(b[i])) as f32;
        let want_masked = if y[i] > 0.0 { want_sum } else { 0.0 };
        assert_eq!(
            masked[i],
            want_masked.to_bits(),
            "add_relu_backward at {i} (seed {})",
            rng.seed
        );
    }
    for i in 0..len {
        // A sum or product of two f32 is exact in f64: one rounding after.
        let want_sum = (f64::from(a[i]) + f64::from(b[i])) as f32;
        let want_rectified = if want_sum < 0.0 { 0.0 } else { want_sum };
        assert_eq!(
            rectified[i],
            want_rectified.to_bits(),
            "add_relu at {i} (seed {})",
            rng.seed
        );
        let want_scaled = (f64::from(factor) * f64::from(a[i])) as f32;
        assert_eq!(sum[i], want_sum.to_bits(), "add at {i} (seed {})", rng.seed);
        assert_eq!(
            scaled[i],
            want_scaled.to_bits(),
            "scale at {i} (seed {})",
            rng.seed
        );
    }
    let short = Tensor::from_f32(vec![len - 1], a[1..].to_vec(), device).unwrap();
    assert!(matches!(
        add(&ta, &short),
        Err(AetherError::ShapeMismatch { .. })
    ));
    assert!(scale(&ta, f32::NAN).is_err());
}

test_device!(gelu_and_silu_match_f64, |device: &Device| {
    let mut rng = Rng::fresh();
    // Spread over [-4, 4), where both curves bend; a NaN must stay NaN.
    let mut xs: Vec<f32> = rng.vec(LEN).iter().map(|v| 4.0 * v).collect();
    xs[7] = 0.0;
    let dys = rng.vec(LEN);
    let x = Tensor::from_f32(vec![LEN], xs.clone(), device).unwrap();
    let dy = Tensor::from_f32(vec![LEN], dys.clone(), device).unwrap();
    for (kind, reference) in [
        (Smooth::Gelu, gelu64 as fn(f64) -> (f64, f64)),
        (Smooth::Silu, silu64),
    ] {
        let y = smooth_activation(&x, kind).unwrap().to_vec_f32().unwrap();
        let dx = smooth_activation_backward(&x, &dy, kind)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let want_y: Vec<f64> = xs.iter().map(|&v| reference(f64::from(v)).0).collect();
        let want_dx: Vec<f64> = xs
            .iter()
            .zip(&dys)
            .map(|(&v, &d)| reference(f64::from(v)).1 * f64::from(d))
            .collect();
        // erf's approximation is within 1.5e-7; the rest is f32 rounding.
        let (ey, edx) = (norm_rel(&y, &want_y), norm_rel(&dx, &want_dx));
        assert!(
            ey < 1e-6 && edx < 1e-6,
            "{kind:?} on {}: forward {ey:e}, backward {edx:e} (seed {})",
            device.name(),
            rng.seed
        );
    }
    let mut with_nan = xs.clone();
    with_nan[5] = f32::NAN;
    let x = Tensor::from_f32(vec![LEN], with_nan, device).unwrap();
    for kind in [Smooth::Gelu, Smooth::Silu] {
        assert!(smooth_activation(&x, kind).unwrap().to_vec_f32().unwrap()[5].is_nan());
    }
});

test_device!(
    smooth_activations_stored_as_f16_are_their_f32_values_rounded,
    |device: &Device| {
        let mut rng = Rng::fresh();
        // Past f16's range both ways (saturated at +-65504), tiny values
        // (subnormal f16), a NaN; LEN is not a multiple of the kernel's eight.
        let mut xs: Vec<f32> = rng.vec(LEN).iter().map(|v| 4.0 * v).collect();
        xs[3] = 1e6;
        xs[4] = -1e6;
        xs[9] = 3e-6;
        xs[10] = f32::NAN;
        xs[LEN - 1] = 2e5;
        let x = Tensor::from_f32(vec![LEN], xs, device).unwrap();
        for kind in [Smooth::Gelu, Smooth::Silu] {
            let y = smooth_activation(&x, kind).unwrap().to_vec_f32().unwrap();
            let want: Vec<u16> = y
                .iter()
                .map(|&v| half::f16::from_f32(clip_f16_range(v)).to_bits())
                .collect();
            let stored = smooth_activation_as(&x, kind, DType::F16).unwrap();
            assert_eq!(stored.dtype(), DType::F16);
            let got: Vec<u16> = stored
                .to_vec_f32()
                .unwrap()
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            assert_eq!(
                got,
                want,
                "{kind:?} on {} (seed {})",
                device.name(),
                rng.seed
            );
        }
        assert!(smooth_activation_as(&x, Smooth::Gelu, DType::U32).is_err());
    }
);

test_device!(concat_and_split_move_channels_exactly, |device: &Device| {
    let mut rng = Rng::fresh();
    let lead = [2usize, 3, 5];
    let rows: usize = lead.iter().product();
    let widths = [3usize, 1, 6];
    let parts: Vec<Vec<f32>> = widths.iter().map(|&w| rng.vec(rows * w)).collect();
    let tensors: Vec<Tensor> = parts
        .iter()
        .zip(widths)
        .map(|(p, w)| Tensor::from_f32(vec![2, 3, 5, w], p.clone(), device).unwrap())
        .collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let joined = concat_channels(&refs).unwrap();
    assert_eq!(joined.dims(), &[2, 3, 5, 10]);
    let mut want = Vec::new();
    for row in 0..rows {
        for (p, &w) in parts.iter().zip(&widths) {
            want.extend_from_slice(&p[row * w..(row + 1) * w]);
        }
    }
    let got = joined.to_vec_f32().unwrap();
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "concat on {} (seed {})",
        device.name(),
        rng.seed
    );
    let back = split_channels(&joined, &widths).unwrap();
    for (piece, part) in back.iter().zip(&parts) {
        assert_eq!(&piece.to_vec_f32().unwrap(), part);
    }
    let other = Tensor::from_f32(vec![2, 3, 4, 1], rng.vec(24), device).unwrap();
    assert!(concat_channels(&[&tensors[0], &other]).is_err());
    assert!(split_channels(&joined, &[3, 3]).is_err());
});

/// A DAG with a fork: the first conv's output feeds a branch, the residual
/// add and the concat; smooth activations keep finite differences exact.
fn forked_graph(seed: u64) -> Model {
    let mut g = Graph::new();
    let x = g.input();
    let a = g.add(Conv2d::new(4, (3, 3), Padding::Same), &[x]);
    let b = g.add(GELU::default(), &[a]);
    let b = g.add(Conv2d::new(4, (3, 3), Padding::Same).bias(false), &[b]);
    let sum = g.add(Add::default(), &[b, a]);
    let s = g.add(SiLU::default(), &[sum]);
    let skip = g.add(Identity, &[a]);
    let joined = g.add(Concat::default(), &[s, skip]);
    let c = g.add(
        Conv2d::new(6, (1, 1), Padding::Valid).stride((2, 2)),
        &[joined],
    );
    let c = g.add(Scale::new(1.5), &[c]);
    let pooled = g.add(GlobalAvgPool::default(), &[c]);
    let flat = g.add(Flatten::default(), &[pooled]);
    g.add(Dense::new(3), &[flat]);
    let mut model = Model::from_graph(g).seed(seed);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.1,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    model
}

/// On a GPU whose convs take f16 operands, the GELU that feeds a conv writes
/// f16 (what the conv would round it to): the forked graph's predictions and
/// gradients stay those of the CPU within the f16 operands' rounding.
#[test]
fn a_gelu_feeding_a_conv_hands_over_f16_on_the_gpu() {
    let Some(gpu) = common::gpu() else { return };
    let mut rng = Rng::fresh();
    let input = [6usize, 7, 3];
    let (x, y) = synthetic_images(5, 6, 7, rng.next_u64()).unwrap();
    let y: Vec<u32> = y.iter().map(|l| l % 3).collect();
    let on = |device: &Device| {
        let mut model = forked_graph(rng.seed);
        model.to(device).unwrap();
        model.finalize(&input).unwrap();
        let logits = model.predict(&x, 5, true).unwrap();
        (
            model.f16_outputs(),
            logits,
            model.gradients(&x, &y).unwrap(),
        )
    };
    let (_, cpu_logits, cpu) = on(&Device::Cpu);
    let (f16_outputs, gpu_logits, gpu_grads) = on(&gpu);
    let f16_convs = gpu.gpu_context().unwrap().caps().shader_f16;
    if f16_convs {
        assert!(
            f16_outputs.contains(&1),
            "GELU (layer 1) feeds a conv: {f16_outputs:?}"
        );
    }
    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let err = norm_rel(&gpu_logits, &widen(&cpu_logits));
    assert!(err < 2e-2, "logits differ by {err:e} (seed {})", rng.seed);
    for ((name, g), (_, c)) in gpu_grads.tensors.iter().zip(&cpu.tensors) {
        let err = norm_rel(g, &widen(c));
        assert!(err < 0.2, "{name}: {err:e} (seed {})", rng.seed);
    }
}

/// A model file's tensors: shape and values by name.
type FileTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// The tensors of a saved model file, by name, and its metadata.
fn file_tensors(bytes: &[u8]) -> (FileTensors, HashMap<String, String>) {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let tensors = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values: Vec<f32> = bytemuck::pod_collect_to_vec(view.data());
            (name, (view.shape().to_vec(), values))
        })
        .collect();
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).unwrap();
    (tensors, meta.metadata().clone().unwrap())
}

fn file_with(tensors: &FileTensors, metadata: &HashMap<String, String>) -> Vec<u8> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, (shape, values))| {
            (
                name.clone(),
                shape.clone(),
                bytemuck::cast_slice(values).to_vec(),
            )
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(name, shape, data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, Some(metadata.clone())).unwrap()
}

#[test]
fn graph_gradients_match_finite_differences_on_cpu() {
    let mut rng = Rng::fresh();
    let input = [5usize, 5, 3];
    let batch = 4;
    let x = rng.vec(batch * input.iter().product::<usize>());
    let y: Vec<u32> = (0..batch as u32).map(|i| (i * 7 + 1) % 3).collect();
    let mut model = forked_graph(rng.seed);
    model.finalize(&input).unwrap();
    let grads = model.gradients(&x, &y).unwrap().tensors;
    let names: Vec<&str> = grads.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "layers.0.kernel",
            "layers.0.bias",
            "layers.2.kernel",
            "layers.7.kernel",
            "layers.7.bias",
            "layers.11.kernel",
            "layers.11.bias"
        ],
        "the bias-free conv (layer 2) has no bias gradient"
    );
    let path = std::env::temp_dir().join(format!("aether-graph-fd-{}.safetensors", rng.seed));
    model.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let (tensors, metadata) = file_tensors(&bytes);
    let loss_with = |name: &str, index: usize, delta: f32| -> f64 {
        let mut changed = tensors.clone();
        changed.get_mut(name).unwrap().1[index] += delta;
        let mut probe =
            Model::from_bytes("probe", &file_with(&changed, &metadata), &Device::Cpu).unwrap();
        f64::from(probe.gradients(&x, &y).unwrap().loss)
    };
    for (name, grad) in &grads {
        let picks: Vec<usize> = (0..5)
            .map(|_| (rng.next_u64() % grad.len() as u64) as usize)
            .collect();
        let h = 1e-2f32;
        let numeric: Vec<f64> = picks
            .iter()
            .map(|&i| (loss_with(name, i, h) - loss_with(name, i, -h)) / (2.0 * f64::from(h)))
            .collect();
        let analytic: Vec<f32> = picks.iter().map(|&i| grad[i]).collect();
        let err = norm_rel(&analytic, &numeric);
        assert!(
            err < 2e-2,
            "{name} at {picks:?}: analytic {analytic:?} vs numeric {numeric:?}: error {err:e} (seed {})",
            rng.seed
        );
    }
}

/// Two residual blocks with BatchNorm and ReLU (the fusions' case), the
/// first with a projection shortcut, the second with the identity, as
/// ResNet's: the first block's output feeds the second's conv and its add,
/// so its gradient is a sum at a fork.
fn residual_graph(seed: u64) -> Model {
    let mut g = Graph::new();
    let x = g.input();
    let stem = g.add(Conv2d::new(8, (3, 3), Padding::Same).bias(false), &[x]);
    let stem = g.add(BatchNorm::new(0.9, 1e-5), &[stem]);
    let stem = g.add(ReLU::default(), &[stem]);
    let a = g.add(
        Conv2d::new(16, (3, 3), Padding::Same)
            .stride((2, 2))
            .bias(false),
        &[stem],
    );
    let a = g.add(BatchNorm::new(0.9, 1e-5), &[a]);
    let a = g.add(ReLU::default(), &[a]);
    // Bias-free before BatchNorm, which cancels a bias (its gradient is 0).
    let a = g.add(Conv2d::new(16, (3, 3), Padding::Same).bias(false), &[a]);
    let a = g.add(BatchNorm::new(0.9, 1e-5), &[a]);
    let shortcut = g.add(
        Conv2d::new(16, (1, 1), Padding::Valid).stride((2, 2)),
        &[stem],
    );
    let sum = g.add(Add::default(), &[a, shortcut]);
    let h = g.add(ReLU::default(), &[sum]);
    let b = g.add(Conv2d::new(16, (3, 3), Padding::Same).bias(false), &[h]);
    let b = g.add(BatchNorm::new(0.9, 1e-5), &[b]);
    let sum = g.add(Add::default(), &[b, h]);
    let h = g.add(ReLU::default(), &[sum]);
    let h = g.add(GlobalAvgPool::default(), &[h]);
    let h = g.add(Flatten::default(), &[h]);
    g.add(Dense::new(10), &[h]);
    let mut model = Model::from_graph(g).seed(seed);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(3e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    model
}

const SIDE: usize = 9;

/// The residual graph's ReLUs after Add, run inside Add or as layers of
/// their own, give the same loss and gradients: the fused passes (the add
/// and its ReLU; the gradients summed at the fork and that ReLU's mask) are
/// the same f32 operations (on the CPU, bit for bit; on a GPU, within f16
/// hand-offs). On a GPU the masked sum is seen to run.
#[test]
fn a_relu_folded_into_add_changes_no_gradient() {
    let mut rng = Rng::fresh();
    let (x, y) = synthetic_images(6, SIDE, SIDE, rng.next_u64()).unwrap();
    // A device of this test's own: the shared one's timed regions would also
    // see the dispatches of tests running beside this one.
    let own_gpu = common::gpu().map(|_| {
        Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap()
    });
    let devices: Vec<Device> = [Some(Device::Cpu), own_gpu].into_iter().flatten().collect();
    for device in &devices {
        let run = |fuse: bool| {
            let mut model = residual_graph(rng.seed).fuse_activations(fuse);
            model.to(device).unwrap();
            model.finalize(&[SIDE, SIDE, 3]).unwrap();
            let fused = model.fused_activations();
            let Some(ctx) = device.gpu_context().filter(|c| c.caps().timestamps) else {
                return (fused, model.gradients(&x, &y).unwrap(), None);
            };
            let (gradients, times) = ctx.timed(1024, || model.gradients(&x, &y)).unwrap();
            let masked_sums = times
                .iter()
                .filter(|t| t.label == "add_relu_backward")
                .count();
            (fused, gradients, Some(masked_sums))
        };
        let (fused, with, masked_with) = run(true);
        let (unfused, without, masked_without) = run(false);
        assert!(
            fused.contains(&10) && unfused.is_empty(),
            "{fused:?} {unfused:?}"
        );
        if let (Some(with), Some(without)) = (masked_with, masked_without) {
            assert_eq!((with, without), (1, 0), "masked gradient sums at the fork");
        }
        let device_name = device.name();
        if matches!(device, Device::Cpu) {
            assert_eq!(with.loss.to_bits(), without.loss.to_bits(), "loss");
            for ((name, a), (_, b)) in with.tensors.iter().zip(&without.tensors) {
                assert_eq!(f32_bits_of(a), f32_bits_of(b), "{name} on {device_name}");
            }
        } else {
            for ((name, a), (_, b)) in with.tensors.iter().zip(&without.tensors) {
                let err = norm_rel(a, &b.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
                assert!(
                    err < 1e-2,
                    "{name} on {device_name}: {err:e} (seed {})",
                    rng.seed
                );
            }
        }
    }
}

fn f32_bits_of(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn graph_on_the_gpu_matches_the_cpu() {
    let Some(gpu) = common::gpu() else { return };
    let mut rng = Rng::fresh();
    let (x, y) = synthetic_images(6, SIDE, SIDE, rng.next_u64()).unwrap();
    let on = |device: &Device| {
        let mut model = residual_graph(rng.seed);
        model.to(device).unwrap();
        model.finalize(&[SIDE, SIDE, 3]).unwrap();
        let logits = model.predict(&x, 4, true).unwrap();
        let gradients = model.gradients(&x, &y).unwrap();
        (model, logits, gradients.loss, gradients.tensors)
    };
    let (cpu_model, cpu_logits, cpu_loss, cpu_grads) = on(&Device::Cpu);
    let (gpu_model, gpu_logits, gpu_loss, gpu_grads) = on(&gpu);
    assert_eq!(
        cpu_model.fused_activations(),
        [2, 5, 10, 14],
        "ReLUs after BatchNorm and Add fold where that output feeds them alone"
    );
    assert_eq!(gpu_model.fused_activations(), cpu_model.fused_activations());
    report(&format!(
        "[aether-test] residual graph on the GPU: f16 outputs {:?}, f16 input gradients {:?}",
        gpu_model.f16_outputs(),
        gpu_model.f16_input_grads()
    ));
    // The GPU's convs take f16 operands: a few parts in a thousand.
    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let err = norm_rel(&gpu_logits, &widen(&cpu_logits));
    assert!(err < 2e-2, "logits differ by {err:e} (seed {})", rng.seed);
    assert!(
        (gpu_loss - cpu_loss).abs() < 1e-2 * cpu_loss.abs(),
        "loss {gpu_loss} vs {cpu_loss}"
    );
    let mut worst = (0.0f64, String::new());
    for ((name, g), (cpu_name, c)) in gpu_grads.iter().zip(&cpu_grads) {
        assert_eq!(name, cpu_name);
        let e = norm_rel(g, &widen(c));
        if e > worst.0 {
            worst = (e, name.clone());
        }
        // The GPU's f16 operands (activations and weights; the output
        // gradients are loss-scaled): per tensor, errors of up to 0.107 over
        // 40 seeds (0.001-0.06 typical), the worst in BatchNorm's beta and
        // gamma on this 6-image batch. Loss scaling moves them by less than
        // 1e-5 here, where (p - t) / 6 is far from f16's subnormals:
        // tests/loss_scale.rs has the case it changes.
        let err = norm_rel(g, &widen(c));
        assert!(
            err < 0.2,
            "{name}: GPU gradient differs by {err:e} (seed {})",
            rng.seed
        );
    }
    report(&format!(
        "[aether-test] residual graph: worst per-tensor gradient error {:e} ({}, seed {})",
        worst.0, worst.1, rng.seed
    ));
}

test_device!(
    a_residual_graph_learns_and_round_trips,
    |device: &Device| {
        let (x, y) = synthetic_images(96, SIDE, SIDE, 11).unwrap();
        let mut model = residual_graph(3);
        model.to(device).unwrap();
        model.finalize(&[SIDE, SIDE, 3]).unwrap();
        let options = TrainOptions {
            epochs: 4,
            batch_size: 16,
            progress: false,
            ..TrainOptions::default()
        };
        let history = model.train(&x, &y, &options).unwrap();
        let (first, last) = (&history.epochs[0], history.epochs.last().unwrap());
        report(&format!(
            "[aether-test] residual graph on {}: loss {:.3} -> {:.3}",
            device.name(),
            first.loss,
            last.loss
        ));
        assert!(last.loss < first.loss, "loss must fall: {history:?}");
        let path = std::env::temp_dir().join(format!(
            "aether-graph-{}-{}.safetensors",
            std::process::id(),
            device.name().len()
        ));
        model.save(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let (_, metadata) = file_tensors(&bytes);
        assert!(metadata.values().any(|m| m.contains("aether-model-v2")));
        let mut loaded = Model::load(&path, device).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(loaded.layer_inputs(8), Some(&[NodeId::Layer(2)][..]));
        assert_eq!(
            loaded.layer_inputs(9),
            Some(&[NodeId::Layer(7), NodeId::Layer(8)][..])
        );
        let before = model.predict(&x[..3 * SIDE * SIDE * 3], 3, true).unwrap();
        let after = loaded.predict(&x[..3 * SIDE * SIDE * 3], 3, true).unwrap();
        assert_eq!(before, after, "a loaded graph predicts as the saved one");
    }
);

#[test]
fn plain_stacks_still_save_in_the_first_format() {
    let mut model = Model::new();
    model.add(Flatten::default()).add(Dense::new(3));
    model.finalize(&[2, 2, 1]).unwrap();
    let path =
        std::env::temp_dir().join(format!("aether-stack-{}.safetensors", std::process::id()));
    model.save(&path).unwrap();
    let (_, metadata) = file_tensors(&std::fs::read(&path).unwrap());
    std::fs::remove_file(&path).ok();
    let arch = metadata.values().next().unwrap();
    assert!(arch.contains("aether-model-v1"), "{arch}");
    assert!(
        !arch.contains("inputs") && !arch.contains("\"bias\""),
        "{arch}"
    );
}

fn graph_error(build: impl FnOnce(&mut Graph)) -> String {
    let mut g = Graph::new();
    build(&mut g);
    let mut model = Model::from_graph(g);
    match model.finalize(&[4, 4, 2]) {
        Err(AetherError::Model(message)) => message,
        other => panic!("expected a Model error, got {other:?}"),
    }
}

#[test]
fn bad_graphs_are_refused_naming_the_layer() {
    let conv = || Conv2d::new(2, (1, 1), Padding::Valid);
    let cycle = graph_error(|g| {
        let x = g.input();
        let a = g.add(conv(), &[NodeId::Layer(1)]);
        g.add(Add::default(), &[a, x]);
    });
    assert!(
        cycle.contains("graph layer 0 (Conv2d)") && cycle.contains("layer 1"),
        "{cycle}"
    );
    let dangling = graph_error(|g| {
        g.add(conv(), &[NodeId::Layer(7)]);
    });
    assert!(dangling.contains("does not exist"), "{dangling}");
    let unused = graph_error(|g| {
        let x = g.input();
        g.add(conv(), &[x]);
        g.add(conv(), &[x]);
    });
    assert!(
        unused.contains("graph layer 0") && unused.contains("never used"),
        "{unused}"
    );
    let mismatch = graph_error(|g| {
        let x = g.input();
        let a = g.add(Conv2d::new(3, (1, 1), Padding::Valid), &[x]);
        g.add(Add::default(), &[a, x]);
    });
    assert!(
        mismatch.contains("layer 1") && mismatch.contains("Add"),
        "{mismatch}"
    );
    let concat = graph_error(|g| {
        let x = g.input();
        let a = g.add(Conv2d::new(3, (2, 2), Padding::Valid), &[x]);
        g.add(Concat::default(), &[a, x]);
    });
    assert!(
        concat.contains("layer 1") && concat.contains("Concat"),
        "{concat}"
    );
    let lonely = graph_error(|g| {
        let x = g.input();
        g.add(Add::default(), &[x]);
    });
    assert!(lonely.contains("two or more inputs"), "{lonely}");
    let two_into_one = graph_error(|g| {
        let x = g.input();
        g.add(ReLU::default(), &[x, x]);
    });
    assert!(two_into_one.contains("takes one input"), "{two_into_one}");
}

#[test]
fn resnet18_has_pytorchs_parameter_count_and_shapes() {
    let mut model = aether::zoo::resnet18_cifar(10, 0);
    model.finalize(&[32, 32, 3]).unwrap();
    // Trainable values: every state tensor but BatchNorm's running statistics.
    let path = std::env::temp_dir().join(format!(
        "aether-resnet18-{}.safetensors",
        std::process::id()
    ));
    model.save(&path).unwrap();
    let (tensors, _) = file_tensors(&std::fs::read(&path).unwrap());
    std::fs::remove_file(&path).ok();
    let trainable: usize = tensors
        .iter()
        .filter(|(name, _)| !name.contains("running"))
        .map(|(_, (_, values))| values.len())
        .sum();
    assert_eq!(trainable, 11_173_962);
    let adds = (0..200)
        .filter_map(|i| model.layer_spec(i))
        .filter(|s| s.kind() == "Add")
        .count();
    assert_eq!(adds, 8, "one residual add per basic block");
}

test_device!(
    global_max_pool_takes_each_channels_largest,
    |device: &Device| {
        use aether::nn::{GlobalMaxPool, Layer, Mode};
        let mut rng = Rng::fresh();
        let (n, h, w, c) = (3usize, 5usize, 7usize, 6usize);
        let xs = rng.vec(n * h * w * c);
        let mut pool = GlobalMaxPool::default();
        assert_eq!(pool.build(&[h, w, c], 0, device).unwrap(), [c]);
        let x = Tensor::from_f32(vec![n, h, w, c], xs.clone(), device).unwrap();
        let mode = Mode::Train { seed: 1, step: 0 };
        let y = pool.forward(&x, mode).unwrap();
        assert_eq!(y.dims(), &[n, c]);
        let dys = rng.vec(n * c);
        let dy = Tensor::from_f32(vec![n, c], dys.clone(), device).unwrap();
        let dx = pool
            .backward(&dy, true)
            .unwrap()
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let (y, mut want_dx) = (y.to_vec_f32().unwrap(), vec![0.0f32; xs.len()]);
        for s in 0..n {
            for ch in 0..c {
                let at = |p: usize| (s * h * w + p) * c + ch;
                let best = (0..h * w).fold(0, |b, p| if xs[at(p)] > xs[at(b)] { p } else { b });
                assert_eq!(y[s * c + ch], xs[at(best)], "sample {s} channel {ch}");
                want_dx[at(best)] = dys[s * c + ch];
            }
        }
        assert_eq!(
            dx, want_dx,
            "the gradient goes to each channel's largest value"
        );
    }
);

/// A conv and a BatchNorm whose scale is frozen at 1 (airbench's).
fn frozen_scale_model(seed: u64) -> Model {
    let mut model = Model::new().seed(seed);
    model
        .add(Conv2d::new(4, (3, 3), Padding::Same).bias(false))
        .add(BatchNorm::new(0.6, 1e-12).scale(false))
        .add(GELU::default())
        .add(aether::nn::GlobalMaxPool::default())
        .add(Dense::new(10).bias(false))
        .add(Scale::new(1.0 / 9.0));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.2,
        },
        Adam::new(1e-2),
        Metric::CategoricalAccuracy,
    );
    model
}

test_device!(
    batchnorm_without_scale_trains_only_its_shift,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let (x, y) = synthetic_images(8, 6, 6, rng.next_u64()).unwrap();
        let mut model = frozen_scale_model(rng.seed);
        model.to(device).unwrap();
        model.finalize(&[6, 6, 3]).unwrap();
        let names: Vec<String> = model
            .gradients(&x, &y)
            .unwrap()
            .tensors
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            names,
            ["layers.0.kernel", "layers.1.beta", "layers.4.kernel"]
        );
        for _ in 0..3 {
            model.train_batch(&x, &y).unwrap();
        }
        let path = std::env::temp_dir().join(format!(
            "aether-frozen-{}-{}.safetensors",
            std::process::id(),
            rng.seed
        ));
        model.save(&path).unwrap();
        let (tensors, _) = file_tensors(&std::fs::read(&path).unwrap());
        // The layers' tensors; the optimizer's moments follow them, one pair
        // per trainable parameter (three).
        let mut saved: Vec<&str> = tensors
            .keys()
            .map(String::as_str)
            .filter(|n| n.starts_with("layers."))
            .collect();
        saved.sort_unstable();
        let moments = tensors
            .keys()
            .filter(|n| n.starts_with("optimizer.m."))
            .count();
        assert_eq!(moments, 3);
        assert_eq!(
            saved,
            [
                "layers.0.kernel",
                "layers.1.beta",
                "layers.1.running_mean",
                "layers.1.running_var",
                "layers.4.kernel"
            ]
        );
        // A fresh model of the same seed whose weights come from the file
        // predicts the same: the unsaved scale is still exactly 1.
        let mut loaded = Model::load(&path, device).unwrap();
        std::fs::remove_file(&path).ok();
        let sample = &x[..2 * 6 * 6 * 3];
        assert_eq!(
            model.predict(sample, 2, true).unwrap(),
            loaded.predict(sample, 2, true).unwrap()
        );
        // Moved to the CPU, the unsaved scale and bias follow.
        loaded.to(&Device::Cpu).unwrap();
        loaded.predict(sample, 2, true).unwrap();
    }
);
