//! Networks at real sizes on the kernels an H100 would run (its 16x16
//! cooperative matrices included), and on the least device aether accepts,
//! without either: wgpu's noop backend records everything and executes
//! nothing, so a training step of ResNet-50 at 224 px or of a drawn network
//! 1024 channels wide is planned, compiled (every module validated by naga),
//! bound and dispatched within the device's limits, or refused with a typed
//! error naming the layer; never a panic. tests/unseen_networks.rs checks
//! the numbers of such graphs at sizes lavapipe can run.

mod common;

use aether::conv::Padding;
use aether::gpu::GpuOptions;
use aether::model::{Loss, Metric};
use aether::nn::{Add, BatchNorm, Conv2d, Dense, Flatten, GlobalAvgPool, MaxPool2d, ReLU};
use aether::optim::Adam;
use aether::{AetherError, Device, Graph, Model, NodeId};
use common::drawn::{Scale, drawn, finalized, network_count, next_network_seed};
use common::noop::{h100_like_context, h100_like_context_with, least_limits, noop_context};
use common::{Rng, report};

/// The H100-like device (coop matrices, f16, subgroups of 32, 48 KiB of
/// workgroup memory) and the least one (no feature, the least limits).
fn devices() -> [(&'static str, Device); 2] {
    [
        ("H100-like", Device::Gpu(h100_like_context())),
        (
            "least",
            Device::Gpu(noop_context(wgpu::Features::empty(), least_limits())),
        ),
    ]
}

/// Plans the convs of `model` (finalized for `input`) for `batch`, trains
/// one step and predicts.
fn record_step(
    model: &mut Model,
    input: &[usize],
    batch: usize,
    seed: u64,
) -> Result<(), AetherError> {
    model.plan_convs(batch, true)?;
    let x = Rng::seeded(seed).vec(batch * input.iter().product::<usize>());
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 10).collect();
    model.train_batch(&x, &y)?;
    model.check_steps()?;
    model.predict(&x, batch, true).map(drop)
}

/// Whether `error` is a typed refusal of a tensor past the device's limits
/// (naming it, its bytes and the limit), which a drawn network may meet on
/// the least device.
fn past_the_limits(error: &AetherError) -> bool {
    matches!(error, AetherError::TooLarge { .. })
        || error.to_string().contains("more than the adapter's limit")
}

/// conv + BatchNorm (+ ReLU), as ResNet's.
fn conv_bn(
    g: &mut Graph,
    x: NodeId,
    filters: usize,
    k: usize,
    stride: usize,
    relu: bool,
) -> NodeId {
    let padding = if k == 1 {
        Padding::Valid
    } else {
        Padding::Same
    };
    let c = g.add(
        Conv2d::new(filters, (k, k), padding)
            .stride((stride, stride))
            .bias(false),
        &[x],
    );
    let b = g.add(BatchNorm::new(0.9, 1e-5), &[c]);
    if relu {
        g.add(ReLU::default(), &[b])
    } else {
        b
    }
}

/// ResNet-50 (ImageNet's: a 7x7 stride-2 stem, a 3x3 stride-2 max pool, four
/// stages of bottleneck blocks 3-4-6-3, widths 256-2048, 1000 classes).
fn resnet50() -> Model {
    let mut g = Graph::new();
    let x = g.input();
    let stem = conv_bn(&mut g, x, 64, 7, 2, true);
    let mut h = g.add(MaxPool2d::new((3, 3), (2, 2), Padding::Same), &[stem]);
    for (stage, (blocks, width)) in [(3, 64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for block in 0..blocks {
            let stride = if block == 0 && stage > 0 { 2 } else { 1 };
            let a = conv_bn(&mut g, h, width, 1, 1, true);
            let a = conv_bn(&mut g, a, width, 3, stride, true);
            let a = conv_bn(&mut g, a, width * 4, 1, 1, false);
            let shortcut = if block == 0 {
                conv_bn(&mut g, h, width * 4, 1, stride, false)
            } else {
                h
            };
            let sum = g.add(Add::default(), &[a, shortcut]);
            h = g.add(ReLU::default(), &[sum]);
        }
    }
    let h = g.add(GlobalAvgPool::default(), &[h]);
    let h = g.add(Flatten::default(), &[h]);
    g.add(Dense::new(1000), &[h]);
    let mut model = Model::from_graph(g).seed(50);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.1,
        },
        Adam::adamw(1e-3, 0.05),
        Metric::CategoricalAccuracy,
    );
    model
}

#[test]
fn resnet50_at_224_records_a_training_step() {
    for (name, device) in devices() {
        let started = std::time::Instant::now();
        let mut model = resnet50();
        model.to(&device).unwrap();
        model.finalize(&[224, 224, 3]).unwrap();
        record_step(&mut model, &[224, 224, 3], 2, 50).unwrap();
        let ctx = device.gpu_context().expect("a GPU device");
        let kernels: std::collections::BTreeSet<String> = ctx
            .pipelines()
            .built_shaders()
            .iter()
            .filter(|s| s.key.kernel.starts_with("conv_"))
            .map(|s| format!("{:?}", s.key))
            .collect();
        let coop = kernels.iter().filter(|k| k.contains("coop")).count();
        report(&format!(
            "[aether-test] ResNet-50 at 224 px, batch 2, on the {name} device: {:.1} s, {} conv kernels ({coop} coop)",
            started.elapsed().as_secs_f64(),
            kernels.len()
        ));
        if name == "H100-like" {
            assert!(coop > 0, "no coop kernel planned: {kernels:?}");
        }
    }
}

#[test]
fn drawn_networks_at_real_sizes_record_a_training_step() {
    let devices = devices();
    let mut rng = Rng::fresh();
    let count = network_count();
    let mut checked = 0;
    'draws: while checked < count {
        let seed = next_network_seed(&mut rng);
        let text = drawn(seed, &Scale::LARGE).3;
        for (name, device) in &devices {
            let (mut model, input) = match finalized(seed, &Scale::LARGE, device) {
                Ok(Some((model, input, ..))) => (model, input),
                Ok(None) => continue 'draws,
                // A tensor past this device's binding limit, refused naming
                // the layer, its shape, bytes and the limit.
                Err(e) if past_the_limits(&e) => {
                    report(&format!(
                        "[aether-test] seed {seed} on the {name} device: {e}"
                    ));
                    continue;
                }
                Err(e) => panic!("seed {seed} ({text}): {e}"),
            };
            // At most 2^14 positions a batch (a few hundred MiB of unused
            // buffers at 1024 channels), and at least 2 samples: a BatchNorm
            // after a 1x1 map would have 1 value per channel, which the step
            // refuses (tests/model.rs).
            let batch = [2, 3, 8, 32, 128]
                .into_iter()
                .filter(|b| b * input[0] * input[1] <= 1 << 14)
                .nth((seed % 5) as usize)
                .unwrap_or(2);
            report(&format!(
                "[aether-test] seed {seed} on the {name} device, batch {batch}: {text}"
            ));
            match record_step(&mut model, &input, batch, seed) {
                Ok(()) => {}
                Err(e) if past_the_limits(&e) => {
                    report(&format!(
                        "[aether-test] seed {seed} on the {name} device: {e}"
                    ));
                }
                Err(e) => panic!("seed {seed} on the {name} device ({text}): {e}"),
            }
        }
        checked += 1;
    }
}

/// With measured plans (`GpuOptions::tune_convs`), each conv's candidates
/// (GEMM blocks, dweight splits, halo stacking...) are compiled and timed at
/// the step's shape: on drawn networks at real sizes every candidate either
/// compiles and records or declines the shape, and the chosen plans are kept
/// in the file.
#[test]
fn measured_plans_at_real_sizes_compile_every_candidate() {
    let dir = common::TempDir::new("plan-unseen-measured");
    let device = Device::Gpu(h100_like_context_with(GpuOptions {
        tune_convs: true,
        cache_dir: Some(dir.0.clone()),
        ..GpuOptions::default()
    }));
    let mut rng = Rng::fresh();
    let mut checked = 0;
    while checked < 3 {
        let seed = rng.next_u64();
        let (mut model, input, _, text) = match finalized(seed, &Scale::LARGE, &device) {
            Ok(Some(draw)) => draw,
            Ok(None) => continue,
            Err(e) => panic!("seed {seed} ({}): {e}", drawn(seed, &Scale::LARGE).3),
        };
        report(&format!(
            "[aether-test] measured plans, seed {seed}: {text}"
        ));
        if let Err(e) = record_step(&mut model, &input, 2, seed) {
            panic!("seed {seed} ({text}): {e}");
        }
        checked += 1;
    }
    let kept = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("conv-plans-"));
    assert!(kept, "no measured-plans file in {:?}", dir.0);
}
