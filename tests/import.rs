//! Loading a PyTorch `state_dict` (safetensors) into a zoo model: a file
//! written in PyTorch's layouts and names from one model's weights, loaded
//! into another, predicts exactly as the first; bad files name the tensor.

mod common;

use std::collections::HashMap;

use aether::import::load_pytorch_state_dict;
use aether::zoo::{resnet18_cifar, resnet18_cifar_pytorch_names};
use aether::{AetherError, Model};
use common::Rng;

/// An aether tensor in PyTorch's layout: conv kernels `[R, S, I, O]` as
/// `[O, I, R, S]`, dense kernels `[1, 1, I, O]` as `[O, I]`.
fn torch_layout(dims: &[usize], values: &[f32], dense: bool) -> (Vec<usize>, Vec<f32>) {
    match *dims {
        [1, 1, i, o] if dense => {
            let mut out = vec![0.0; values.len()];
            for ii in 0..i {
                for oo in 0..o {
                    out[oo * i + ii] = values[ii * o + oo];
                }
            }
            (vec![o, i], out)
        }
        [r, s, i, o] => {
            let mut out = vec![0.0; values.len()];
            for rr in 0..r {
                for ss in 0..s {
                    for ii in 0..i {
                        for oo in 0..o {
                            out[((oo * i + ii) * r + rr) * s + ss] =
                                values[((rr * s + ss) * i + ii) * o + oo];
                        }
                    }
                }
            }
            (vec![o, i, r, s], out)
        }
        _ => (dims.to_vec(), values.to_vec()),
    }
}

/// Writes `tensors` (PyTorch name, shape, values) as a safetensors file, with
/// BatchNorm's `num_batches_tracked` counters as PyTorch saves them.
fn write_state_dict(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut bytes: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, d, v)| {
            let data = bytemuck::cast_slice(v).to_vec();
            (n.clone(), safetensors::Dtype::F32, d.clone(), data)
        })
        .collect();
    bytes.push((
        "bn1.num_batches_tracked".into(),
        safetensors::Dtype::I64,
        vec![],
        7i64.to_le_bytes().to_vec(),
    ));
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(n, dtype, d, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, d.clone(), data).unwrap();
            (n.clone(), view)
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn resnet18_loads_pytorch_weights_and_names_bad_tensors() {
    let mut rng = Rng::fresh();
    let mut source = resnet18_cifar(10, rng.next_u64());
    source.finalize(&[32, 32, 3]).unwrap();
    // Running statistics unlike a fresh model's, so a statistic that does not
    // load shows in the predictions.
    let stats: Vec<(String, Vec<f32>)> = source
        .tensors()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n.contains("running"))
        .map(|(n, t)| {
            let v = (0..t.numel())
                .map(|_| 0.5 + 0.4 * rng.uniform().abs())
                .collect();
            (n, v)
        })
        .collect();
    source.set_tensors(&stats).unwrap();
    let names = resnet18_cifar_pytorch_names(10);
    let mine: HashMap<String, aether::Tensor> = source.tensors().unwrap().into_iter().collect();
    assert_eq!(names.len(), mine.len(), "the map covers every tensor");
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = names
        .iter()
        .map(|(aether, torch)| {
            let t = &mine[aether];
            let (dims, values) =
                torch_layout(t.dims(), &t.to_vec_f32().unwrap(), torch == "linear.weight");
            (torch.clone(), dims, values)
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("aether-import-{}", rng.seed));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("resnet18.safetensors");
    write_state_dict(&good, &tensors);

    let mut target = resnet18_cifar(10, rng.next_u64());
    target.finalize(&[32, 32, 3]).unwrap();
    let x = rng.vec(2 * 32 * 32 * 3);
    let before = target.predict(&x, 2, true).unwrap();
    load_pytorch_state_dict(&mut target, &good, &names).unwrap();
    assert_eq!(
        target.predict(&x, 2, true).unwrap(),
        source.predict(&x, 2, true).unwrap(),
        "the imported model predicts as the one the weights came from"
    );

    let expect = |file: &std::path::Path, needle: &str, model: &mut Model| {
        let kept = model.predict(&x, 2, true).unwrap();
        match load_pytorch_state_dict(model, file, &names) {
            Err(AetherError::ModelFile { reason, .. }) => {
                assert!(reason.contains(needle), "{reason:?} should name {needle}")
            }
            other => panic!("expected a ModelFile error naming {needle}, got {other:?}"),
        }
        assert_eq!(
            model.predict(&x, 2, true).unwrap(),
            kept,
            "a failed load changes nothing"
        );
    };
    let mut fresh = resnet18_cifar(10, 1);
    fresh.finalize(&[32, 32, 3]).unwrap();
    assert_ne!(fresh.predict(&x, 2, true).unwrap(), before);
    let missing = dir.join("missing.safetensors");
    write_state_dict(&missing, &tensors[1..]);
    expect(&missing, &tensors[0].0, &mut fresh);
    let mut misshaped = tensors.clone();
    let k = misshaped
        .iter()
        .position(|(n, ..)| n == "layer2.0.conv1.weight")
        .unwrap();
    misshaped[k].1 = vec![128, 64, 9, 1];
    let misshaped_path = dir.join("misshaped.safetensors");
    write_state_dict(&misshaped_path, &misshaped);
    expect(&misshaped_path, "layer2.0.conv1.weight", &mut fresh);
    let mut extra = tensors.clone();
    extra.push(("fc.weight".into(), vec![10, 512], vec![0.5; 5120]));
    let extra_path = dir.join("extra.safetensors");
    write_state_dict(&extra_path, &extra);
    expect(&extra_path, "fc.weight", &mut fresh);
    std::fs::remove_dir_all(&dir).ok();
}
