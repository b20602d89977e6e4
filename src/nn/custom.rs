//! Layers of an application's own in saved models: a layer type registered
//! under a name returns [`LayerSpec::Custom`] with that name and its
//! configuration (any JSON), and [`crate::Model::load`] rebuilds it through
//! the registered factory. An unregistered name is a typed error at load.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::{Layer, LayerSpec};
use crate::error::{AetherError, Result};

/// Makes a fresh, unbuilt layer from its saved configuration.
pub type LayerFactory = fn(&serde_json::Value) -> Result<Box<dyn Layer>>;

fn registry() -> &'static Mutex<HashMap<String, LayerFactory>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, LayerFactory>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Registers the layer type `name`, whose layers' `spec()` is
/// `LayerSpec::Custom { name, config }`, so model files holding such layers
/// load: `factory` rebuilds one from its `config`. Registering a name again
/// replaces its factory.
///
/// ```
/// use aether::nn::{Layer, LayerSpec, Mode, register_layer};
/// use aether::{Device, Result, Tensor};
///
/// /// Doubles its input (a stand-in for an app's own layer).
/// struct Double;
///
/// impl Layer for Double {
///     fn spec(&self) -> LayerSpec {
///         LayerSpec::Custom { name: "Double".into(), config: serde_json::Value::Null }
///     }
///     fn build(&mut self, input: &[usize], _seed: u64, _device: &Device) -> Result<Vec<usize>> {
///         Ok(input.to_vec())
///     }
///     fn forward(&mut self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
///         aether::ops::arith::scale(x, 2.0)
///     }
///     fn backward(&mut self, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
///         if need_dx { aether::ops::arith::scale(dy, 2.0).map(Some) } else { Ok(None) }
///     }
/// }
///
/// register_layer("Double", |_config| Ok(Box::new(Double)));
/// ```
pub fn register_layer(name: &str, factory: LayerFactory) {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_owned(), factory);
}

/// The layer the factory registered under `name` makes from `config`.
pub(crate) fn instantiate_custom(name: &str, config: &serde_json::Value) -> Result<Box<dyn Layer>> {
    let factory = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .copied();
    let factory = factory.ok_or_else(|| {
        AetherError::Model(format!(
            "layer type {name:?} is not registered: call aether::nn::register_layer({name:?}, ...) \
             before loading a model that holds one"
        ))
    })?;
    let layer = factory(config)?;
    match layer.spec() {
        LayerSpec::Custom { name: made, .. } if made == name => Ok(layer),
        other => Err(AetherError::Model(format!(
            "the factory registered for {name:?} made a layer whose spec is {other:?}"
        ))),
    }
}
