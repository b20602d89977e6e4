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

/// The values `benches/parity_step1_reference.py` gives parameter number `t`
/// of PyTorch shape `shape` and kind `kind`, rounded to f32.
fn formula(kind: &str, shape: &[usize], t: usize) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let t = t as f64;
    let fan_in: usize = shape[1..].iter().product();
    (0..n)
        .map(|k| {
            let k = k as f64;
            (match kind {
                "kernel" => (1.7 * k + 0.9 * t + 0.3).sin() / (fan_in as f64).sqrt(),
                "bias" => 0.1 * (1.3 * k + 0.9 * t).sin(),
                "bn_weight" => 1.0 + 0.2 * (1.1 * k + 0.9 * t).sin(),
                "bn_bias" => 0.1 * (0.7 * k + 0.9 * t).cos(),
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
    let x: Vec<f32> = (0..batch * side * side * 3)
        .map(|i| (0.37 * i as f64 + 0.11).sin() as f32)
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
    let mut worst = (0.0f64, String::new());
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
        if err > worst.0 {
            worst = (err, format!("{torch} ({aether})"));
        }
    }
    common::report(&format!(
        "[aether-test] {name} step 1 on the CPU: loss {} (torch f64 {want_loss:.7}), worst gradient \
         error {:.2e} of the tensor's largest ({})",
        got.loss, worst.0, worst.1
    ));
    assert!(
        worst.0 < TOLERANCE,
        "{name}: gradient of {} off by {:.2e}",
        worst.1,
        worst.0
    );
}

/// Per tensor: |aether - torch f64| at 8 sampled entries over the tensor's
/// largest |gradient|, and the relative error of its norm. f32 rounding of
/// the CPU path's sums over a batch of 2 stays far below this.
const TOLERANCE: f64 = 1e-4;

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
