//! Step 1 of ResNet-18 and airbench94 against PyTorch, without torch: the
//! loss and every parameter's gradient of `Model::gradients` on the CPU path
//! against float64 numbers from the PyTorch twins
//! (`tests/data/parity_step1.json`, written by
//! `benches/parity_step1_reference.py`), on weights and data both sides
//! compute from one formula and load through
//! `import::load_pytorch_state_dict`, so the import's layouts and name maps
//! are checked with the networks. docs/lab/parity-models.md has the
//! 50-step comparison.

mod common;

use std::collections::HashMap;

use aether::import::load_pytorch_state_dict;
use aether::optim::Adam;
use aether::serde_json::{self, Value};
use aether::{Device, Loss, Metric, Model};

const REFERENCE: &str = include_str!("data/parity_step1.json");

/// `n` values in [-1, 1) from an integer hash of (index, `stream`), as
/// `benches/parity_step1_reference.py`'s `uniform` computes them.
fn uniform(n: usize, stream: u64) -> Vec<f64> {
    (0..n as u64)
        .map(|k| {
            let mut h = (k * 2_654_435_761 + stream * 40_503 + 12_345) & 0xffff_ffff;
            h ^= h >> 15;
            h = (h * 2_246_822_519) & 0xffff_ffff;
            h ^= h >> 13;
            h = (h * 3_266_489_917) & 0xffff_ffff;
            h ^= h >> 16;
            (h >> 8) as f64 / f64::from(1u32 << 23) - 1.0
        })
        .collect()
}

/// The values the reference script gives parameter number `t` of PyTorch
/// shape `shape` and kind `kind`, rounded to f32.
fn formula(kind: &str, shape: &[usize], t: usize) -> Vec<f32> {
    let fan_in: usize = shape[1..].iter().product();
    let u = uniform(shape.iter().product(), t as u64 + 1);
    u.into_iter()
        .map(|u| {
            (match kind {
                "kernel" => u * (3.0 / fan_in as f64).sqrt(),
                "bias" | "bn_bias" => 0.1 * u,
                "bn_weight" => 1.0 + 0.2 * u,
                other => panic!("unknown kind {other}"),
            }) as f32
        })
        .collect()
}

/// Flat index `k` of a PyTorch tensor of shape `torch` in aether's layout
/// (`[O, I, R, S]` -> `[R, S, I, O]`, `[O, I]` -> `[1, 1, I, O]`).
fn aether_index(k: usize, torch: &[usize]) -> usize {
    match *torch {
        [_, i, r, s] => {
            let o_count = torch[0];
            let (o, rest) = (k / (i * r * s), k % (i * r * s));
            let (ii, rest) = (rest / (r * s), rest % (r * s));
            let (rr, ss) = (rest / s, rest % s);
            ((rr * s + ss) * i + ii) * o_count + o
        }
        [o_count, i] => (k % i) * o_count + k / i,
        _ => k,
    }
}

fn to_usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// Writes the formula's weights as a PyTorch state_dict (safetensors), loads
/// them into `model` and checks step 1 against the reference of `name`.
fn check(name: &str, mut model: Model, names: &[(String, String)]) {
    let reference: Value = serde_json::from_str(REFERENCE).unwrap();
    let expected = &reference["models"][name];
    let tensors = expected["tensors"].as_array().unwrap();
    let mut values: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (t, entry) in tensors.iter().enumerate() {
        let shape = to_usizes(&entry["shape"]);
        let kind = entry["kind"].as_str().unwrap();
        let data = formula(kind, &shape, t);
        values.push((entry["name"].as_str().unwrap().to_owned(), shape, data));
    }
    // Running statistics: the state_dict holds them; training ignores them.
    for (_, torch) in names {
        if let Some(module) = torch.strip_suffix(".running_mean") {
            let channels = values
                .iter()
                .find(|(n, _, _)| *n == format!("{module}.bias"))
                .map(|(_, s, _)| s[0])
                .unwrap();
            values.push((torch.clone(), vec![channels], vec![0.0; channels]));
            values.push((
                format!("{module}.running_var"),
                vec![channels],
                vec![1.0; channels],
            ));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = values
        .iter()
        .map(|(n, shape, data)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape.clone(),
                bytemuck::cast_slice(data),
            )
            .unwrap();
            (n.clone(), view)
        })
        .collect();
    let dir = common::TempDir::new(&format!("parity-step1-{name}"));
    let path = dir.0.join("state_dict.safetensors");
    std::fs::write(
        &path,
        safetensors::serialize(views, None::<HashMap<String, String>>).unwrap(),
    )
    .unwrap();
    load_pytorch_state_dict(&mut model, &path, names).unwrap();

    let (batch, side) = (2usize, 32usize);
    let x: Vec<f32> = uniform(batch * side * side * 3, 0)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let labels: Vec<u32> = to_usizes(&reference["labels"])
        .iter()
        .map(|&l| l as u32)
        .collect();
    let got = model.gradients(&x, &labels).unwrap();
    let want_loss = expected["loss"].as_f64().unwrap();
    let loss_err = (f64::from(got.loss) - want_loss).abs() / want_loss;
    assert!(
        loss_err < 1e-5,
        "{name}: loss {} vs torch f64 {want_loss}",
        got.loss
    );

    let by_torch: HashMap<&str, &str> = names
        .iter()
        .map(|(a, t)| (t.as_str(), a.as_str()))
        .collect();
    // (error over the tensor's bound, error, torch f32's error, tensor)
    let mut worst = (0.0f64, 0.0, 0.0, String::new());
    for entry in tensors {
        let torch = entry["name"].as_str().unwrap();
        let aether = by_torch[torch];
        let grad = &got
            .tensors
            .iter()
            .find(|(n, _)| n == aether)
            .unwrap_or_else(|| panic!("{name}: no gradient for {aether} ({torch})"))
            .1;
        let shape = to_usizes(&entry["shape"]);
        let max_abs = entry["max_abs"].as_f64().unwrap();
        let norm = grad
            .iter()
            .map(|&g| f64::from(g).powi(2))
            .sum::<f64>()
            .sqrt();
        let want_norm = entry["norm"].as_f64().unwrap();
        let mut err = (norm - want_norm).abs() / want_norm.max(1e-30);
        for (k, want) in to_usizes(&entry["at"])
            .iter()
            .zip(entry["values"].as_array().unwrap())
        {
            let g = f64::from(grad[aether_index(*k, &shape)]);
            err = err.max((g - want.as_f64().unwrap()).abs() / max_abs.max(1e-30));
        }
        let torch_f32 = entry["torch_f32_error"].as_f64().unwrap();
        let bound = FLOOR.max(NOISE_FACTOR * torch_f32);
        if err / bound > worst.0 {
            worst = (err / bound, err, torch_f32, format!("{torch} ({aether})"));
        }
    }
    common::report(&format!(
        "[aether-test] {name} step 1 on the CPU: loss {} (torch f64 {want_loss:.7}); the gradient \
         nearest its bound is {}: error {:.2e} of the tensor's largest, torch f32's {:.2e}",
        got.loss, worst.3, worst.1, worst.2
    ));
    assert!(
        worst.0 <= 1.0,
        "{name}: gradient of {} off by {:.2e}, past max({FLOOR:e}, {NOISE_FACTOR} x torch f32's {:.2e})",
        worst.3,
        worst.1,
        worst.2
    );
}

/// Each tensor's error (the relative error of its norm, or the largest
/// |aether - torch f64| at its 8 sampled entries over its largest
/// |gradient|) may be at most `NOISE_FACTOR` times PyTorch's own float32
/// error by the same measure, and never needs to be below `FLOOR`. A layout
/// mix-up or a wrong derivative is off by order 1; float32 rounding is not,
/// but through ReLU kinks and BatchNorm over a batch of 2 it reaches 4e-3 of
/// a tensor's largest entry in ResNet-18, in PyTorch as in aether.
const NOISE_FACTOR: f64 = 4.0;
const FLOOR: f64 = 1e-4;

#[test]
fn resnet18_step1_gradients_match_pytorch() {
    let mut model = aether::zoo::resnet18_cifar(10, 0);
    model.to(&Device::Cpu).unwrap();
    model.finalize(&[32, 32, 3]).unwrap();
    check(
        "resnet18",
        model,
        &aether::zoo::resnet18_cifar_pytorch_names(10),
    );
}

#[test]
fn airbench94_step1_gradients_match_pytorch() {
    let mut model = aether::zoo::airbench94_net(0);
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.2,
        },
        Adam::adamw(1e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    model.to(&Device::Cpu).unwrap();
    model.finalize(&[32, 32, 3]).unwrap();
    check(
        "airbench94",
        model,
        &aether::zoo::airbench94_pytorch_names(),
    );
}
