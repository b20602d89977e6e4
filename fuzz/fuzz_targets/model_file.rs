//! The model loader on arbitrary bytes (safetensors header, JSON architecture,
//! tensors). A file that loads must also predict one sample, or refuse it as
//! `TooLarge` (an activation past the CPU tensor limit, kept at 64 MiB so
//! each input finishes quickly).
#![no_main]

use aether::{AetherError, Device, Model};
use libfuzzer_sys::fuzz_target;

/// Per-sample inputs larger than this are loaded but not run, to keep each
/// execution short.
const MAX_PREDICT_VALUES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let mut model = match Model::from_bytes("fuzz.aether", data, &Device::Cpu) {
        Ok(model) => model.cpu_tensor_limit(64 << 20),
        Err(AetherError::ModelFile { path, .. }) => {
            assert_eq!(path, std::path::Path::new("fuzz.aether"));
            return;
        }
        Err(e) => panic!("a bad file must be a ModelFile error, got {e:?}"),
    };
    let values: usize = model
        .input_shape()
        .expect("a loaded model is finalized")
        .iter()
        .product();
    if values <= MAX_PREDICT_VALUES {
        let out = model.predict(&vec![0.5; values], 1, true);
        assert!(
            matches!(out, Ok(_) | Err(AetherError::TooLarge { .. })),
            "a loaded model must predict: {out:?}"
        );
    }
});
