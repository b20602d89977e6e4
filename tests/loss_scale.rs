//! Loss scaling: bit-identical on the CPU path (S is a power of two), the
//! f16 output gradients it rescues on the GPU, GradScaler's dynamic rule, and
//! the overflow the f16 cast's clip would hide.

mod common;

use aether::gpu::DevicePreference;
use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, GlobalAvgPool, MaxPool2d, ReLU, Scale};
use aether::optim::{Adam, LossScale, Sgd};
use aether::{AetherError, Device, Loss, Metric, Model, Padding};
use common::{Rng, report};

const SIDE: usize = 6;
const INPUT: [usize; 3] = [SIDE, SIDE, 3];

/// A conv net whose last layer scales the logits by `out_scale`: with a small
/// factor its output gradients are that much smaller, as a batch-mean loss
/// makes them on a large batch.
fn net(seed: u64, out_scale: f32, scale: LossScale, device: &Device) -> Model {
    let mut model = Model::new().seed(seed);
    // Bias-free before BatchNorm, which cancels a bias (its gradient is 0).
    model.add(Conv2d::new(8, (3, 3), Padding::Same).bias(false));
    model.add(BatchNorm::new(0.9, 1e-5));
    model.add(ReLU::default());
    model.add(Conv2d::new(8, (3, 3), Padding::Same));
    model.add(ReLU::default());
    model.add(GlobalAvgPool::default());
    model.add(Flatten::default());
    model.add(Dense::new(5));
    model.add(Scale::new(out_scale));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.1,
        },
        Sgd::new(0.05)
            .momentum(0.9)
            .nesterov(true)
            .weight_decay(5e-4),
        Metric::CategoricalAccuracy,
    );
    model.set_loss_scale(scale).unwrap();
    model.to(device).unwrap();
    model.finalize(&INPUT).unwrap();
    model
}

fn batch(rng: &mut Rng, n: usize) -> (Vec<f32>, Vec<u32>) {
    let x = rng.vec(n * SIDE * SIDE * 3);
    let y = (0..n).map(|_| (rng.next_u64() % 5) as u32).collect();
    (x, y)
}

fn weights(model: &Model) -> Vec<(String, Vec<u32>)> {
    model
        .tensors()
        .unwrap()
        .into_iter()
        .map(|(name, t)| (name, common::f32_bits(&t)))
        .collect()
}

/// On the CPU path a scaled run is the unscaled run bit for bit: S is a
/// power of two and every backward op is linear in its output gradient, so
/// the scaled gradients are exactly S times the unscaled ones and the update
/// divides S out exactly. Static, dynamic (growing every 2 steps) and off.
#[test]
fn scaling_is_bit_identical_on_the_cpu() {
    let mut rng = Rng::fresh();
    let seed = rng.next_u64();
    let batches: Vec<_> = (0..6).map(|_| batch(&mut rng, 7)).collect();
    let run = |scale| {
        let mut model = net(seed, 0.5, scale, &Device::Cpu);
        let gradients = model.gradients(&batches[0].0, &batches[0].1).unwrap();
        for (x, y) in &batches {
            model.train_batch(x, y).unwrap();
        }
        model.check_steps().unwrap();
        (weights(&model), gradients, model.loss_scale().unwrap())
    };
    let (off, off_grads, none) = run(LossScale::Off);
    assert_eq!(none, None, "no scaler without scaling");
    let (auto, _, auto_scale) = run(LossScale::Auto);
    assert_eq!(auto_scale, None, "Auto does not scale on the CPU path");
    assert_eq!(auto, off);
    for scale in [
        LossScale::Static(65536.0),
        LossScale::Dynamic {
            init: 1024.0,
            growth_interval: 2,
        },
    ] {
        let (scaled, grads, _) = run(scale);
        assert!(
            scaled == off,
            "{scale:?}: weights differ (seed {})",
            rng.seed
        );
        assert_eq!(grads.loss.to_bits(), off_grads.loss.to_bits());
        for ((name, g), (_, want)) in grads.tensors.iter().zip(&off_grads.tensors) {
            let same = g.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{scale:?}: gradient {name} differs (seed {})",
                rng.seed
            );
        }
    }
}

// GradScaler's growth: the scale doubles after `growth_interval` steps
// without an overflow (6 steps at interval 2: three doublings), capped at
// 2^24, with the count of steps toward the next doubling.
test_device!(
    a_dynamic_scale_doubles_after_its_interval,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let (x, y) = batch(&mut rng, 4);
        for (init, steps, want) in [(256.0, 7, (2048.0, 1)), (4_194_304.0, 6, (16_777_216.0, 0))] {
            // Logits scaled by 1e-6 keep S x (p - t) / N far from f16's limit
            // even at 2^24.
            let scale = LossScale::Dynamic {
                init,
                growth_interval: 2,
            };
            let mut model = net(rng.next_u64(), 1e-6, scale, device);
            for _ in 0..steps {
                model.train_batch(&x, &y).unwrap();
            }
            model.check_steps().unwrap();
            assert_eq!(model.loss_scale().unwrap(), Some(want), "from {init}");
        }
    }
);

/// A GPU whose layers round their output gradients to f16 (the case loss
/// scaling is for: [`LossScale::Auto`] then scales); a SKIP line where not.
fn f16_gpu() -> Option<Device> {
    let device = common::gpu()?;
    let mut rng = Rng::fresh();
    let (x, y) = batch(&mut rng, 2);
    let mut model = net(0, 1e-3, LossScale::Auto, &device);
    model.train_batch(&x, &y).unwrap();
    if model.loss_scale().unwrap().is_none() {
        common::skip("the GPU's convs take f32 operands: no f16 gradients to scale");
        return None;
    }
    Some(device)
}

fn norm_rel(got: &[f32], want: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (f64::from(g) - f64::from(w)).powi(2);
        norm += f64::from(w).powi(2);
    }
    (diff / norm).sqrt()
}

/// The case loss scaling is for: output gradients far below f16's normal
/// range (logits scaled by 1e-4 on a batch of 24: about 4e-6 at the dense
/// layer, less at the convs). Unscaled, the GPU rounds them to f16
/// subnormals or 0; scaled by 2^16 they keep f16's precision. Every
/// parameter's gradient on the GPU against the CPU's (which rounds nothing):
/// scaled, the worst tensor within 0.1 norm-relative (measured up to 0.059
/// over 25 seeds, the first conv's kernel, from its f16 operands); unscaled,
/// the worst at least 3 times that (measured 0.40 to 1.0, at least 6.8 times).
#[test]
fn scaling_rescues_tiny_gradients_on_an_f16_gpu() {
    let Some(gpu) = f16_gpu() else { return };
    let mut rng = Rng::fresh();
    let seed = rng.next_u64();
    let (x, y) = batch(&mut rng, 24);
    let grads = |scale, device: &Device| {
        let mut model = net(seed, 1e-4, scale, device);
        model.gradients(&x, &y).unwrap().tensors
    };
    let cpu = grads(LossScale::Off, &Device::Cpu);
    let worst = |scale| {
        let got = grads(scale, &gpu);
        got.iter()
            .zip(&cpu)
            .map(|((name, g), (_, c))| (norm_rel(g, c), name.clone()))
            .fold((0.0, String::new()), |a, b| if b.0 > a.0 { b } else { a })
    };
    let scaled = worst(LossScale::dynamic());
    let unscaled = worst(LossScale::Off);
    report(&format!(
        "[aether-test] tiny gradients on the GPU: worst error scaled {:e} ({}), unscaled {:e} ({})",
        scaled.0, scaled.1, unscaled.0, unscaled.1
    ));
    assert!(
        scaled.0 < 0.1,
        "scaled: {} off by {:e} (seed {})",
        scaled.1,
        scaled.0,
        rng.seed
    );
    assert!(
        unscaled.0 > 3.0 * scaled.0,
        "unscaled {:e} should be far worse than scaled {:e} (seed {})",
        unscaled.0,
        scaled.0,
        rng.seed
    );
}

/// The f16 cast clips a scaled gradient past 65504 instead of making it
/// inf, so the overflow would pass the finiteness check. The saturation
/// check flags it: at 2^24 on a batch of 2 the loss gradient alone is near
/// 2^23, so the first steps are skipped (the weights stay), the scale halves
/// each time, and training goes on without an error once it fits.
#[test]
fn an_overflow_hidden_by_the_clip_skips_the_step_and_halves_the_scale() {
    let Some(gpu) = f16_gpu() else { return };
    let mut rng = Rng::fresh();
    let (x, y) = batch(&mut rng, 2);
    let scale = LossScale::Dynamic {
        init: 16_777_216.0,
        growth_interval: 2000,
    };
    let mut model = net(rng.next_u64(), 1.0, scale, &gpu);
    let before = weights(&model);
    model.train_batch(&x, &y).unwrap();
    model.check_steps().unwrap();
    assert_eq!(model.loss_scale().unwrap(), Some((8_388_608.0, 0)));
    let tensors_now = weights(&model);
    let moved_stats = |name: &str| name.contains("running");
    for ((name, got), (_, want)) in tensors_now.iter().zip(&before) {
        if !moved_stats(name) {
            assert_eq!(got, want, "{name} changed in a skipped step");
        }
    }
    for _ in 0..12 {
        model.train_batch(&x, &y).unwrap();
    }
    model.check_steps().unwrap();
    let (scale, good) = model.loss_scale().unwrap().unwrap();
    assert!(
        scale < 8_388_608.0 && good > 0,
        "the scale came down to where the gradients fit: {scale} ({good} good steps)"
    );
    assert_ne!(weights(&model), before, "later steps train");
}

/// A conv whose output gradient BatchNorm writes, as f16, and nothing else
/// rounds: the only place a scaled gradient can saturate f16 unseen.
fn bn_fed_conv(seed: u64, scale: LossScale, device: &Device) -> Model {
    pooled_conv_net(seed, scale, device, Between::BatchNorm)
}

/// What [`pooled_conv_net`] puts between its conv and its global pooling.
#[derive(Clone, Copy, PartialEq)]
enum Between {
    Nothing,
    BatchNorm,
    MaxPool,
    Relu,
}

/// A conv, then BatchNorm (the conv then bias-free), a 2x2 max pool or a
/// ReLU where `between` says, then global average pooling: the conv's output
/// gradient comes from the layer between as f16 or, with nothing between,
/// from the global pool in f32.
fn pooled_conv_net(seed: u64, scale: LossScale, device: &Device, between: Between) -> Model {
    let mut model = Model::new().seed(seed);
    let batchnorm = between == Between::BatchNorm;
    model.add(Conv2d::new(8, (3, 3), Padding::Same).bias(!batchnorm));
    match between {
        Between::Nothing => {}
        Between::BatchNorm => {
            model.add(BatchNorm::new(0.9, 1e-5));
        }
        Between::MaxPool => {
            model.add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid));
        }
        Between::Relu => {
            model.add(ReLU::default());
        }
    }
    model.add(GlobalAvgPool::default());
    model.add(Flatten::default());
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Sgd::new(0.05),
        Metric::CategoricalAccuracy,
    );
    model.set_loss_scale(scale).unwrap();
    model.to(device).unwrap();
    model.finalize(&INPUT).unwrap();
    model
}

/// BatchNorm's backward raises the scaler's flag itself where the f16 input
/// gradient it writes for the conv before it saturates, so no check kernel
/// runs for that gradient; the overflow still skips the step and halves the
/// scale (a missed flag would train on the clipped gradient instead).
#[test]
fn batchnorm_flags_the_saturation_of_the_gradient_it_writes() {
    if f16_gpu().is_none() {
        return;
    }
    // A device of this test's own: the shared one times the kernels of the
    // tests beside it too.
    let gpu = Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap();
    let ctx = gpu.gpu_context().expect("a GPU");
    if ctx.caps().limits.max_storage_buffers_per_shader_stage < 10 {
        common::skip("BatchNorm's dx binds no scaler under 10 storage buffers a stage");
        return;
    }
    let mut rng = Rng::fresh();
    let model = bn_fed_conv(rng.next_u64(), LossScale::Static(1.0), &gpu);
    assert_eq!(
        model.f16_input_grads(),
        vec![1],
        "BatchNorm hands the conv f16"
    );
    // Small inputs make BatchNorm's 1 / std large, and two labels apart make
    // the images' gradients differ by the scale's order: dx then passes 65504
    // by orders of magnitude at 2^24, and fits at 1.
    let x: Vec<f32> = rng
        .vec(2 * SIDE * SIDE * 3)
        .iter()
        .map(|v| v * 0.01)
        .collect();
    overflow_is_flagged_without_a_check(&gpu, &x, &mut rng, bn_fed_conv, "batchnorm_backward_dx");
}

/// A conv fed an f32 output gradient (here by global average pooling)
/// rounds it to f16 itself, and its cast raises the scaler's flag where the
/// gradient saturates, so no check kernel runs for it; the overflow still
/// skips the step and halves the scale.
#[test]
fn a_conv_flags_the_saturation_of_the_gradient_it_rounds() {
    if f16_gpu().is_none() {
        return;
    }
    // A device of this test's own: the shared one times the kernels of the
    // tests beside it too.
    let gpu = Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap();
    let mut rng = Rng::fresh();
    // At 2^24 the loss gradient is near 2^23, and pooling over the 36
    // positions leaves each near 2^18, past 65504; at 1 it fits.
    let x = rng.vec(2 * SIDE * SIDE * 3);
    let pooled =
        |seed, scale, device: &Device| pooled_conv_net(seed, scale, device, Between::Nothing);
    overflow_is_flagged_without_a_check(&gpu, &x, &mut rng, pooled, "cast_f16");
}

/// A max pool whose windows tile its input writes the conv before it its
/// input gradient as f16, and raises the scaler's flag where that saturates:
/// no check kernel and no cast run for it, and the overflow still skips the
/// step and halves the scale.
#[test]
fn a_max_pool_flags_the_saturation_of_the_gradient_it_writes() {
    if f16_gpu().is_none() {
        return;
    }
    // A device of this test's own: the shared one times the kernels of the
    // tests beside it too.
    let gpu = Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap();
    let mut rng = Rng::fresh();
    let max_pooled =
        |seed, scale, device: &Device| pooled_conv_net(seed, scale, device, Between::MaxPool);
    let model = max_pooled(rng.next_u64(), LossScale::Static(1.0), &gpu);
    assert_eq!(
        model.f16_input_grads(),
        vec![1],
        "the max pool hands the conv f16"
    );
    // At 2^24 the loss gradient is near 2^23, and the global pool over the
    // 9 max-pooled positions leaves each near 2^20, past 65504; at 1 it fits.
    let x = rng.vec(2 * SIDE * SIDE * 3);
    overflow_is_flagged_without_a_check(&gpu, &x, &mut rng, max_pooled, "pool_max_backward_tiled");
}

/// An activation after a conv writes the conv's output gradient as f16 and
/// raises the scaler's flag where that saturates (here ReLU's backward; GELU,
/// SiLU and leaky ReLU share its kernel): no check kernel and no cast run
/// for it, and the overflow still skips the step and halves the scale.
#[test]
fn an_activation_flags_the_saturation_of_the_gradient_it_writes() {
    if f16_gpu().is_none() {
        return;
    }
    // A device of this test's own: the shared one times the kernels of the
    // tests beside it too.
    let gpu = Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap();
    let mut rng = Rng::fresh();
    let rectified =
        |seed, scale, device: &Device| pooled_conv_net(seed, scale, device, Between::Relu);
    let model = rectified(rng.next_u64(), LossScale::Static(1.0), &gpu);
    assert_eq!(
        model.f16_input_grads(),
        vec![1],
        "the ReLU hands the conv f16"
    );
    // As with the conv alone: near 2^18 a position at 2^24, where the conv's
    // output is positive.
    let x = rng.vec(2 * SIDE * SIDE * 3);
    overflow_is_flagged_without_a_check(&gpu, &x, &mut rng, rectified, "relu_backward");
}

/// The step of the net `build` makes on `x` and two labels apart (so the
/// images' gradients differ by the scale's order) at a dynamic scale of 2^24:
/// `writer`, the kernel that rounds the saturating gradient, runs, no check
/// kernel does, the step is skipped (the weights stay, the running
/// statistics aside) and the scale halves. At a static scale of 1, the same
/// step trains.
fn overflow_is_flagged_without_a_check(
    gpu: &Device,
    x: &[f32],
    rng: &mut Rng,
    build: impl Fn(u64, LossScale, &Device) -> Model,
    writer: &str,
) {
    let ctx = gpu.gpu_context().expect("a GPU");
    if !ctx.caps().timestamps {
        common::skip("no timestamps to list the step's kernels");
        return;
    }
    let first = (rng.next_u64() % 8) as u32;
    let y = vec![first, (first + 1 + (rng.next_u64() % 7) as u32) % 8];
    let scale = LossScale::Dynamic {
        init: 16_777_216.0,
        growth_interval: 2000,
    };
    let mut model = build(rng.next_u64(), scale, gpu);
    let before = weights(&model);
    let (_, times) = ctx.timed(256, || model.train_batch(x, &y)).unwrap();
    model.check_steps().unwrap();
    let labels: Vec<&str> = times.iter().map(|t| t.label).collect();
    assert!(labels.contains(&writer), "{writer} not in {labels:?}");
    assert!(
        !labels.contains(&"loss_scale_saturation"),
        "a check dispatched for a gradient {writer} flags: {labels:?}"
    );
    assert_eq!(model.loss_scale().unwrap(), Some((8_388_608.0, 0)));
    for ((name, got), (_, want)) in weights(&model).iter().zip(&before) {
        if !name.contains("running") {
            assert_eq!(got, want, "{name} changed in a skipped step");
        }
    }
    let mut model = build(rng.next_u64(), LossScale::Static(1.0), gpu);
    let before = weights(&model);
    model.train_batch(x, &y).unwrap();
    model.check_steps().unwrap();
    assert_ne!(weights(&model), before, "a step at scale 1 trains");
}

/// A static scale does not back off: its overflow stops training as a
/// non-finite gradient does, naming the step.
#[test]
fn an_overflow_at_a_static_scale_is_a_non_finite_step() {
    let Some(gpu) = f16_gpu() else { return };
    let mut rng = Rng::fresh();
    let (x, y) = batch(&mut rng, 2);
    let mut model = net(rng.next_u64(), 1.0, LossScale::Static(16_777_216.0), &gpu);
    model.train_batch(&x, &y).unwrap();
    match model.check_steps() {
        Err(AetherError::NonFiniteStep { later: 0, .. }) => {}
        other => panic!("expected the first step non-finite, got {other:?}"),
    }
}

/// Scales that are not a power of two in [1, 2^24], or a zero growth
/// interval, are typed errors naming the value.
#[test]
fn bad_scales_are_errors_naming_the_value() {
    let mut model = Model::new();
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    for (scale, text) in [
        (LossScale::Static(3.0), "loss scale = 3"),
        (LossScale::Static(0.5), "loss scale = 0.5"),
        (LossScale::Static(f32::NAN), "loss scale = NaN"),
        (LossScale::Static(33_554_432.0), "loss scale = 33554432"),
        (
            LossScale::Dynamic {
                init: 1024.0,
                growth_interval: 0,
            },
            "growth_interval = 0",
        ),
    ] {
        let err = model.set_loss_scale(scale).err().expect("refused");
        assert!(
            matches!(err, AetherError::InvalidHyperparameter { .. }),
            "{scale:?}: {err}"
        );
        assert!(err.to_string().contains(text), "{scale:?}: {err}");
    }
}

/// `Model::gradients` backs off as a step would: at 2^24 on a batch of 2 the
/// gradients overflow f16 and would come back clipped; they are taken again
/// at a scale where they fit: the gradients a static scale of that value
/// gives (1e-6), near the CPU's per tensor (0.3: f16 operands on a batch of
/// 2 reach 0.13 on the first conv, whose gradient BatchNorm projects; a
/// clipped gradient is off by its whole size), and the flag does not make
/// the next step skip.
#[test]
fn gradients_back_off_from_an_overflowing_scale() {
    let Some(gpu) = f16_gpu() else { return };
    let mut rng = Rng::fresh();
    let seed = rng.next_u64();
    let (x, y) = batch(&mut rng, 2);
    let scale = LossScale::Dynamic {
        init: 16_777_216.0,
        growth_interval: 2000,
    };
    let mut model = net(seed, 1.0, scale, &gpu);
    let got = model.gradients(&x, &y).unwrap().tensors;
    let (backed_off, _) = model.loss_scale().unwrap().unwrap();
    assert!(backed_off < 16_777_216.0, "the scale backed off");
    let at_that_scale = net(seed, 1.0, LossScale::Static(backed_off), &gpu)
        .gradients(&x, &y)
        .unwrap()
        .tensors;
    let on_cpu = net(seed, 1.0, LossScale::Off, &Device::Cpu)
        .gradients(&x, &y)
        .unwrap()
        .tensors;
    for (((name, g), (_, s)), (_, c)) in got.iter().zip(&at_that_scale).zip(&on_cpu) {
        let err = norm_rel(g, s);
        assert!(
            err < 1e-6,
            "{name}: off by {err:e} from a static {backed_off} (seed {})",
            rng.seed
        );
        let err = norm_rel(g, c);
        assert!(err < 0.3, "{name}: off by {err:e} (seed {})", rng.seed);
    }
    let before = weights(&model);
    model.train_batch(&x, &y).unwrap();
    model.check_steps().unwrap();
    assert_eq!(model.loss_scale().unwrap(), Some((backed_off, 1)));
    assert_ne!(weights(&model), before, "the step after trains");
}
