//! Weights from PyTorch: a `state_dict` saved as safetensors
//! (`safetensors.torch.save_file(model.state_dict(), path)`) loaded into an
//! aether model through a name map, converting PyTorch's layouts to aether's
//! (NCHW conv kernels `[C_out, C_in, R, S]` to `[R, S, C_in, C_out]`, linear
//! weights `[out, in]` to `[1, 1, in, out]`). The zoo's models come with
//! their maps ([`crate::zoo::resnet18_cifar_pytorch_names`]).
//!
//! A Dense layer after a Flatten of a feature map wider than one pixel reads
//! its inputs in NHWC order where PyTorch's reads NCHW: such a map would
//! need a permutation this module does not guess; the zoo's models pool to
//! one pixel first.

use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::error::{AetherError, Result};
use crate::model::Model;

/// Entries of a PyTorch `state_dict` with no aether counterpart.
const IGNORED_SUFFIXES: [&str; 1] = ["num_batches_tracked"];

/// Loads the PyTorch tensors of the safetensors file at `path` into `model`
/// (finalized), each `(aether name, PyTorch name)` of `names` taking one.
/// Every tensor is read and checked before any is replaced: a missing or
/// mis-shaped tensor, a name the map leaves out (other than
/// `num_batches_tracked`), or a dtype other than f32/f16/bf16/f64 is an
/// [`AetherError::ModelFile`] naming it, and the model is left as it was.
pub fn load_pytorch_state_dict(
    model: &mut Model,
    path: impl AsRef<Path>,
    names: &[(String, String)],
) -> Result<()> {
    let path = path.as_ref();
    let bytes =
        crate::io::read_regular(path, crate::io::MAX_MODEL_FILE_BYTES).map_err(|source| {
            AetherError::Io {
                action: "read PyTorch weights",
                path: path.to_owned(),
                source,
            }
        })?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| file_err(path, format!("not a complete safetensors file ({e})")))?;
    let mine = model.tensors()?;
    let mut values = Vec::with_capacity(names.len());
    for (aether, torch) in names {
        let view = file
            .tensor(torch)
            .map_err(|_| file_err(path, format!("tensor {torch} (for {aether}) is missing")))?;
        let target = mine
            .iter()
            .find(|(n, _)| n == aether)
            .map(|(_, t)| t.dims().to_vec())
            .ok_or_else(|| {
                file_err(
                    path,
                    format!("the model has no tensor {aether} (mapped from {torch})"),
                )
            })?;
        let data = to_f32(view.dtype(), view.data())
            .ok_or_else(|| file_err(path, format!("tensor {torch} is {:?}", view.dtype())))?;
        let converted = to_aether_layout(&data, view.shape(), &target).ok_or_else(|| {
            file_err(
                path,
                format!(
                    "tensor {torch} of shape {:?} does not fit {aether} of shape {target:?}",
                    view.shape()
                ),
            )
        })?;
        values.push((aether.clone(), converted));
    }
    let mapped: Vec<&str> = names.iter().map(|(_, t)| t.as_str()).collect();
    if let Some(extra) = file
        .names()
        .into_iter()
        .find(|n| !mapped.contains(n) && !IGNORED_SUFFIXES.iter().any(|s| n.ends_with(s)))
    {
        return Err(file_err(
            path,
            format!("tensor {extra} is not in the name map (another architecture?)"),
        ));
    }
    model
        .set_tensors(&values)
        .map_err(|e| file_err(path, e.to_string()))
}

fn file_err(path: &Path, reason: String) -> AetherError {
    AetherError::ModelFile {
        path: path.to_owned(),
        reason,
    }
}

/// The little-endian values of a tensor of `dtype` as f32.
fn to_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    let words = |n: usize| data.chunks_exact(n);
    Some(match dtype {
        Dtype::F32 => words(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => words(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => words(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F64 => words(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        _ => return None,
    })
}

/// `data` of PyTorch shape `torch` in aether's layout for shape `target`:
/// a conv kernel `[O, I, R, S]` as `[R, S, I, O]`, a linear weight `[O, I]`
/// as `[1, 1, I, O]`, anything else unchanged where the shapes agree.
fn to_aether_layout(data: &[f32], torch: &[usize], target: &[usize]) -> Option<Vec<f32>> {
    match (torch, target) {
        ([o, i, r, s], [tr, ts, ti, to]) if (r, s, i, o) == (tr, ts, ti, to) => {
            let mut out = vec![0.0; data.len()];
            for oo in 0..*o {
                for ii in 0..*i {
                    for rr in 0..*r {
                        for ss in 0..*s {
                            out[((rr * s + ss) * i + ii) * o + oo] =
                                data[((oo * i + ii) * r + rr) * s + ss];
                        }
                    }
                }
            }
            Some(out)
        }
        ([o, i], [1, 1, ti, to]) if (i, o) == (ti, to) => {
            let mut out = vec![0.0; data.len()];
            for oo in 0..*o {
                for ii in 0..*i {
                    out[ii * o + oo] = data[oo * i + ii];
                }
            }
            Some(out)
        }
        _ if torch == target => Some(data.to_vec()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::to_aether_layout;

    #[test]
    fn conv_kernels_and_linear_weights_change_layout() {
        // [O=2, I=3, R=1, S=2]: value = 1000 o + 100 i + 10 r + s.
        let torch: Vec<f32> = (0..2)
            .flat_map(|o| {
                (0..3).flat_map(move |i| (0..2).map(move |s| (1000 * o + 100 * i + s) as f32))
            })
            .collect();
        let out = to_aether_layout(&torch, &[2, 3, 1, 2], &[1, 2, 3, 2]).unwrap();
        // aether [R, S, I, O]: element (r=0, s=1, i=2, o=1), at (s * 3 + i) * 2 + o.
        let (s, i, o) = (1, 2, 1);
        assert_eq!(out[(s * 3 + i) * 2 + o], 1201.0);
        let linear: Vec<f32> = (0..6).map(|v| v as f32).collect(); // [O=2, I=3]
        let out = to_aether_layout(&linear, &[2, 3], &[1, 1, 3, 2]).unwrap();
        assert_eq!(out, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert!(to_aether_layout(&linear, &[2, 3], &[1, 1, 2, 3]).is_none());
        assert_eq!(
            to_aether_layout(&[1.0, 2.0], &[2], &[2]).unwrap(),
            [1.0, 2.0]
        );
    }
}
