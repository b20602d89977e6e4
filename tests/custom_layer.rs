//! Layers of an application's own: saved under their registered name and
//! configuration and loaded through the factory; an unregistered type or a
//! layer naming two tensors alike is a typed error, never a panic.

use aether::nn::{Dense, Flatten, Layer, LayerSpec, Mode, register_layer};
use aether::ops::arith::scale;
use aether::{AetherError, Device, Model, Result, Tensor};

/// Multiplies by a factor kept in its configuration, and holds one tensor
/// (or, with `twice`, names two tensors alike).
struct Gain {
    factor: f32,
    twice: bool,
    marker: Option<Tensor>,
}

impl Layer for Gain {
    fn spec(&self) -> LayerSpec {
        let name = if self.twice { "GainTwice" } else { "Gain" };
        LayerSpec::Custom {
            name: name.into(),
            config: serde_json::json!({ "factor": self.factor }),
        }
    }

    fn build(&mut self, input: &[usize], _seed: u64, device: &Device) -> Result<Vec<usize>> {
        self.marker = Some(Tensor::from_f32(vec![2], vec![0.25, -4.0], device)?);
        Ok(input.to_vec())
    }

    fn forward(&mut self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        scale(x, self.factor)
    }

    fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        Ok(if need_dx {
            Some(scale(dy, self.factor)?)
        } else {
            None
        })
    }

    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        let Some(m) = &self.marker else {
            return Vec::new();
        };
        if self.twice {
            vec![("marker", m), ("marker", m)]
        } else {
            vec![("marker", m)]
        }
    }

    fn state_values(&self, _input: &[usize]) -> Result<usize> {
        Ok(2)
    }

    fn set_state(&mut self, name: &str, tensor: Tensor) -> Result<()> {
        assert_eq!(name, "marker");
        self.marker = Some(tensor);
        Ok(())
    }
}

fn gain(config: &serde_json::Value) -> Result<Box<dyn Layer>> {
    let factor = config["factor"]
        .as_f64()
        .ok_or_else(|| AetherError::Model(format!("Gain config {config} has no factor")))?;
    Ok(Box::new(Gain {
        factor: factor as f32,
        twice: false,
        marker: None,
    }))
}

fn model_with(layer: Gain) -> Model {
    let mut model = Model::new();
    model.add(layer).add(Flatten::default()).add(Dense::new(3));
    model.finalize(&[2, 2, 1]).unwrap();
    model
}

#[test]
fn a_registered_layer_of_ones_own_saves_and_loads() {
    let dir = std::env::temp_dir().join(format!("aether-custom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gain.aether");
    let gain_layer = Gain {
        factor: 1.5,
        twice: false,
        marker: None,
    };
    let mut model = model_with(gain_layer);
    model.save(&path).unwrap();
    let x = [0.5f32, -1.0, 2.0, 0.25];
    // Before registration the file cannot be rebuilt: a typed error naming the type.
    match Model::load(&path, &Device::Cpu) {
        Err(AetherError::ModelFile { reason, .. }) => {
            assert!(reason.contains("\"Gain\" is not registered"), "{reason}")
        }
        other => panic!("expected a ModelFile error, got {:?}", other.map(|_| ())),
    }
    register_layer("Gain", gain);
    let mut loaded = Model::load(&path, &Device::Cpu).unwrap();
    assert_eq!(
        loaded.predict(&x, 1, true).unwrap(),
        model.predict(&x, 1, true).unwrap()
    );
    assert_eq!(
        loaded.layer_spec(0),
        Some(LayerSpec::Custom {
            name: "Gain".into(),
            config: serde_json::json!({ "factor": 1.5 })
        })
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_layer_naming_two_tensors_alike_is_refused_at_save() {
    let path = std::env::temp_dir().join(format!("aether-twice-{}.aether", std::process::id()));
    let model = model_with(Gain {
        factor: 2.0,
        twice: true,
        marker: None,
    });
    match model.save(&path) {
        Err(AetherError::Model(message)) => {
            assert!(
                message.contains("layer 0") && message.contains("\"marker\""),
                "{message}"
            )
        }
        other => panic!("expected a Model error, got {other:?}"),
    }
    assert!(!path.exists(), "nothing written");
}
