//! Tuning overrides of the conv planner, for sweeps and comparison runs:
//! read from the environment once, by [`GpuOptions::from_env`], and kept by
//! the context, so planning never reads the environment and a program can
//! set them in code ([`ConvTuning::set`]). Each variable's meaning is
//! documented at its constant; docs/tuning.md has the table.
//!
//! [`GpuOptions::from_env`]: crate::gpu::GpuOptions::from_env

use crate::conv::dinput::halo::DINPUT_HALO_ENV;
use crate::conv::direct::DIRECT_ENV;
use crate::conv::dweight::SPLIT_ENV;
use crate::conv::dweight::halo::DWEIGHT_HALO_ENV;
use crate::conv::forward::halo::{GROUPS_ENV, HALO_ENV, RAGGED_ENV, STACK_ENV, TAP_BUFFERS_ENV};
use crate::conv::gemm::coop::BLOCK_ENV;
use crate::error::{AetherError, Result};

/// Every tuning variable the planner reads.
pub const VARIABLES: [&str; 10] = [
    BLOCK_ENV,
    DIRECT_ENV,
    HALO_ENV,
    GROUPS_ENV,
    STACK_ENV,
    TAP_BUFFERS_ENV,
    RAGGED_ENV,
    DWEIGHT_HALO_ENV,
    SPLIT_ENV,
    DINPUT_HALO_ENV,
];

/// The tuning variables that are set, with their values. Empty (the
/// default): every plan follows the planner's rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConvTuning {
    values: Vec<(&'static str, String)>,
}

impl ConvTuning {
    /// The tuning variables set in the environment now.
    pub fn from_env() -> Self {
        let values = VARIABLES
            .iter()
            .filter_map(|&var| std::env::var(var).ok().map(|value| (var, value)))
            .collect();
        Self { values }
    }

    /// This tuning with `var` set to `value` (replacing an earlier value);
    /// an `InvalidEnv` error for a name that is no tuning variable.
    pub fn set(mut self, var: &str, value: impl Into<String>) -> Result<Self> {
        let value = value.into();
        let Some(&var) = VARIABLES.iter().find(|&&v| v == var) else {
            return Err(AetherError::InvalidEnv {
                var: "conv tuning",
                value: var.to_owned(),
                expected: "one of AETHER_COOP_BLOCK, AETHER_CONV_DIRECT, AETHER_FORWARD_HALO, AETHER_HALO_GROUPS, \
                           AETHER_HALO_STACK, AETHER_HALO_TAP_BUFFERS, AETHER_HALO_RAGGED, AETHER_DWEIGHT_HALO, \
                           AETHER_DWEIGHT_SPLIT, AETHER_DINPUT_HALO",
            });
        };
        self.values.retain(|(v, _)| *v != var);
        self.values.push((var, value));
        Ok(self)
    }

    /// The value of tuning variable `var`, where it is set.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(v, _)| *v == var)
            .map(|(_, value)| value.as_str())
    }

    /// The variables set, with their values.
    pub fn values(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.values
            .iter()
            .map(|(var, value)| (*var, value.as_str()))
    }

    /// Whether no variable is set.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_and_refuses_unknown_names() {
        let t = ConvTuning::default()
            .set(HALO_ENV, "0")
            .unwrap()
            .set(HALO_ENV, "256x4x3x16")
            .unwrap();
        assert_eq!(t.get(HALO_ENV), Some("256x4x3x16"));
        assert_eq!(t.get(BLOCK_ENV), None);
        assert!(ConvTuning::default().set("AETHER_NOPE", "1").is_err());
    }
}
