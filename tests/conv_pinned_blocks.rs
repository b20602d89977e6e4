//! The halo kernels' blocks that only the tuning overrides pick (as the
//! `tools/gpu-sweep-*.sh` scripts pin them, and ragged blocks, which measured
//! plans may take) against the f64 direct convolution, on
//! the coop variants, and a malformed override as an error. Each block is
//! pinned through [`ConvTuning`] in the options of a context of its own, as
//! `GpuOptions::from_env` reads the variables. A pinned block that does not
//! fit its shape warns as the GEMM core runs instead.
//!
//! Bound (norm-relative, f16 operands): 5e-3.

mod common;

use aether::conv::dweight::halo::DWEIGHT_HALO_ENV;
use aether::conv::dweight::{SPLIT_ENV, reduce_in_columns};
use aether::conv::forward::halo::{HALO_ENV, RAGGED_ENV, STACK_ENV, TAP_BUFFERS_ENV};
use aether::conv::gemm::coop::BLOCK_ENV;
use aether::conv::{
    ConvDirection, ConvLaunchPlan, ConvParams, ConvPlans, ConvShapeMeta, ConvTuning, ConvVariant,
    Padding, conv2d_dinput, conv2d_dweight, conv2d_forward,
};
use aether::gpu::{DevicePreference, GpuOptions};
use aether::{AetherError, Device, Tensor};
use common::conv_reference::{self as reference, norm_rel_error};
use common::{Rng, report};

const F16_BOUND: f64 = 5e-3;

/// A pinned block: the variables and their values, the shape it runs on
/// (3x3, same padding; blocks that fit at tiles 8 and 16), and what the plan
/// of each direction named must show.
struct Pin {
    vars: &'static [(&'static str, &'static str)],
    input: [usize; 4],
    c_out: usize,
    ran: Vec<PlanCheck>,
}

/// A direction and what its plan must show.
type PlanCheck = (ConvDirection, fn(&ConvLaunchPlan) -> bool);

fn check(direction: ConvDirection, ran: fn(&ConvLaunchPlan) -> bool) -> PlanCheck {
    (direction, ran)
}

fn pins() -> Vec<Pin> {
    let wide = [2, 8, 16, 64];
    vec![
        // dweight's 32-position blocks.
        Pin {
            vars: &[(DWEIGHT_HALO_ENV, "32")],
            input: wide,
            c_out: 64,
            ran: vec![check(ConvDirection::DWeight, |p| {
                p.dweight_halo.is_some_and(|b| b.rows * b.cols == 32)
            })],
        },
        // The forward with all 9 taps a step, 16 input channels a stage and 4
        // channel tiles over 8 subgroups in 2 columns (`tools/gpu-sweep-halo16.sh`).
        Pin {
            vars: &[(HALO_ENV, "256x4x9x8x2x16")],
            input: [1, 16, 16, 64],
            c_out: 64,
            ran: vec![check(ConvDirection::Forward, |p| {
                p.halo.is_some_and(|b| {
                    b.taps_per_step == 9 && b.halo[0] == 16 && b.subgroups == [4, 2]
                })
            })],
        },
        // Position tiles stacking a tile's images on the v1 model's 8 x 8
        // outputs (narrower than a tile at 16, a tile wide at 8): 2 output
        // rows a block, 2 channel chunks, 4 blocks an image stack; at tile 8
        // 2 stacks and 2 blocks of channels, and dinput's transposed conv
        // (32 output channels: one block) stacked too.
        Pin {
            vars: &[(HALO_ENV, "16x4x3x8x2x16"), (STACK_ENV, "1")],
            input: [16, 8, 8, 32],
            c_out: 64,
            ran: vec![check(ConvDirection::Forward, |p| {
                p.halo.is_some_and(|b| b.images == b.tile && b.rows == 2)
            })],
        },
        // Ragged blocks (`AETHER_HALO_RAGGED=1`) on 13 rows, prime, that no
        // block of whole rows tiles, and 56 output channels, no multiple of
        // the block's: the forward's last channel tile overlaps the one
        // before it; dinput's last block row overlaps the one before it, and
        // at tile 16 its transposed conv stages 56 channels in as 64, the
        // last 8 zeros.
        Pin {
            vars: &[(RAGGED_ENV, "1")],
            input: [2, 13, 16, 32],
            c_out: 56,
            ran: vec![
                check(ConvDirection::Forward, |p| {
                    p.halo.is_some_and(|b| b.clamp_channels)
                }),
                check(ConvDirection::DInput, |p| {
                    p.halo.is_some_and(|b| 13 % b.rows != 0)
                }),
            ],
        },
        // 7 x 7 outputs, narrower than a tile, in whole stacks: stacked
        // blocks of 7 positions over 8 subgroups (the last tile repeated),
        // both directions.
        Pin {
            vars: &[(RAGGED_ENV, "1")],
            input: [16, 7, 7, 32],
            c_out: 64,
            ran: [ConvDirection::Forward, ConvDirection::DInput]
                .map(|d| {
                    check(d, |p| {
                        p.halo.is_some_and(|b| b.images > 1 && b.rows * b.cols == 7)
                    })
                })
                .to_vec(),
        },
        // 4 x 7 outputs stacked in blocks 4 rows by 2 columns (tile 8) or 4
        // (tile 16): the last block along a row overlaps the one before it.
        Pin {
            vars: &[(RAGGED_ENV, "1")],
            input: [16, 4, 7, 32],
            c_out: 64,
            ran: vec![check(ConvDirection::Forward, |p| {
                p.halo.is_some_and(|b| b.images > 1 && 7 % b.cols != 0)
            })],
        },
        // dweight's ragged blocks: 13 rows in blocks of 4 (the last reaching
        // 3 rows past the output), and 13 columns in runs of 16, dy zeros
        // past the output.
        Pin {
            vars: &[(RAGGED_ENV, "1")],
            input: [2, 13, 16, 32],
            c_out: 32,
            ran: vec![check(ConvDirection::DWeight, |p| {
                p.dweight_halo.is_some_and(|b| b.ragged && b.rows == 4)
            })],
        },
        Pin {
            vars: &[(RAGGED_ENV, "1")],
            input: [2, 12, 13, 32],
            c_out: 32,
            ran: vec![check(ConvDirection::DWeight, |p| {
                p.dweight_halo.is_some_and(|b| b.ragged && b.cols == 16)
            })],
        },
        // 16 input channels a stage of 24: the second stage holds 8 zeros
        // past them (a ragged block, at tiles 8 and 16).
        Pin {
            vars: &[(HALO_ENV, "128x2x3x8x1x16"), (RAGGED_ENV, "1")],
            input: [2, 16, 16, 24],
            c_out: 32,
            ran: vec![check(ConvDirection::Forward, |p| {
                p.halo.is_some_and(|b| b.pad_channels && b.halo[0] == 16)
            })],
        },
        // One buffer of taps (two barriers a step) where the rule's block has
        // room for two: the rule takes two wherever they fit.
        Pin {
            vars: &[(TAP_BUFFERS_ENV, "1")],
            input: [2, 16, 16, 32],
            c_out: 32,
            ran: vec![check(ConvDirection::Forward, |p| {
                p.halo.is_some_and(|b| b.tap_buffers == 1)
            })],
        },
    ]
}

#[test]
fn pinned_halo_blocks_match_the_f64_direct_convolution() {
    let Some(device) = common::gpu() else {
        return;
    };
    let caps = device.gpu_context().expect("gpu").caps();
    let coop: Vec<ConvVariant> = ConvVariant::candidates(caps)
        .into_iter()
        .filter(|v| matches!(v, ConvVariant::Coop { .. }))
        .collect();
    if coop.is_empty() {
        common::skip("no cooperative-matrix variant: no halo kernels");
        return;
    }
    let mut rng = Rng::fresh();
    for pin in pins() {
        let params = ConvParams::new(pin.c_out, 3, Padding::Same);
        let meta = ConvShapeMeta::new(pin.input, &params).unwrap();
        let x = rng.vec(meta.n * meta.h * meta.w * meta.c_in);
        let w = rng.vec(meta.k * meta.c_out);
        let b = rng.vec(meta.c_out);
        let dy = rng.vec(meta.m * meta.c_out);
        let device = pinned_device(pin.vars);
        let tensor = |dims: &[usize], data: &[f32]| {
            Tensor::from_f32(dims.to_vec(), data.to_vec(), &device).unwrap()
        };
        let xt = tensor(&pin.input, &x);
        let wt = tensor(&meta.weight_dims(), &w);
        let bt = tensor(&[meta.c_out], &b);
        let dyt = tensor(&meta.output_dims(), &dy);
        let (want_dw, want_db) = reference::dweight(&meta, &x, &dy);
        let want = [
            reference::forward(&meta, &x, &w, &b),
            want_dw,
            want_db,
            reference::dinput(&meta, &dy, &w),
        ];
        let pinned = pin
            .vars
            .iter()
            .map(|(var, value)| format!("{var}={value}"))
            .collect::<Vec<_>>()
            .join(" ");
        for &variant in &coop {
            let ctx = format!("{pinned} [{}] seed {}", variant.name(), rng.seed);
            // Fresh plans: each reads the pinned block as it is planned.
            let plans = ConvPlans::forcing(variant);
            let outputs = run(&plans, &params, &meta, [&xt, &wt, &bt, &dyt]);
            for ((name, got), want) in outputs.iter().zip(&want) {
                let err = norm_rel_error(got, want);
                assert!(
                    err <= F16_BOUND,
                    "{name} {ctx}: error {err:e} > {F16_BOUND:e}"
                );
            }
            let summary = plans.summary();
            for &(direction, shows) in &pin.ran {
                let ran = summary
                    .iter()
                    .any(|(d, _, plan)| *d == direction && shows(plan));
                assert!(
                    ran,
                    "{direction:?} {ctx}: the pinned block did not run ({summary:?})"
                );
            }
        }
        report(&format!("[aether-test] {pinned}: ok"));
    }
    // A pinned halo block that does not fit the shape (8 channel tiles: 64 or
    // 128 channels, against 32) lets the GEMM core run it, and says so.
    let pin = "256x8x3x16";
    let params = ConvParams::new(32, 3, Padding::Same);
    let meta = ConvShapeMeta::new([1, 8, 8, 32], &params).unwrap();
    let x = rng.vec(meta.n * meta.h * meta.w * meta.c_in);
    let w = rng.vec(meta.k * meta.c_out);
    let b = rng.vec(meta.c_out);
    let want = reference::forward(&meta, &x, &w, &b);
    let device = pinned_device(&[(HALO_ENV, pin)]);
    for &variant in &coop {
        let plans = ConvPlans::forcing(variant);
        let before = aether::diagnostics::warnings().len();
        let y = conv2d_forward(
            &Tensor::from_f32(vec![1, 8, 8, 32], x.clone(), &device).unwrap(),
            &Tensor::from_f32(meta.weight_dims().to_vec(), w.clone(), &device).unwrap(),
            &Tensor::from_f32(vec![32], b.clone(), &device).unwrap(),
            &params,
            &plans,
        )
        .unwrap();
        let err = norm_rel_error(&y.to_vec_f32().unwrap(), &want);
        let ctx = format!("{HALO_ENV}={pin} [{}] seed {}", variant.name(), rng.seed);
        assert!(
            err <= F16_BOUND,
            "forward {ctx}: error {err:e} > {F16_BOUND:e}"
        );
        assert!(
            plans
                .summary()
                .iter()
                .all(|(_, _, plan)| plan.halo.is_none()),
            "{ctx}: a halo block ran"
        );
        let warned = aether::diagnostics::warnings()[before..]
            .iter()
            .any(|w| w.contains(&format!("{HALO_ENV}={pin}")) && w.contains("GEMM core runs it"));
        assert!(warned, "{ctx}: the declined pin did not warn");
    }
    // A GEMM block no parser accepts stops the conv with an error naming the
    // variable, rather than quietly running the next variant.
    let meta = ConvShapeMeta::new([1, 4, 4, 8], &ConvParams::new(8, 1, Padding::Same)).unwrap();
    let device = pinned_device(&[(BLOCK_ENV, "9x9x9x9x9")]);
    let mut tensor = |dims: &[usize]| {
        let data = rng.vec(dims.iter().product());
        Tensor::from_f32(dims.to_vec(), data, &device).unwrap()
    };
    let (x, w, b) = (
        tensor(&[1, 4, 4, 8]),
        tensor(&meta.weight_dims()),
        tensor(&[8]),
    );
    let result = conv2d_forward(
        &x,
        &w,
        &b,
        &ConvParams::new(8, 1, Padding::Same),
        &ConvPlans::new(),
    );
    match result {
        Err(AetherError::InvalidEnv { var, .. }) => assert_eq!(var, BLOCK_ENV),
        other => panic!("{BLOCK_ENV}=9x9x9x9x9: expected InvalidEnv, got {other:?}"),
    }
}

/// dweight's split-K reduce lays its sums out two ways: an output per
/// invocation for a few slices of many outputs, each output's slices over a
/// workgroup's lanes otherwise (dweight/reduce.wgsl). With the split pinned
/// low, middling and high on a conv with enough outputs for the device, every
/// GPU variant runs both, each against the f64 reference.
#[test]
fn dweight_reduce_in_both_layouts_matches_the_f64_reference() {
    let Some(device) = common::gpu() else {
        return;
    };
    let caps = device.gpu_context().expect("gpu").caps().clone();
    let variants = ConvVariant::candidates(&caps);
    let mut rng = Rng::fresh();
    // Enough outputs (dW's 9 * 32 + 1 rows by c_out) for columns on this
    // device, c_out a multiple of 8 and no multiple of 256.
    let c_in = 32;
    let rows = 9 * c_in + 1;
    let c_out = (1..)
        .map(|c| 8 * c)
        .find(|&c| c % 256 != 0 && reduce_in_columns(&caps, 1, rows * c))
        .unwrap();
    let params = ConvParams::new(c_out, 3, Padding::Same);
    let input = [8, 16, 16, c_in];
    let meta = ConvShapeMeta::new(input, &params).unwrap();
    let x = rng.vec(meta.n * meta.h * meta.w * meta.c_in);
    let dy = rng.vec(meta.m * meta.c_out);
    let (want_dw, want_db) = reference::dweight(&meta, &x, &dy);
    for &variant in &variants {
        let mut layouts = Vec::new();
        for per_unit in ["1", "8", "512"] {
            let device = pinned_device(&[(SPLIT_ENV, per_unit)]);
            let tensor = |dims: &[usize], data: &[f32]| {
                Tensor::from_f32(dims.to_vec(), data.to_vec(), &device).unwrap()
            };
            let plans = ConvPlans::forcing(variant);
            let (dw, db) = conv2d_dweight(
                &tensor(&input, &x),
                &tensor(&meta.output_dims(), &dy),
                &params,
                &plans,
            )
            .unwrap();
            let split = common::dweight_split(&plans);
            let columns = reduce_in_columns(&caps, split as usize, rows * c_out);
            let ctx = format!(
                "{input:?} -> {c_out}, split {split}, columns {columns} [{}] seed {}",
                variant.name(),
                rng.seed
            );
            for (name, got, want) in [("dW", dw, &want_dw), ("dbias", db, &want_db)] {
                let err = norm_rel_error(&got.to_vec_f32().unwrap(), want);
                assert!(
                    err <= F16_BOUND,
                    "{name} {ctx}: error {err:e} > {F16_BOUND:e}"
                );
            }
            report(&format!("[aether-test] dweight reduce {ctx}: ok"));
            layouts.push((split, columns));
        }
        // Columns over several slices (its lanes and tree in registers), and lanes.
        assert!(
            layouts
                .iter()
                .any(|&(split, columns)| columns && split >= 2)
                && layouts.iter().any(|&(_, columns)| !columns),
            "[{}] both layouts: (split, columns) {layouts:?}",
            variant.name()
        );
    }
}

/// A GPU device of its own whose planner has `vars` set as tuning overrides.
fn pinned_device(vars: &[(&str, &str)]) -> Device {
    let tuning = vars.iter().fold(ConvTuning::default(), |t, (var, value)| {
        t.set(var, *value).unwrap()
    });
    let options = GpuOptions {
        conv_tuning: tuning,
        ..common::test_gpu_options()
    };
    Device::with_preference(DevicePreference::Gpu, &options).unwrap()
}

/// The forward, dweight, dbias and dinput of `meta` through `plans`.
fn run(
    plans: &ConvPlans,
    params: &ConvParams,
    meta: &ConvShapeMeta,
    [x, w, b, dy]: [&Tensor; 4],
) -> [(&'static str, Vec<f32>); 4] {
    let y = conv2d_forward(x, w, b, params, plans).unwrap();
    let (dw, db) = conv2d_dweight(x, dy, params, plans).unwrap();
    let input = [meta.n, meta.h, meta.w, meta.c_in];
    let dx = conv2d_dinput(dy, w, input, params, plans).unwrap();
    [
        ("forward", y.to_vec_f32().unwrap()),
        ("dweight", dw.to_vec_f32().unwrap()),
        ("dbias", db.to_vec_f32().unwrap()),
        ("dinput", dx.to_vec_f32().unwrap()),
    ]
}
