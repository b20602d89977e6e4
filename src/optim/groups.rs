//! Parameter groups: per-parameter multipliers of the learning rate and of
//! the weight decay, chosen by a rule on the layer and the parameter, as
//! PyTorch's parameter groups set them (airbench trains BatchNorm's biases at
//! 64 times the learning rate with their own weight decay).
//!
//! The multipliers go into the packed step's segment table (one entry per
//! parameter tensor), so any number of groups costs no extra dispatch.

use super::Param;
use crate::error::{Result, check_hyperparameter};

/// Which parameters a [`ParamGroup`] takes.
#[derive(Clone, Debug, PartialEq)]
pub enum Select {
    /// Every parameter of every layer of this kind (as `LayerSpec::kind`
    /// names it: "Conv2d", "Dense", "BatchNorm", ...), or only the one named
    /// `param` ("kernel", "bias", "gamma", "beta"). Frozen layers are passed
    /// over.
    Kind {
        layer: String,
        param: Option<String>,
    },
    /// The parameters of layer `index` (or only `param`). This names the
    /// layer, so it must be trainable: a frozen one is an error.
    Layer { index: usize, param: Option<String> },
}

/// A rule setting the learning-rate and weight-decay multipliers of the
/// parameters it selects; later groups override earlier ones.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamGroup {
    pub select: Select,
    /// Multiplies the optimizer's learning rate (1: unchanged).
    pub lr_scale: f32,
    /// Multiplies the optimizer's weight decay, replacing the layer's default
    /// (1, or 0 for BatchNorm); `None` keeps the default.
    pub decay_scale: Option<f32>,
}

impl ParamGroup {
    /// The parameters of every layer of kind `layer`, or only `param` of them.
    pub fn kind(layer: &str, param: Option<&str>) -> Self {
        Self::new(Select::Kind {
            layer: layer.to_owned(),
            param: param.map(str::to_owned),
        })
    }

    /// The parameters of layer `index`, or only `param` of them.
    pub fn layer(index: usize, param: Option<&str>) -> Self {
        Self::new(Select::Layer {
            index,
            param: param.map(str::to_owned),
        })
    }

    fn new(select: Select) -> Self {
        Self {
            select,
            lr_scale: 1.0,
            decay_scale: None,
        }
    }

    /// With the learning rate multiplied by `scale`.
    pub fn lr_scale(mut self, scale: f32) -> Self {
        self.lr_scale = scale;
        self
    }

    /// With the weight decay multiplied by `scale`.
    pub fn decay_scale(mut self, scale: f32) -> Self {
        self.decay_scale = Some(scale);
        self
    }

    /// `Ok` where both multipliers are finite and at least 0.
    pub fn validate(&self) -> Result<()> {
        let valid = |x: f32| x.is_finite() && x >= 0.0;
        check_hyperparameter(
            "parameter group lr_scale",
            self.lr_scale,
            valid(self.lr_scale),
            "finite and >= 0",
        )?;
        let decay = self.decay_scale.unwrap_or(1.0);
        check_hyperparameter(
            "parameter group decay_scale",
            decay,
            valid(decay),
            "finite and >= 0",
        )
    }

    /// Whether the group takes parameter `param` of layer `index` of kind `kind`.
    pub(crate) fn selects(&self, index: usize, kind: &str, param: &str) -> bool {
        let (layer_matches, wanted) = match &self.select {
            Select::Kind { layer, param } => (layer == kind, param),
            Select::Layer { index: i, param } => (*i == index, param),
        };
        layer_matches && wanted.as_deref().is_none_or(|w| w == param)
    }

    /// The layer this group names by index, if it does.
    pub(crate) fn named_layer(&self) -> Option<usize> {
        match self.select {
            Select::Layer { index, .. } => Some(index),
            Select::Kind { .. } => None,
        }
    }

    /// Sets `p`'s multipliers.
    pub(crate) fn apply(&self, p: &mut Param) {
        p.lr_scale = self.lr_scale;
        if let Some(decay) = self.decay_scale {
            p.decay_scale = decay;
        }
    }
}
