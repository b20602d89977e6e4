//! Fallbacks when a kernel fails to compile: really invalid WGSL is injected with
//! `GpuOptions::break_kernels`, the caller takes its next variant after exactly one
//! `[aether]` warning, and results stay correct.

mod common;

use std::sync::Arc;

use aether::conv::{
    ConvParams, ConvPlans, ConvShapeMeta, ConvVariant, Padding, conv_backward_cast_fp16,
    conv2d_dweight, conv2d_forward,
};
use aether::gpu::{DevicePreference, GpuContext};
use aether::{Device, Tensor, diagnostics};
use common::conv_reference::{self as reference, norm_rel_error};
use common::{Rng, skip, test_gpu_options};

fn context_breaking(kernel: &str) -> Option<Arc<GpuContext>> {
    common::gpu()?;
    let mut options = test_gpu_options();
    options.break_kernels = vec![kernel.to_owned()];
    match Device::with_preference(DevicePreference::Gpu, &options).unwrap() {
        Device::Gpu(ctx) => Some(ctx),
        Device::Cpu => unreachable!(),
    }
}

fn warnings_about(kernel: &str, since: usize) -> Vec<String> {
    diagnostics::warnings()[since..]
        .iter()
        .filter(|w| w.contains(kernel))
        .cloned()
        .collect()
}

#[test]
fn fused_cast_failing_to_compile_falls_back_to_two_dispatches_with_identical_bits() {
    let before = diagnostics::warnings().len();
    let Some(ctx) = context_breaking("conv_backward_cast_fp16") else {
        return;
    };
    let device = Device::Gpu(ctx.clone());
    let mut rng = Rng::fresh();
    let dvalues: Vec<f32> = (0..1001)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .collect();
    let inputs: Vec<f32> = (0..777)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .collect();
    for _ in 0..2 {
        let dispatches = ctx.dispatch_count();
        let dv = Tensor::from_f32(vec![1001], dvalues.clone(), &device).unwrap();
        let xs = Tensor::from_f32(vec![777], inputs.clone(), &device).unwrap();
        let (dv16, xs16) = conv_backward_cast_fp16(&dv, &xs).unwrap();
        assert_eq!(
            ctx.dispatch_count() - dispatches,
            2,
            "fallback uses two dispatches"
        );
        // Both operands saturate at +-65504 (NaN kept).
        let want = |v: &[f32]| -> Vec<u16> {
            v.iter()
                .map(|&x| half::f16::from_f32(aether::conv::clip_f16_range(x)).to_bits())
                .collect()
        };
        let bits = |t: &Tensor| {
            t.to_vec_f16()
                .unwrap()
                .iter()
                .map(|h| h.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&dv16), want(&dvalues), "seed {}", rng.seed);
        assert_eq!(bits(&xs16), want(&inputs), "seed {}", rng.seed);
    }
    let warned = warnings_about("conv_backward_cast_fp16", before);
    assert_eq!(warned.len(), 1, "one warning for two calls: {warned:?}");
    assert!(warned[0].starts_with("[aether] "));
}

#[test]
fn best_conv_variant_failing_to_compile_falls_back_to_the_next_with_correct_results() {
    let Some(probe) = common::gpu() else { return };
    let candidates = ConvVariant::candidates(probe.gpu_context().unwrap().caps());
    if candidates.len() < 2 {
        skip("adapter has a single conv variant, nothing to fall back to");
        return;
    }
    let (best, next) = (candidates[0], candidates[1]);
    let broken = format!("conv_forward:{}", best.name());
    let before = diagnostics::warnings().len();
    let Some(ctx) = context_breaking(&broken) else {
        return;
    };
    let device = Device::Gpu(ctx);
    let mut rng = Rng::fresh();
    let params = ConvParams::new(6, 3, Padding::Same);
    let input = [2, 7, 6, 3];
    let meta = ConvShapeMeta::new(input, &params).unwrap();
    let (x, w, b) = (rng.vec(2 * 7 * 6 * 3), rng.vec(meta.k * 6), rng.vec(6));
    let plans = ConvPlans::new();
    let y = conv2d_forward(
        &Tensor::from_f32(input.to_vec(), x.clone(), &device).unwrap(),
        &Tensor::from_f32(meta.weight_dims().to_vec(), w.clone(), &device).unwrap(),
        &Tensor::from_f32(vec![6], b.clone(), &device).unwrap(),
        &params,
        &plans,
    )
    .unwrap();
    let used = plans.summary()[0].2.variant;
    assert_eq!(
        used,
        next,
        "planner must take the next variant after {}",
        best.name()
    );
    let err = norm_rel_error(
        &y.to_vec_f32().unwrap(),
        &reference::forward(&meta, &x, &w, &b),
    );
    let bound = if next.f16_operands() { 5e-3 } else { 1e-5 };
    assert!(
        err <= bound,
        "fallback result error {err:e} (seed {})",
        rng.seed
    );
    // "... variant coop8 failed", not the halo kernel's "variant coop8+halo failed".
    let warned = warnings_about(
        &format!("{} failed", broken.replace(':', " variant ")),
        before,
    );
    assert_eq!(
        warned.len(),
        1,
        "exactly one warning: {:?}",
        diagnostics::warnings()
    );
}

/// A halo kernel that fails to compile: the forward and dweight keep the coop
/// GEMM core of the same variant, after one warning naming the halo kernel,
/// with correct results. Needs an adapter whose first variant is a coop one.
#[test]
fn halo_kernels_failing_to_compile_fall_back_to_the_gemm_core() {
    let Some(probe) = common::gpu() else { return };
    let best = ConvVariant::candidates(probe.gpu_context().unwrap().caps())[0];
    let ConvVariant::Coop { tile } = best else {
        skip("no cooperative-matrix variant: no halo kernel to break");
        return;
    };
    let halo = format!("{}+halo", best.name());
    let before = diagnostics::warnings().len();
    let mut options = test_gpu_options();
    options.break_kernels = vec![
        format!("conv_forward:{halo}"),
        format!("conv_dweight:{halo}"),
    ];
    let Device::Gpu(ctx) = Device::with_preference(DevicePreference::Gpu, &options).unwrap() else {
        unreachable!()
    };
    let device = Device::Gpu(ctx);
    let mut rng = Rng::fresh();
    // Both halo kernels take this shape at tiles 8 and 16 (tests/conv.rs).
    let c = 2 * tile as usize;
    let params = ConvParams::new(c, 3, Padding::Same);
    let input = [1, 8, 32, c];
    let meta = ConvShapeMeta::new(input, &params).unwrap();
    let (x, w, b) = (
        rng.vec(meta.n * 8 * 32 * c),
        rng.vec(meta.k * c),
        rng.vec(c),
    );
    let dy = rng.vec(meta.m * c);
    let tensor = |dims: &[usize], v: &[f32]| Tensor::from_f32(dims.to_vec(), v.to_vec(), &device);
    let xt = tensor(&input, &x).unwrap();
    let plans = ConvPlans::new();
    let y = conv2d_forward(
        &xt,
        &tensor(&meta.weight_dims(), &w).unwrap(),
        &tensor(&[c], &b).unwrap(),
        &params,
        &plans,
    )
    .unwrap();
    let (dw, _) = conv2d_dweight(
        &xt,
        &tensor(&meta.output_dims(), &dy).unwrap(),
        &params,
        &plans,
    )
    .unwrap();
    for (direction, _, plan) in plans.summary() {
        assert_eq!(plan.variant, best, "{direction:?} keeps {}", best.name());
        assert_eq!(
            plan.kernel_name(),
            best.name(),
            "{direction:?} runs the GEMM core"
        );
    }
    let err = norm_rel_error(
        &y.to_vec_f32().unwrap(),
        &reference::forward(&meta, &x, &w, &b),
    );
    assert!(err <= 5e-3, "forward error {err:e} (seed {})", rng.seed);
    let (want_dw, _) = reference::dweight(&meta, &x, &dy);
    let err = norm_rel_error(&dw.to_vec_f32().unwrap(), &want_dw);
    assert!(err <= 5e-3, "dweight error {err:e} (seed {})", rng.seed);
    for kernel in ["conv_forward", "conv_dweight"] {
        let warned = warnings_about(&format!("{kernel} variant {halo}"), before);
        assert_eq!(warned.len(), 1, "one warning for {kernel}: {warned:?}");
    }
}
