//! Every WGSL module aether builds, translated by naga for every backend it
//! may run on: parsed and validated, then written as SPIR-V (Vulkan), MSL
//! (Metal) and HLSL (DX12). No GPU is needed: the modules come from aether's
//! own code running on wgpu's noop backend (no kernel executes), which hands
//! each module through the pipeline cache, where
//! [`GpuOptions::record_shaders`] keeps it.
//!
//! The modules are those of two devices at the extremes of what aether
//! adapts to: one with every feature aether uses (f16, subgroups of 32,
//! immediates) and an H100's workgroup limits, on which the conv shapes of
//! `tests/conv.rs` run on every variant (coop at tiles 16 and 8, portable
//! f16 and f32) in every direction; and one with no feature and the least
//! limits aether accepts ([`REQUIRED_LIMITS`]), which also proves that every
//! kernel planned there fits them. On both, models that use every layer, both
//! losses, fusion and f16 activations on and off train a step and predict.
//!
//! A cooperative-matrix module is translated for a backend only where
//! [`coop_translates_to`] lets the planner choose it there (naga's HLSL
//! writer has no cooperative matrices; Metal's are 8x8), and
//! `the_planner_never_chooses_coop_where_naga_cannot_translate_it` shows the
//! planner keeps to that.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use aether::conv::forward::halo::RAGGED_ENV;
use aether::conv::{
    ConvPlans, ConvShapeMeta, ConvTuning, ConvVariant, Padding, conv2d_dinput,
    conv2d_dinput_flipped, conv2d_dweight, conv2d_forward, dinput_flipped_filter,
};
use aether::gpu::{
    BuiltShader, CoopMatrixConfig, GpuCapabilities, GpuContext, GpuOptions, REQUIRED_LIMITS,
    coop_translates_to, with_required_limits,
};
use aether::model::{Loss, Metric};
use aether::nn::{
    Add, AvgPool2d, BatchNorm, Concat, Conv2d, Dense, Dropout, Flatten, GELU, GlobalAvgPool,
    GlobalMaxPool, LeakyReLU, MaxPool2d, ReLU, Scale, SiLU, Softmax, SpatialDropout,
};
use aether::ops::augment::{random_crop_flip, reflect_translate_alternating_flip};
use aether::ops::batchnorm::{batch_norm_train, update_running_stats};
use aether::optim::Adam;
use aether::{Device, Model, Tensor};
use common::Rng;
use common::conv_cases::cases;
use common::noop::{all_features, full_limits, least_limits, noop_context, noop_context_with};
use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};

fn tensor(dims: &[usize], rng: &mut Rng, device: &Device) -> Tensor {
    let len = dims.iter().product();
    Tensor::from_f32(dims.to_vec(), rng.vec(len), device).unwrap()
}

/// Every conv direction of every case of `tests/conv.rs` under `plans`.
fn run_conv_cases(device: &Device, plans: &ConvPlans, rng: &mut Rng) {
    for case in cases(32) {
        let meta = ConvShapeMeta::new(case.input, &case.params).unwrap();
        let x = tensor(&case.input, rng, device);
        let w = tensor(&meta.weight_dims(), rng, device);
        let b = tensor(&[meta.c_out], rng, device);
        let dy = tensor(&meta.output_dims(), rng, device);
        let name = case.name;
        conv2d_forward(&x, &w, &b, &case.params, plans).unwrap_or_else(|e| panic!("{name}: {e}"));
        conv2d_dweight(&x, &dy, &case.params, plans).unwrap_or_else(|e| panic!("{name}: {e}"));
        conv2d_dinput(&dy, &w, case.input, &case.params, plans)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let flipped = dinput_flipped_filter(&w, case.input, &case.params, plans).unwrap();
        conv2d_dinput_flipped(&dy, &w, flipped.as_ref(), case.input, &case.params, plans)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Models over every layer kind and both losses, each trained a step and
/// asked for predictions, with fusion and f16 activations `on` or off.
fn run_models(device: &Device, on: bool, rng: &mut Rng) {
    let input = [8usize, 8, 3];
    let batch = 4;
    let x = rng.vec(batch * input.iter().product::<usize>());
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 3).collect();
    let mut cifar = aether::zoo::cifar10_v1(1)
        .fuse_activations(on)
        .fuse_dropout(on)
        .f16_activations(on);
    let mut other = Model::new()
        .seed(2)
        .fuse_activations(on)
        .fuse_dropout(on)
        .f16_activations(on);
    other
        .add(Conv2d::new(8, (3, 3), Padding::Same).regularize(1e-4, 1e-4, 1e-4, 1e-4))
        .add(LeakyReLU::new(0.1))
        .add(AvgPool2d::new((2, 2), (2, 2), Padding::Valid))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(SiLU::default())
        .add(Conv2d::new(8, (3, 3), Padding::Valid).stride((2, 2)))
        .add(ReLU::default())
        .add(Dropout::new(0.2))
        .add(Flatten::default())
        .add(Dense::new(3).regularize(1e-4, 1e-4, 0.0, 0.0))
        .add(Softmax::default());
    other.configure(
        Loss::CategoricalCrossEntropy {
            label_smoothing: 0.1,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    for model in [&mut cifar, &mut other] {
        model.to(device).unwrap();
        model.finalize(&input).unwrap();
        model.train_batch(&x, &y).unwrap();
        model.predict(&x, batch, false).unwrap();
        model.evaluate(&x, &y, batch).unwrap();
    }
    // What `Model::train` adds at an epoch's end, and the ops tests call alone.
    other.regularization_loss().unwrap();
    let images = Tensor::from_f32(vec![batch, 8, 8, 3], x, device).unwrap();
    random_crop_flip(&images, 2, 3, 1).unwrap();
    let rows: Vec<usize> = (0..batch).collect();
    reflect_translate_alternating_flip(&images, 2, &rows, 3, 1, 0).unwrap();
    if device.gpu_context().is_some_and(|c| c.caps().shader_f16) {
        // The f16 variants, as a model whose first conv takes f16 uploads its batch.
        let halves = vec![half::f16::ZERO; batch * 8 * 8 * 3];
        let images = Tensor::from_f16(vec![batch, 8, 8, 3], halves, device).unwrap();
        random_crop_flip(&images, 2, 3, 1).unwrap();
        reflect_translate_alternating_flip(&images, 2, &rows, 3, 1, 0).unwrap();
    }
    let channel = |v: f32| Tensor::from_f32(vec![3], vec![v; 3], device).unwrap();
    let (_, stats) = batch_norm_train(&images, &channel(1.0), &channel(0.0), 1e-5).unwrap();
    update_running_stats(&channel(0.0), &channel(1.0), &stats, batch * 64, 0.9, 1e-5).unwrap();
    // BatchNorm and GlobalAvgPool alone, where no conv precedes them.
    let mut plain = Model::new().seed(3).f16_activations(on);
    plain
        .add(BatchNorm::new(0.9, 1e-5))
        .add(MaxPool2d::new((3, 3), (2, 2), Padding::Same))
        .add(SpatialDropout::new(0.1))
        .add(GlobalAvgPool::default())
        .add(Dense::new(3));
    let mut plain = common::ready_model(plain, device, &input);
    plain
        .train_batch(&rng.vec(batch * 8 * 8 * 3), &[0, 1, 2, 0])
        .unwrap();
    // A conv whose output a 2x2 max pool (with a spatial dropout folded in
    // or not) or an activation reads: that layer writes the conv's gradient
    // as f16, flagging its saturation where a loss scaler asks (not without
    // scaling), and the pool writes the next conv's input as f16.
    let after_conv: [fn(&mut Model); 6] = [
        // The pool's output feeds a conv too: it writes it as f16.
        |m| {
            m.add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
                .add(Conv2d::new(8, (3, 3), Padding::Same));
        },
        |m| {
            m.add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
                .add(SpatialDropout::new(0.1));
        },
        |m| {
            m.add(ReLU::default());
        },
        |m| {
            m.add(LeakyReLU::new(0.1));
        },
        |m| {
            m.add(GELU::default());
        },
        |m| {
            m.add(SiLU::default());
        },
    ];
    for (add_after, scaled) in after_conv.iter().flat_map(|a| [(a, false), (a, true)]) {
        let mut pooled = Model::new().seed(5).fuse_dropout(on).f16_activations(on);
        pooled.add(Conv2d::new(8, (3, 3), Padding::Same));
        add_after(&mut pooled);
        pooled.add(GlobalAvgPool::default()).add(Dense::new(3));
        let mut pooled = common::ready_model(pooled, device, &input);
        let scale = match scaled {
            true => aether::optim::LossScale::Static(1024.0),
            false => aether::optim::LossScale::Off,
        };
        pooled.set_loss_scale(scale).unwrap();
        pooled
            .train_batch(&rng.vec(batch * 8 * 8 * 3), &[0, 1, 2, 0])
            .unwrap();
    }
    // A graph with the merges and the layers only graphs and airbench use:
    // the residual add (alone and with the ReLU after it folded in) and the
    // gradient sum at a fork, channel copies, GELU (folded into its
    // BatchNorm, whose f16 dx then flags the loss scaler, or alone), SiLU,
    // Scale, GlobalMaxPool, a bias-free conv and a scale-free BatchNorm.
    let mut g = aether::Graph::new();
    let image = g.input();
    let a = g.add(Conv2d::new(8, (3, 3), Padding::Same).bias(false), &[image]);
    let a = g.add(BatchNorm::new(0.6, 1e-12).scale(false), &[a]);
    let a = g.add(GELU::default(), &[a]);
    let b = g.add(Conv2d::new(8, (3, 3), Padding::Same), &[a]);
    let sum = g.add(Add::default(), &[b, a]);
    let s = g.add(SiLU::default(), &[sum]);
    let rectified = g.add(Add::default(), &[s, b]);
    let rectified = g.add(ReLU::default(), &[rectified]);
    // The folded ReLU's output read twice: its gradient is a masked sum.
    let joined = g.add(Concat::default(), &[rectified, rectified]);
    let pooled = g.add(GlobalMaxPool::default(), &[joined]);
    let logits = g.add(Dense::new(3).bias(false), &[pooled]);
    g.add(Scale::new(0.5), &[logits]);
    let graph = Model::from_graph(g)
        .seed(4)
        .fuse_activations(on)
        .f16_activations(on);
    let mut graph = common::ready_model(graph, device, &input);
    // SGD with Nesterov momentum, a lookahead every step and a static loss
    // scale (the saturation check and the scaler's update) for their kernels.
    let sgd = aether::optim::Sgd::new(0.1).momentum(0.9).nesterov(true);
    graph.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        sgd,
        Metric::CategoricalAccuracy,
    );
    graph
        .set_loss_scale(aether::optim::LossScale::Static(1024.0))
        .unwrap();
    let lookahead = aether::optim::Lookahead {
        every: 1,
        decay: 0.9,
    };
    graph.set_lookahead(Some(lookahead)).unwrap();
    let x = rng.vec(batch * 8 * 8 * 3);
    graph.train_batch(&x, &[2, 1, 0, 1]).unwrap();
    graph.predict(&x, batch, false).unwrap();
}

/// The modules the `contexts` built, each once (the same source and
/// constants can be built under several pipeline keys, and by each context).
fn unique(contexts: &[&GpuContext]) -> Vec<BuiltShader> {
    let mut seen = BTreeMap::new();
    for shader in contexts
        .iter()
        .flat_map(|ctx| ctx.pipelines().built_shaders())
    {
        let id = (
            shader.source.clone(),
            shader.entry_point.clone(),
            shader.key.constants.clone(),
        );
        seen.entry(id).or_insert(shader);
    }
    seen.into_values().collect()
}

fn name(shader: &BuiltShader) -> String {
    format!(
        "kernel {}:{} (constants {:?}, source constants {:?})",
        shader.key.kernel, shader.key.variant, shader.key.constants, shader.key.source_constants
    )
}

/// What one module asks of a device, after its overrides are applied.
#[derive(Debug, Default)]
struct Needs {
    workgroup_size: [u32; 3],
    workgroup_bytes: u32,
    storage_buffers: u32,
    uniform_buffers: u32,
    bind_groups: u32,
    bindings: u32,
}

/// A module ready for naga's writers: parsed, validated, overrides applied.
struct Prepared {
    module: naga::Module,
    info: naga::valid::ModuleInfo,
    needs: Needs,
    coop: bool,
}

fn prepare(shader: &BuiltShader) -> Result<Prepared, String> {
    let module = naga::front::wgsl::parse_str(&shader.source)
        .map_err(|e| format!("WGSL parse: {}", e.emit_to_string(&shader.source)))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::all())
        .validate(&module)
        .map_err(|e| format!("validation: {}", e.emit_to_string(&shader.source)))?;
    let constants: naga::back::PipelineConstants = shader
        .key
        .constants
        .iter()
        .map(|&(name, value)| (name.to_owned(), f64::from(value)))
        .collect();
    let entry = Some((naga::ShaderStage::Compute, shader.entry_point.as_str()));
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, entry, &constants)
            .map_err(|e| format!("overrides: {e}"))?;
    let (module, info) = (module.into_owned(), info.into_owned());
    let (index, ep) = module
        .entry_points
        .iter()
        .enumerate()
        .find(|(_, ep)| ep.name == shader.entry_point)
        .ok_or("no such entry point")?;
    let uses = info.get_entry_point(index);
    let mut needs = Needs {
        workgroup_size: ep.workgroup_size,
        ..Needs::default()
    };
    for (handle, global) in module.global_variables.iter() {
        if uses[handle].is_empty() {
            continue;
        }
        match global.space {
            naga::AddressSpace::WorkGroup => {
                needs.workgroup_bytes += module.types[global.ty].inner.size(module.to_ctx());
            }
            naga::AddressSpace::Storage { .. } => needs.storage_buffers += 1,
            naga::AddressSpace::Uniform => needs.uniform_buffers += 1,
            _ => {}
        }
        if let Some(binding) = &global.binding {
            needs.bind_groups = needs.bind_groups.max(binding.group + 1);
            needs.bindings = needs.bindings.max(binding.binding + 1);
        }
    }
    let coop = module
        .types
        .iter()
        .any(|(_, ty)| matches!(ty.inner, naga::TypeInner::CooperativeMatrix { .. }));
    Ok(Prepared {
        module,
        info,
        needs,
        coop,
    })
}

fn spirv(p: &Prepared, entry: &str) -> Result<(), String> {
    let options = spv::Options {
        lang_version: (1, 3),
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.to_owned(),
    };
    spv::write_vec(&p.module, &p.info, &options, Some(&pipeline))
        .map(drop)
        .map_err(|e| e.to_string())
}

fn metal(p: &Prepared, entry: &str) -> Result<(), String> {
    let options = msl::Options {
        lang_version: (2, 4),
        fake_missing_bindings: true,
        ..msl::Options::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry.to_owned())),
        ..msl::PipelineOptions::default()
    };
    msl::write_string(&p.module, &p.info, &options, &pipeline)
        .map(drop)
        .map_err(|e| e.to_string())
}

fn hlsl(p: &Prepared, entry: &str) -> Result<(), String> {
    let options = hlsl::Options {
        shader_model: hlsl::ShaderModel::V6_2,
        fake_missing_bindings: true,
        immediates_target: Some(hlsl::BindTarget::default()),
        ..hlsl::Options::default()
    };
    let pipeline = hlsl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry.to_owned())),
    };
    let mut out = String::new();
    hlsl::Writer::new(&mut out, &options, &pipeline)
        .write(&p.module, &p.info, None)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The backends whose planner may choose `shader`, with their writers.
type Writer = fn(&Prepared, &str) -> Result<(), String>;

fn backends(p: &Prepared, shader: &BuiltShader) -> Vec<(wgpu::Backend, Writer)> {
    let all: [(wgpu::Backend, Writer); 3] = [
        (wgpu::Backend::Vulkan, spirv),
        (wgpu::Backend::Metal, metal),
        (wgpu::Backend::Dx12, hlsl),
    ];
    let tile = match shader.key.variant {
        v if v.contains("coop16") => 16,
        _ => 8,
    };
    all.into_iter()
        .filter(|(backend, _)| !p.coop || coop_translates_to(*backend, tile))
        .collect()
}

/// Translates every module for every backend that may run it; the failures,
/// each naming the kernel and the backend.
fn translate_all(shaders: &[BuiltShader]) -> Vec<String> {
    let mut failures = Vec::new();
    for shader in shaders {
        let prepared = match prepare(shader) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{}: {e}", name(shader)));
                continue;
            }
        };
        for (backend, write) in backends(&prepared, shader) {
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                write(&prepared, &shader.entry_point)
            }));
            let error = match written {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(_) => "naga's writer panicked".to_owned(),
            };
            failures.push(format!("{} on {backend:?}: {error}", name(shader)));
        }
    }
    failures
}

/// Kernels used only where the device binds more storage buffers a stage than
/// the least device (BatchNorm's dx flagging f16 saturation: 10; elsewhere a
/// check kernel of its own runs).
const PLANNED_BY_STORAGE_BUFFERS: &[&str] = &["batchnorm_backward_dx_flag"];

/// Where kernels ask more of a limit than [`REQUIRED_LIMITS`] (each naming
/// the kernel and the limit), and the most any kernel asks of each limit with
/// the least value aether accepts. A cooperative-matrix, halo or direct
/// kernel's workgroup is planned within the device's limits, so only its
/// bindings count here; likewise the storage buffers of
/// [`PLANNED_BY_STORAGE_BUFFERS`].
fn over_required(shaders: &[BuiltShader]) -> (Vec<String>, BTreeMap<&'static str, (u32, u32)>) {
    let mut failures = Vec::new();
    let mut most = BTreeMap::new();
    for shader in shaders {
        let prepared = match prepare(shader) {
            Ok(p) => p,
            Err(_) => continue, // reported by translate_all
        };
        let adaptive = prepared.coop
            || shader.key.variant.contains("halo")
            || shader.key.variant.contains("direct");
        for (limit, need, least) in asked(&prepared.needs) {
            if adaptive && (limit.contains("workgroup") || limit.contains("invocations")) {
                continue;
            }
            if PLANNED_BY_STORAGE_BUFFERS.contains(&shader.key.kernel)
                && limit == "max_storage_buffers_per_shader_stage"
            {
                continue;
            }
            if need > least {
                failures.push(format!(
                    "{}: {limit} needs {need}, least is {least}",
                    name(shader)
                ));
            }
            let top = most.entry(limit).or_insert((0, least));
            top.0 = top.0.max(need);
        }
    }
    (failures, most)
}

/// What `needs` asks of each limit, with the least value aether accepts.
fn asked(needs: &Needs) -> [(&'static str, u32, u32); 8] {
    let least = least_limits();
    let [x, y, z] = needs.workgroup_size;
    [
        ("max_bind_groups", needs.bind_groups, least.max_bind_groups),
        (
            "max_bindings_per_bind_group",
            needs.bindings,
            least.max_bindings_per_bind_group,
        ),
        (
            "max_storage_buffers_per_shader_stage",
            needs.storage_buffers,
            least.max_storage_buffers_per_shader_stage,
        ),
        (
            "max_uniform_buffers_per_shader_stage",
            needs.uniform_buffers,
            least.max_uniform_buffers_per_shader_stage,
        ),
        (
            "max_compute_invocations_per_workgroup",
            x * y * z,
            least.max_compute_invocations_per_workgroup,
        ),
        (
            "max_compute_workgroup_size_x",
            x,
            least.max_compute_workgroup_size_x,
        ),
        (
            "max_compute_workgroup_size_y",
            y,
            least.max_compute_workgroup_size_y,
        ),
        (
            "max_compute_workgroup_storage_size",
            needs.workgroup_bytes,
            least.max_compute_workgroup_storage_size,
        ),
    ]
}

#[test]
fn every_kernel_translates_for_vulkan_metal_and_dx12() {
    let mut rng = Rng::fresh();
    let full = noop_context(all_features(), full_limits());
    let device = Device::Gpu(Arc::clone(&full));
    for variant in [
        ConvVariant::Coop { tile: 16 },
        ConvVariant::Coop { tile: 8 },
        ConvVariant::PortableF16,
        ConvVariant::PortableF32,
    ] {
        run_conv_cases(&device, &ConvPlans::forcing(variant), &mut rng);
    }
    for on in [true, false] {
        run_models(&device, on, &mut rng);
    }
    // Where BatchNorm's dx cannot bind the scaler (9 storage buffers a
    // stage), its f16 gradient goes to the scaler's own check kernel: every
    // other rounding of a gradient flags in its pass.
    let nine = noop_context(
        all_features(),
        wgpu::Limits {
            max_storage_buffers_per_shader_stage: 9,
            ..full_limits()
        },
    );
    run_models(&Device::Gpu(Arc::clone(&nine)), true, &mut rng);
    // Ragged halo blocks (`AETHER_HALO_RAGGED=1`: overlapping tiles, zeros
    // past the input channels) where the conv cases tile no block exactly.
    let tuning = ConvTuning::default().set(RAGGED_ENV, "1").unwrap();
    let ragged = noop_context_with(
        all_features(),
        full_limits(),
        GpuOptions {
            conv_tuning: tuning,
            ..GpuOptions::default()
        },
    );
    let ragged_device = Device::Gpu(Arc::clone(&ragged));
    for tile in [16, 8] {
        let plans = ConvPlans::forcing(ConvVariant::Coop { tile });
        run_conv_cases(&ragged_device, &plans, &mut rng);
    }
    let shaders = unique(&[&full, &nine, &ragged]);
    let ragged_modules = shaders
        .iter()
        .filter(|s| s.source.contains("const CLAMP_C: bool = true;"))
        .count();
    assert!(ragged_modules > 0, "no ragged halo module was built");
    let kernels: std::collections::BTreeSet<String> = shaders
        .iter()
        .map(|s| format!("{}:{}", s.key.kernel, s.key.variant))
        .collect();
    common::report(&format!(
        "[aether-test] kernel variants built: {}",
        kernels.into_iter().collect::<Vec<_>>().join(" ")
    ));
    let coop = shaders
        .iter()
        .filter(|s| s.source.contains("coop_mat"))
        .count();
    common::report(&format!(
        "[aether-test] {} modules built on the full devices ({coop} with cooperative matrices)",
        shaders.len()
    ));
    assert!(
        coop > 0 && shaders.len() > 100,
        "too few modules to mean anything"
    );
    for kernel in [
        "loss_scale_saturation",
        "gelu",
        "silu",
        "pool_max_backward_tiled_f16",
        "pool_max_backward_tiled_f16_flag",
        "pool_max_backward_tiled_dropout_f16",
        "pool_max_backward_tiled_dropout_f16_flag",
        "pool_max_forward_f16",
        "relu_backward_f16",
        "relu_backward_f16_flag",
        "leaky_relu_backward_f16",
        "leaky_relu_backward_f16_flag",
        "gelu_backward_f16",
        "gelu_backward_f16_flag",
        "silu_backward_f16",
        "silu_backward_f16_flag",
    ] {
        assert!(
            shaders.iter().any(|s| s.key.kernel == kernel),
            "{kernel} was not built"
        );
    }
    let mut failures = translate_all(&shaders);
    failures.extend(over_required(&shaders).0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Each requirement is needed by some kernel of one device or the other:
    // none is stricter than aether.
    let both = [shaders, least_device_shaders(&mut rng)].concat();
    let most = over_required(&both).1;
    let looser: Vec<String> = most
        .iter()
        .filter(|(_, (need, least))| need < least)
        .map(|(limit, (need, least))| format!("{limit}: kernels need {need}, required {least}"))
        .collect();
    assert!(
        looser.is_empty(),
        "REQUIRED_LIMITS asks more than the kernels need: {looser:?}"
    );
}

/// The modules of the device with no feature and the least limits.
fn least_device_shaders(rng: &mut Rng) -> Vec<BuiltShader> {
    let least = noop_context(wgpu::Features::empty(), least_limits());
    let device = Device::Gpu(Arc::clone(&least));
    run_conv_cases(&device, &ConvPlans::new(), rng);
    for on in [true, false] {
        run_models(&device, on, rng);
    }
    unique(&[&least])
}

#[test]
fn every_kernel_on_the_least_device_fits_the_required_limits_and_translates() {
    let shaders = least_device_shaders(&mut Rng::fresh());
    assert!(shaders.len() > 30, "too few modules to mean anything");
    let mut failures = translate_all(&shaders);
    failures.extend(over_required(&shaders).0);
    for shader in &shaders {
        assert!(!shader.source.contains("enable f16"), "{}", name(shader));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_planner_never_chooses_coop_where_naga_cannot_translate_it() {
    let coop = |tile| CoopMatrixConfig {
        m: tile,
        n: tile,
        k: tile,
        ab: wgpu::CooperativeScalarType::F16,
        cr: wgpu::CooperativeScalarType::F32,
    };
    let caps = |backend, tile| GpuCapabilities {
        adapter_name: format!("{backend:?} adapter with {tile}x{tile} matrices"),
        backend,
        device_type: wgpu::DeviceType::DiscreteGpu,
        driver: String::new(),
        shader_f16: true,
        subgroup_size: Some((32, 32)),
        timestamps: false,
        pipeline_cache: false,
        immediate_bytes: 0,
        coop_matrix: vec![coop(tile)],
        coop_disabled: false,
        limits: full_limits(),
    };
    let chooses_coop = |backend, tile| {
        ConvVariant::candidates(&caps(backend, tile)).contains(&ConvVariant::Coop { tile })
    };
    assert!(chooses_coop(wgpu::Backend::Vulkan, 16));
    assert!(chooses_coop(wgpu::Backend::Vulkan, 8));
    assert!(chooses_coop(wgpu::Backend::Metal, 8));
    assert!(!chooses_coop(wgpu::Backend::Metal, 16));
    assert!(!chooses_coop(wgpu::Backend::Dx12, 16));
    assert!(!chooses_coop(wgpu::Backend::Dx12, 8));
    assert!(!chooses_coop(wgpu::Backend::Gl, 8));
}

#[test]
fn the_required_limits_are_webgpus_defaults_but_one_storage_buffer() {
    let default = wgpu::Limits::default();
    let short: Vec<&str> = REQUIRED_LIMITS
        .iter()
        .filter(|r| r.of(&default) < r.least)
        .map(|r| r.name)
        .collect();
    assert_eq!(short, ["max_storage_buffers_per_shader_stage"]);
    let raised = with_required_limits(default.clone());
    assert!(REQUIRED_LIMITS.iter().all(|r| r.of(&raised) >= r.least));
    assert_eq!(raised.max_storage_buffers_per_shader_stage, 9);
    assert_eq!(
        raised.max_compute_workgroup_storage_size,
        default.max_compute_workgroup_storage_size
    );
}
