//! A model plans every conv of its first step at once, on all cores, before
//! the step records: the step then compiles no conv kernel of its own. Shown
//! on wgpu's noop backend (nothing executes; every module is recorded) with
//! every feature aether uses, so the coop and halo kernels are planned.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use aether::gpu::{BuiltShader, GpuContext};
use aether::optim::Sgd;
use aether::{Device, Loss, Metric, Model};
use common::Rng;
use common::noop::{all_features, full_limits, noop_context};

/// The conv kernels a plan compiles, and dweight's reduces (not the casts
/// and flips, which take no shape), each by its pipeline key.
fn conv_kernels(ctx: &GpuContext) -> BTreeSet<String> {
    let planned = |s: &BuiltShader| {
        s.key.kernel.starts_with("conv_")
            && !["conv_backward_cast_fp16", "conv_flip_filter"].contains(&s.key.kernel)
    };
    ctx.pipelines()
        .built_shaders()
        .iter()
        .filter(|s| planned(s))
        .map(|s| format!("{:?}", s.key))
        .collect()
}

/// Plans `model`'s convs for a training step of `batch`, then trains that
/// step and predicts: neither compiles a conv kernel the plans did not.
fn check(mut model: Model, input: &[usize], batch: usize) {
    let ctx = noop_context(all_features(), full_limits());
    let device = Device::Gpu(Arc::clone(&ctx));
    model.to(&device).unwrap();
    model.finalize(input).unwrap();
    model.plan_convs(batch, true).unwrap();
    let planned = conv_kernels(&ctx);
    assert!(
        planned.len() >= 3,
        "plan_convs compiled {} conv kernels",
        planned.len()
    );
    let mut rng = Rng::fresh();
    let x = rng.vec(batch * input.iter().product::<usize>());
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 10).collect();
    model.train_batch(&x, &y).unwrap();
    model.predict(&x, batch, false).unwrap();
    let after = conv_kernels(&ctx);
    let unplanned: Vec<_> = after.difference(&planned).collect();
    assert!(
        unplanned.is_empty(),
        "the step compiled conv kernels it had not planned: {unplanned:?}"
    );
}

#[test]
fn resnet18_plans_every_conv_of_its_first_step_ahead() {
    check(aether::zoo::resnet18_cifar(10, 1), &[16, 16, 3], 4);
}

#[test]
fn airbench94_plans_every_conv_of_its_first_step_ahead() {
    let mut model = aether::zoo::airbench94_net(2);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.2,
        },
        Sgd::new(0.1).momentum(0.85).nesterov(true),
        Metric::CategoricalAccuracy,
    );
    check(model, &[32, 32, 3], 3);
}
