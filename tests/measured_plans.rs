//! Measured conv plans (`GpuOptions::tune_convs`): a model's first step of a
//! shape times each conv direction's candidate plans, keeps the fastest in a
//! file beside the pipeline cache, and a later context on the same adapter
//! plans from that file; the step's gradients stay those of the rule's plans
//! (norm-relative bound 2e-2: other kernels, f16 operands); a corrupt file is
//! ignored with a warning, never trusted, and written anew. Every plan the
//! measuring may choose is checked against the f64 convolution (bound 5e-3,
//! f16 operands), on odd sizes, strides and a 1x1 conv.

mod common;

use std::path::{Path, PathBuf};

use aether::conv::{
    ConvDirection, ConvParams, ConvPlans, ConvShapeMeta, ConvTuning, Padding, conv2d_dinput,
    conv2d_dweight, conv2d_forward, tune,
};
use aether::gpu::DevicePreference;
use aether::nn::{BatchNorm, Conv2d, Dense, Flatten, ReLU};
use aether::{Device, Model, Tensor};
use common::conv_reference::{self as reference, norm_rel_error};
use common::{Rng, TempDir, ready_model, skip};

const INPUT: [usize; 3] = [9, 7, 5];
const BATCH: usize = 3;
const BOUND: f64 = 2e-2;
const F16_BOUND: f64 = 5e-3;

/// A GPU device keeping its pipelines and measured plans in `dir`, measuring
/// plans where `tune`; `None` (after a skip line) without an adapter.
fn device(dir: &Path, tune: bool) -> Option<Device> {
    let mut options = common::test_gpu_options();
    options.cache_dir = Some(dir.to_path_buf());
    options.tune_convs = tune;
    // Tuning overrides switch the measuring off.
    options.conv_tuning = ConvTuning::default();
    match Device::with_preference(DevicePreference::Gpu, &options) {
        Ok(device) => Some(device),
        Err(e) => {
            assert!(
                std::env::var("AETHER_REQUIRE_GPU").as_deref() != Ok("1"),
                "AETHER_REQUIRE_GPU=1 but no GPU adapter: {e}"
            );
            skip(&format!("no GPU adapter: {e}"));
            None
        }
    }
}

/// Two convs (the second strided, to an odd size) between BatchNorm, ReLU
/// and a dense head.
fn model(device: &Device) -> Model {
    let mut model = Model::new().seed(5);
    model
        .add(Conv2d::new(8, (3, 3), Padding::Same))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(ReLU::default())
        .add(Conv2d::new(16, (3, 3), Padding::Same).stride((2, 2)))
        .add(ReLU::default())
        .add(Flatten::default())
        .add(Dense::new(3));
    ready_model(model, device, &INPUT)
}

/// The measured-plans files in `dir`.
fn plan_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("conv-plans-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The first conv's dweight at the test's shape.
fn first_conv_meta() -> ConvShapeMeta {
    let params = ConvParams::new(8, 3, Padding::Same);
    let [h, w, c] = INPUT;
    ConvShapeMeta::new([BATCH, h, w, c], &params).unwrap()
}

fn gradients(model: &mut Model, x: &[f32], y: &[u32]) -> Vec<(String, Vec<f32>)> {
    model.gradients(x, y).unwrap().tensors
}

fn norm_rel(got: &[f32], want: &[f32]) -> f64 {
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| f64::from(g - w).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|w| f64::from(*w).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}

#[test]
fn measured_plans_are_kept_read_back_and_train_as_the_rules_do() {
    let dir = TempDir::new("measured-plans");
    let Some(tuned_device) = device(&dir.0, true) else {
        return;
    };
    let mut tuned = model(&tuned_device);
    tuned.plan_convs(BATCH, true).unwrap();
    let files = plan_files(&dir.0);
    assert_eq!(files.len(), 1, "one measured-plans file: {files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let kept: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert!(
        kept.keys()
            .any(|k| k.starts_with("DWeight batch 4 9x7x5 to 8")),
        "dweight's splits give the first conv candidates to time: {text}"
    );
    // The step with measured plans against the rule's, same weights and batch.
    let mut rng = Rng::fresh();
    let x = rng.vec(BATCH * INPUT.iter().product::<usize>());
    let y = [2, 0, 1];
    let other_dir = TempDir::new("measured-plans-rules");
    let rules_device = device(&other_dir.0, false).expect("the adapter found above");
    let mut rules = model(&rules_device);
    assert!(
        plan_files(&other_dir.0).is_empty(),
        "nothing measured when not asked"
    );
    for ((name, got), (_, want)) in gradients(&mut tuned, &x, &y)
        .iter()
        .zip(&gradients(&mut rules, &x, &y))
    {
        let error = norm_rel(got, want);
        assert!(
            error <= BOUND,
            "{name}: measured plans' gradient off by {error:.2e}"
        );
    }
    // A later context plans from the file, without timing anything.
    let later = device(&dir.0, true).unwrap();
    let ctx = later.gpu_context().unwrap();
    let meta = first_conv_meta();
    let measured = tuned_device
        .gpu_context()
        .unwrap()
        .plan_tuning(ConvDirection::DWeight, &meta);
    assert_eq!(ctx.plan_tuning(ConvDirection::DWeight, &meta), measured);
    let before = std::fs::metadata(&files[0]).unwrap().modified().unwrap();
    let mut again = model(&later);
    again.plan_convs(BATCH, true).unwrap();
    // A batch of 4 shares the measured batch's bucket (3 rounds up to 4).
    again.plan_convs(4, true).unwrap();
    let after = std::fs::metadata(&files[0]).unwrap().modified().unwrap();
    assert_eq!(
        before, after,
        "nothing measured again: the file is unchanged"
    );
}

#[test]
fn a_corrupt_measured_plans_file_is_ignored_with_a_warning_and_rewritten() {
    let dir = TempDir::new("measured-plans-corrupt");
    let Some(first) = device(&dir.0, true) else {
        return;
    };
    model(&first).plan_convs(BATCH, true).unwrap();
    let file = plan_files(&dir.0).pop().expect("a measured-plans file");
    std::fs::write(&file, b"{\"DWeight\": [not json").unwrap();
    let second = device(&dir.0, true).unwrap();
    assert!(
        aether::diagnostics::warnings()
            .iter()
            .any(|w| w.contains("ignoring the measured conv plans") && w.contains("conv-plans-")),
        "the corrupt file is announced: {:?}",
        aether::diagnostics::warnings()
    );
    model(&second).plan_convs(BATCH, true).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).expect("written anew, whole");
}

/// Shapes for the candidates: stride 1 with odd sizes (the halo kernels'
/// ground), stride 2 to an odd size, a strided 1x1 projection, and channels
/// no GEMM run divides.
fn candidate_shapes() -> Vec<([usize; 4], ConvParams)> {
    let strided = |c_out, filter, padding| ConvParams {
        stride: (2, 2),
        ..ConvParams::new(c_out, filter, padding)
    };
    vec![
        ([2, 9, 7, 16], ConvParams::new(16, 3, Padding::Same)),
        ([3, 9, 7, 16], strided(32, 3, Padding::Same)),
        ([2, 6, 6, 16], strided(16, 1, Padding::Valid)),
        ([2, 7, 5, 5], ConvParams::new(8, 3, Padding::Same)),
    ]
}

#[test]
fn every_candidate_plan_matches_the_f64_convolution() {
    let dir = TempDir::new("measured-plans-candidates");
    if device(&dir.0, false).is_none() {
        return;
    }
    let mut rng = Rng::fresh();
    for direction in [
        ConvDirection::Forward,
        ConvDirection::DWeight,
        ConvDirection::DInput,
    ] {
        for tuning in tune::candidates(direction) {
            // The candidate as the planner reads it: a context pinned to it.
            let mut options = common::test_gpu_options();
            options.conv_tuning = tuning.clone();
            let device = Device::with_preference(DevicePreference::Gpu, &options).unwrap();
            let pinned: Vec<String> = tuning.values().map(|(v, x)| format!("{v}={x}")).collect();
            for (input, params) in candidate_shapes() {
                let meta = ConvShapeMeta::new(input, &params).unwrap();
                let tensor = |dims: &[usize], data: &[f32]| {
                    Tensor::from_f32(dims.to_vec(), data.to_vec(), &device).unwrap()
                };
                let plans = ConvPlans::new();
                let what = format!(
                    "{direction:?} {input:?} {params:?} {pinned:?} seed {}",
                    rng.seed
                );
                let x = rng.vec(meta.n * meta.h * meta.w * meta.c_in);
                let w = rng.vec(meta.k * meta.c_out);
                let dy = rng.vec(meta.m * meta.c_out);
                let checks: Vec<(Vec<f32>, Vec<f64>)> = match direction {
                    ConvDirection::Forward => {
                        let b = rng.vec(meta.c_out);
                        let y = conv2d_forward(
                            &tensor(&input, &x),
                            &tensor(&meta.weight_dims(), &w),
                            &tensor(&[meta.c_out], &b),
                            &params,
                            &plans,
                        )
                        .unwrap();
                        vec![(
                            y.to_vec_f32().unwrap(),
                            reference::forward(&meta, &x, &w, &b),
                        )]
                    }
                    ConvDirection::DWeight => {
                        let (dw, db) = conv2d_dweight(
                            &tensor(&input, &x),
                            &tensor(&meta.output_dims(), &dy),
                            &params,
                            &plans,
                        )
                        .unwrap();
                        let (want_dw, want_db) = reference::dweight(&meta, &x, &dy);
                        vec![
                            (dw.to_vec_f32().unwrap(), want_dw),
                            (db.to_vec_f32().unwrap(), want_db),
                        ]
                    }
                    ConvDirection::DInput => {
                        let dx = conv2d_dinput(
                            &tensor(&meta.output_dims(), &dy),
                            &tensor(&meta.weight_dims(), &w),
                            input,
                            &params,
                            &plans,
                        )
                        .unwrap();
                        vec![(dx.to_vec_f32().unwrap(), reference::dinput(&meta, &dy, &w))]
                    }
                };
                for (got, want) in &checks {
                    let error = norm_rel_error(got, want);
                    assert!(error <= F16_BOUND, "{what}: error {error:.2e}");
                }
            }
        }
    }
}
