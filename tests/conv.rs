//! The conv kernels against a brute-force f64 direct convolution, on every device
//! and every variant the adapter has, over shapes chosen to hit the edges:
//! 1x1 / 3x3 / 5x3 / 2x2 filters, stride 1, 2, 3 and (2, 1), same / valid /
//! explicit padding, dilation, C_in = 3, channels not a multiple of the tile,
//! M ending mid-tile, batch 1 and 7, and channel counts divisible by 8 (the
//! coop core's run loads) on every operand, on the input only, on dy only,
//! shapes whose blocks lie wholly inside C (stored straight from the coop
//! core's accumulators, with the 16-subgroup block of wide forwards), and
//! stride-1 shapes that the halo kernels of each direction must run on the
//! coop variants, and few-channel shapes the direct kernels (forward and
//! dweight) must run on every GPU variant.
//!
//! Bounds (norm-relative): f32 operands 1e-5; f16 operands 5e-3.

mod common;

use aether::conv::forward::halo::GROUPS_PER_UNIT;
use aether::conv::{
    ConvDirection, ConvLaunchPlan, ConvParams, ConvPlans, ConvShapeMeta, ConvVariant, Padding,
    conv2d_dinput, conv2d_dinput_flipped, conv2d_dweight, conv2d_forward, dinput_flipped_filter,
};
use aether::gpu::DevicePreference;
use aether::nn::{Conv2d, Layer, Mode};
use aether::{Device, Tensor};
use common::conv_cases::cases;
use common::conv_reference::{self as reference, norm_rel_error};
use common::{Rng, f32_bits, report};

const F32_BOUND: f64 = 1e-5;
const F16_BOUND: f64 = 5e-3;

/// Whether `plan` runs the coop core's block for wide forwards: 4 x 4
/// subgroups of 4 x 2 tiles.
fn runs_wide_block(plan: &ConvLaunchPlan) -> bool {
    (plan.coop).is_some_and(|b| (b.subgroups, b.tiles) == ([4, 4], [4, 2]))
}

/// Images enough for more halo blocks than the halo kernels launch
/// workgroups (at most [`GROUPS_PER_UNIT`] per compute unit, where the
/// adapter's count is known: 132 units on an H100, the threads on a CPU
/// adapter), at least 32;
/// `None` where the count is not known (one workgroup per block, no turns).
fn turns_images(device: &Device) -> Option<usize> {
    let units = match device.gpu_context() {
        Some(ctx) => ctx.caps().known_compute_units()?,
        None => 1,
    };
    Some(32.max(GROUPS_PER_UNIT as usize * units as usize + 1))
}

/// The ways to run a conv on `device`: the CPU path, or each GPU variant.
fn variants(device: &Device) -> Vec<(String, ConvPlans, f64)> {
    match device.gpu_context() {
        None => vec![("cpu".into(), ConvPlans::new(), F32_BOUND)],
        Some(ctx) => ConvVariant::candidates(ctx.caps())
            .into_iter()
            .map(|v| {
                let bound = if v.f16_operands() {
                    F16_BOUND
                } else {
                    F32_BOUND
                };
                (v.name().to_owned(), ConvPlans::forcing(v), bound)
            })
            .collect(),
    }
}

fn tensor(dims: &[usize], data: &[f32], device: &Device) -> Tensor {
    Tensor::from_f32(dims.to_vec(), data.to_vec(), device).unwrap()
}

test_device!(
    all_directions_match_the_f64_direct_convolution,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let turns = turns_images(device);
        for case in cases(turns.unwrap_or(32)) {
            let meta = ConvShapeMeta::new(case.input, &case.params).unwrap();
            let x = rng.vec(meta.n * meta.h * meta.w * meta.c_in);
            let w = rng.vec(meta.k * meta.c_out);
            let b = rng.vec(meta.c_out);
            let dy = rng.vec(meta.m * meta.c_out);
            let want_y = reference::forward(&meta, &x, &w, &b);
            let (want_dw, want_db) = reference::dweight(&meta, &x, &dy);
            let want_dx = reference::dinput(&meta, &dy, &w);
            for (variant, plans, bound) in variants(device) {
                let ctx = format!("{} [{variant}] seed {}", case.name, rng.seed);
                let xt = tensor(&case.input, &x, device);
                let wt = tensor(&meta.weight_dims(), &w, device);
                let bt = tensor(&[meta.c_out], &b, device);
                let dyt = tensor(&meta.output_dims(), &dy, device);
                // Whether `direction` was planned with a kernel `uses` holds for:
                // the halo cases must run the kernel they name on coop variants.
                let coop = variant.starts_with("coop");
                let ran =
                    |direction: ConvDirection,
                     uses: fn(&ConvShapeMeta, &ConvLaunchPlan) -> bool| {
                        let summary = plans.summary();
                        summary
                            .iter()
                            .any(|(d, meta, plan)| *d == direction && uses(meta, plan))
                    };
                let overlaps = |_: &ConvShapeMeta, plan: &ConvLaunchPlan| {
                    plan.halo.is_some_and(|b| b.tiles_w() * b.tile > b.cols)
                };
                // Fewer workgroups than blocks: a workgroup takes several.
                let takes_turns = |meta: &ConvShapeMeta, plan: &ConvLaunchPlan| {
                    plan.halo
                        .is_some_and(|b| (plan.workgroups[0] as usize) < b.blocks(meta))
                };
                let y = conv2d_forward(&xt, &wt, &bt, &case.params, &plans).unwrap();
                assert_eq!(y.dims(), meta.output_dims());
                if case.name.contains("direct kernel") && device.gpu_context().is_some() {
                    let direct = ran(ConvDirection::Forward, |_, p| p.direct.is_some());
                    assert!(direct, "forward {ctx}: the direct kernel did not run");
                }
                if case.name.contains("wide block") && coop {
                    let ran_wide = ran(ConvDirection::Forward, |_, p| runs_wide_block(p));
                    assert!(ran_wide, "forward {ctx}: not the wide block");
                }
                if case.name.contains("halo kernel") && coop {
                    let halo = ran(ConvDirection::Forward, |_, p| p.halo.is_some());
                    assert!(halo, "forward {ctx}: the halo kernel did not run");
                }
                if case.name.contains("whole-image halo") && coop {
                    let whole = ran(ConvDirection::Forward, |_, p| {
                        p.halo
                            .is_some_and(|b| (b.rows, b.cols, b.subgroups) == (16, 16, [8, 2]))
                    });
                    assert!(whole, "forward {ctx}: not the whole-image halo block");
                }
                if case.name.contains("stacked") && coop {
                    let stacked = ran(ConvDirection::Forward, |_, p| {
                        p.halo.is_some_and(|b| b.images > 1)
                    });
                    assert!(stacked, "forward {ctx}: no stacked position tiles");
                }
                if case.name.contains("overlapping") && coop {
                    let overlapping = ran(ConvDirection::Forward, overlaps);
                    assert!(overlapping, "forward {ctx}: no overlapping tiles");
                }
                if case.name.contains("taking turns") && coop && turns.is_some() {
                    let took_turns = ran(ConvDirection::Forward, takes_turns);
                    assert!(took_turns, "forward {ctx}: one workgroup per block");
                }
                let err = norm_rel_error(&y.to_vec_f32().unwrap(), &want_y);
                assert!(err <= bound, "forward {ctx}: error {err:e} > {bound:e}");
                let (dw, db) = conv2d_dweight(&xt, &dyt, &case.params, &plans).unwrap();
                if case.name.contains("dweight") && coop {
                    let halo = ran(ConvDirection::DWeight, |_, p| p.dweight_halo.is_some());
                    assert!(halo, "dweight {ctx}: the halo kernel did not run");
                }
                if case.name.contains("direct kernel") && device.gpu_context().is_some() {
                    let direct = ran(ConvDirection::DWeight, |_, p| p.direct.is_some());
                    assert!(direct, "dweight {ctx}: the direct kernel did not run");
                }
                let err = norm_rel_error(&dw.to_vec_f32().unwrap(), &want_dw);
                assert!(err <= bound, "dweight {ctx}: error {err:e} > {bound:e}");
                let err = norm_rel_error(&db.to_vec_f32().unwrap(), &want_db);
                assert!(err <= bound, "dbias {ctx}: error {err:e} > {bound:e}");
                let dx = conv2d_dinput(&dyt, &wt, case.input, &case.params, &plans).unwrap();
                if case.name.contains("dinput") && coop {
                    let halo = ran(ConvDirection::DInput, |_, p| p.halo.is_some());
                    assert!(halo, "dinput {ctx}: the halo kernel did not run");
                }
                if case.name.contains("dinput") && case.name.contains("overlapping") && coop {
                    let overlapping = ran(ConvDirection::DInput, overlaps);
                    assert!(overlapping, "dinput {ctx}: no overlapping tiles");
                }
                if case.name.contains("stacked") && coop {
                    let stacked = ran(ConvDirection::DInput, |_, p| {
                        p.halo.is_some_and(|b| b.images > 1 && b.taps_per_step == 9)
                    });
                    assert!(stacked, "dinput {ctx}: no stacked position tiles");
                }
                if case.name.contains("taking turns") && coop && turns.is_some() {
                    let took_turns = ran(ConvDirection::DInput, takes_turns);
                    assert!(took_turns, "dinput {ctx}: one workgroup per block");
                }
                let err = norm_rel_error(&dx.to_vec_f32().unwrap(), &want_dx);
                assert!(err <= bound, "dinput {ctx}: error {err:e} > {bound:e}");
                // A flipped filter made once gives the same bits as the flip
                // each call makes; there is one exactly where the halo kernel runs.
                let flipped = dinput_flipped_filter(&wt, case.input, &case.params, &plans).unwrap();
                let halo = ran(ConvDirection::DInput, |_, p| p.halo.is_some());
                assert_eq!(flipped.is_some(), halo, "dinput {ctx}: flipped filter");
                let again = conv2d_dinput_flipped(
                    &dyt,
                    &wt,
                    flipped.as_ref(),
                    case.input,
                    &case.params,
                    &plans,
                )
                .unwrap();
                assert!(
                    f32_bits(&again) == f32_bits(&dx),
                    "dinput {ctx}: the flipped filter's result differs"
                );
            }
        }
    }
);

test_device!(
    dweight_is_bit_identical_across_runs_with_split_k,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let params = ConvParams::new(8, 3, Padding::Same);
        let input = [4, 16, 16, 3];
        let meta = ConvShapeMeta::new(input, &params).unwrap();
        let x = tensor(&input, &rng.vec(4 * 16 * 16 * 3), device);
        let dy = tensor(&meta.output_dims(), &rng.vec(meta.m * 8), device);
        for (variant, plans, _) in variants(device) {
            let (dw1, db1) = conv2d_dweight(&x, &dy, &params, &plans).unwrap();
            let (dw2, db2) = conv2d_dweight(&x, &dy, &params, &plans).unwrap();
            assert_eq!(
                f32_bits(&dw1),
                f32_bits(&dw2),
                "dW differs between runs [{variant}]"
            );
            assert_eq!(
                f32_bits(&db1),
                f32_bits(&db2),
                "dbias differs between runs [{variant}]"
            );
            if device.gpu_context().is_some() {
                let split = common::dweight_split(&plans);
                assert!(
                    split > 1,
                    "this shape should use split-K [{variant}], got {split}"
                );
                report(&format!(
                    "[aether-test] dweight split-K {split} [{variant}] is deterministic"
                ));
            }
        }
    }
);

test_device!(shape_errors_name_the_operand, |device: &Device| {
    let params = ConvParams::new(4, 3, Padding::Same);
    let x = tensor(&[1, 5, 5, 3], &Rng::fresh().vec(75), device);
    let bad_w = tensor(&[3, 3, 2, 4], &Rng::fresh().vec(72), device);
    let b = tensor(&[4], &[0.5, -0.5, 0.25, 1.0], device);
    let err = conv2d_forward(&x, &bad_w, &b, &params, &ConvPlans::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("weight") && err.contains("[3, 3, 3, 4]") && err.contains("[3, 3, 2, 4]"),
        "{err}"
    );
    let flat = tensor(&[75], &Rng::fresh().vec(75), device);
    assert!(conv2d_forward(&flat, &bad_w, &b, &params, &ConvPlans::new()).is_err());
    let big_filter = ConvParams::new(4, 7, Padding::Valid);
    let err = conv2d_dinput(&x, &bad_w, [1, 5, 5, 3], &big_filter, &ConvPlans::new()).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
});

/// Central differences of `L = sum(conv(x, w, b) * g)` on the CPU path agree
/// with the three gradients (L is linear in each operand, so the step can be large).
#[test]
fn finite_differences_agree_with_all_three_gradients_on_cpu() {
    let mut rng = Rng::fresh();
    let device = Device::Cpu;
    let params = ConvParams {
        stride: (2, 1),
        ..ConvParams::new(3, 3, Padding::Same)
    };
    let input = [2, 5, 4, 2];
    let meta = ConvShapeMeta::new(input, &params).unwrap();
    let x = rng.vec(40 * 2);
    let w = rng.vec(meta.k * 3);
    let b = rng.vec(3);
    let g = rng.vec(meta.m * 3);
    let plans = ConvPlans::new();
    let loss = |x: &[f32], w: &[f32], b: &[f32]| -> f64 {
        let y = conv2d_forward(
            &tensor(&input, x, &device),
            &tensor(&meta.weight_dims(), w, &device),
            &tensor(&[3], b, &device),
            &params,
            &plans,
        )
        .unwrap()
        .to_vec_f32()
        .unwrap();
        y.iter()
            .zip(&g)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    };
    let gt = tensor(&meta.output_dims(), &g, &device);
    let dx = conv2d_dinput(
        &gt,
        &tensor(&meta.weight_dims(), &w, &device),
        input,
        &params,
        &plans,
    )
    .unwrap()
    .to_vec_f32()
    .unwrap();
    let (dw, db) = conv2d_dweight(&tensor(&input, &x, &device), &gt, &params, &plans).unwrap();
    let (dw, db) = (dw.to_vec_f32().unwrap(), db.to_vec_f32().unwrap());
    let eps = 0.5f32;
    let check = |name: &str, analytic: f32, plus: f64, minus: f64| {
        let numeric = (plus - minus) / (2.0 * f64::from(eps));
        let tol = 1e-3 * (1.0 + numeric.abs());
        assert!(
            (f64::from(analytic) - numeric).abs() <= tol,
            "{name}: analytic {analytic} vs numeric {numeric} (seed {})",
            rng.seed
        );
    };
    for i in (0..x.len()).step_by(7) {
        let (mut xp, mut xm) = (x.clone(), x.clone());
        xp[i] += eps;
        xm[i] -= eps;
        check(
            &format!("dx[{i}]"),
            dx[i],
            loss(&xp, &w, &b),
            loss(&xm, &w, &b),
        );
    }
    for i in (0..w.len()).step_by(5) {
        let (mut wp, mut wm) = (w.clone(), w.clone());
        wp[i] += eps;
        wm[i] -= eps;
        check(
            &format!("dw[{i}]"),
            dw[i],
            loss(&x, &wp, &b),
            loss(&x, &wm, &b),
        );
    }
    for i in 0..3 {
        let (mut bp, mut bm) = (b.clone(), b.clone());
        bp[i] += eps;
        bm[i] -= eps;
        check(
            &format!("db[{i}]"),
            db[i],
            loss(&x, &w, &bp),
            loss(&x, &w, &bm),
        );
    }
}

/// The f16 kernels take dvalues clipped to +-65504 as xp.clip does (+-inf and
/// out-of-range values clamp) by the fused backward cast (dweight) and the
/// clipping cast (dinput): gradients stay finite where a plain cast would give
/// inf. Checked against the reference on the clipped dvalues, on shapes with
/// and without run loads.
#[test]
fn f16_kernels_clip_dvalues_to_the_f16_range() {
    let Some(device) = common::gpu() else { return };
    let mut rng = Rng::fresh();
    for (input, c_out) in [([2, 6, 5, 8], 16), ([1, 5, 7, 3], 5)] {
        let params = ConvParams::new(c_out, 3, Padding::Same);
        let meta = ConvShapeMeta::new(input, &params).unwrap();
        let x = rng.vec(meta.n * meta.h * meta.w * meta.c_in);
        let w = rng.vec(meta.k * meta.c_out);
        let mut dy = rng.vec(meta.m * meta.c_out);
        for (i, extreme) in [f32::INFINITY, -1.0e6, 7.0e4, f32::NEG_INFINITY]
            .into_iter()
            .enumerate()
        {
            dy[3 + 11 * i] = extreme;
        }
        let clipped: Vec<f32> = dy
            .iter()
            .map(|&v| aether::conv::clip_f16_range(v))
            .collect();
        let (want_dw, want_db) = reference::dweight(&meta, &x, &clipped);
        let want_dx = reference::dinput(&meta, &clipped, &w);
        for (variant, plans, bound) in variants(&device) {
            if variant == "portable_f32" {
                continue;
            }
            let ctx = format!("{input:?} -> {c_out} [{variant}] seed {}", rng.seed);
            let dyt = tensor(&meta.output_dims(), &dy, &device);
            let (dw, db) =
                conv2d_dweight(&tensor(&input, &x, &device), &dyt, &params, &plans).unwrap();
            let dx = conv2d_dinput(
                &dyt,
                &tensor(&meta.weight_dims(), &w, &device),
                input,
                &params,
                &plans,
            )
            .unwrap();
            for (name, got, want) in [
                ("dweight", dw, &want_dw),
                ("dbias", db, &want_db),
                ("dinput", dx, &want_dx),
            ] {
                let got = got.to_vec_f32().unwrap();
                assert!(
                    got.iter().all(|v| v.is_finite()),
                    "{name} {ctx}: not finite"
                );
                let err = norm_rel_error(&got, want);
                assert!(err <= bound, "{name} {ctx}: error {err:e} > {bound:e}");
            }
        }
    }
}

// The Conv2d layer's backward where dinput runs the halo kernel: dweight's
// reduce writes the flipped filter that dinput reads, so the layer takes
// one dispatch fewer than `conv2d_dweight` and `conv2d_dinput` (whose
// dinput flips in a dispatch of its own), and its dX and dW match the f64
// reference. f16 operands, so neither path casts.
test_device!(
    conv_layer_backward_flips_the_filter_in_the_dweight_reduce,
    |shared: &Device| {
        // On a GPU, a device of its own, so no other test's work shows in
        // its dispatch count.
        let device = &match shared {
            Device::Gpu(_) => {
                Device::with_preference(DevicePreference::Gpu, &common::test_gpu_options()).unwrap()
            }
            cpu => cpu.clone(),
        };
        let mut rng = Rng::fresh();
        let (input, c_out) = ([3, 16, 16, 32], 32);
        let params = ConvParams::new(c_out, 3, Padding::Same);
        let meta = ConvShapeMeta::new(input, &params).unwrap();
        let (x, w, dy) = (
            rng.vec(meta.n * meta.h * meta.w * meta.c_in),
            rng.vec(meta.k * c_out),
            rng.vec(meta.m * c_out),
        );
        let ctx = device.gpu_context().cloned();
        let f16 = |dims: &[usize], data: &[f32]| match &ctx {
            Some(_) => Tensor::from_f32_as_f16(dims.to_vec(), data, device).unwrap(),
            None => tensor(dims, data, device),
        };
        let (xt, dyt) = (f16(&input, &x), f16(&meta.output_dims(), &dy));
        let mut layer = Conv2d::new(c_out, (3, 3), Padding::Same);
        layer.build(&input[1..], 5, device).unwrap();
        layer
            .set_state("kernel", tensor(&meta.weight_dims(), &w, device))
            .unwrap();
        layer
            .forward(&xt, Mode::Train { seed: 1, step: 0 })
            .unwrap();
        let dispatches = || ctx.as_ref().map_or(0, |c| c.dispatch_count());
        let before = dispatches();
        let dx = layer.backward(&dyt, true).unwrap().unwrap();
        let layer_dispatches = dispatches() - before;
        let seed = rng.seed;
        let bound = if ctx.is_some() { F16_BOUND } else { F32_BOUND };
        let err = norm_rel_error(
            &dx.to_vec_f32().unwrap(),
            &reference::dinput(&meta, &dy, &w),
        );
        assert!(
            err <= bound,
            "dinput seed {seed}: error {err:e} > {bound:e}"
        );
        let (want_dw, _) = reference::dweight(&meta, &x, &dy);
        let dw = layer.trainables()[0].grad.to_vec_f32().unwrap();
        let err = norm_rel_error(&dw, &want_dw);
        assert!(
            err <= bound,
            "dweight seed {seed}: error {err:e} > {bound:e}"
        );
        let halo = layer
            .conv_plans()
            .unwrap()
            .summary()
            .iter()
            .any(|(d, _, plan)| *d == ConvDirection::DInput && plan.halo.is_some());
        if !halo {
            return report(&format!(
                "[aether-test] {}: dinput takes no halo kernel here, so no flip to fold",
                device.name()
            ));
        }
        // The same gradients through the public functions.
        let plans = ConvPlans::new();
        let w16 = f16(&meta.weight_dims(), &w);
        let before = dispatches();
        conv2d_dweight(&xt, &dyt, &params, &plans).unwrap();
        conv2d_dinput(&dyt, &w16, input, &params, &plans).unwrap();
        let function_dispatches = dispatches() - before;
        // dweight, its reduce (writing the flipped filter) and dinput,
        // against dweight, its reduce, the flip and dinput.
        assert_eq!(
            (layer_dispatches, function_dispatches),
            (3, 4),
            "dispatches of the layer's backward and of the two functions"
        );
    }
);
