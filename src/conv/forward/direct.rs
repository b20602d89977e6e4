//! The forward's direct kernel (shaders/conv/forward/direct.wgsl) for convs
//! over a few input channels: a network's first conv, whose 3 channels the
//! GEMM cores gather one element at a time, and whose reduction (27 values for
//! a 3x3 filter) fills a fraction of each of their steps. Each invocation
//! computes four output channels of one position with plain multiply-adds,
//! the filter staged once per workgroup.

use crate::conv::gemm::GEMM_RUN;
use crate::conv::shape::ConvShapeMeta;
use crate::conv::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::gpu::{GpuCapabilities, flat_grid};

/// Environment variable for comparison runs: `0` turns the direct kernel off
/// (a GEMM core runs); any other value warns once and keeps it.
pub const DIRECT_ENV: &str = "AETHER_FORWARD_DIRECT";

/// The longest reduction (`R * S * C_in`) the direct kernel takes: past it the
/// multiply-adds outweigh what the GEMM cores lose to gathers and padding.
pub const DIRECT_MAX_K: usize = 32;
/// Output channels an invocation computes.
const LANES: usize = 4;
const THREADS: u32 = 256;
/// Workgroup memory the staged filter may take at most.
const FILTER_BYTES: usize = 16 * 1024;

const SOURCE: &str = include_str!("../../../shaders/conv/forward/direct.wgsl");

/// The direct kernel's geometry for one shape: the reduction length and the
/// output channel groups of one position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirectForward {
    pub k: u32,
    pub groups: u32,
}

impl DirectForward {
    /// The direct kernel for `meta`, or why it declines: input channels that
    /// the GEMM cores load in runs, a reduction over [`DIRECT_MAX_K`], output
    /// channels not in fours, a filter over the workgroup memory it may take,
    /// or more positions than the adapter's grid holds.
    pub fn fit(
        meta: &ConvShapeMeta,
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
    ) -> Result<Self, String> {
        match tuning.get(DIRECT_ENV).map(str::trim) {
            Some("0") => return Err(format!("{DIRECT_ENV}=0")),
            Some(other) => {
                warn_once(
                    &format!("direct-env:{other}"),
                    &format!("{DIRECT_ENV}={other:?} is not 0 (off): the direct kernel stays on"),
                );
            }
            None => {}
        }
        if meta.c_in.is_multiple_of(GEMM_RUN) {
            return Err(format!(
                "{} input channels load in runs of {GEMM_RUN}",
                meta.c_in
            ));
        }
        if meta.k > DIRECT_MAX_K {
            return Err(format!("a reduction of {} (over {DIRECT_MAX_K})", meta.k));
        }
        if !meta.c_out.is_multiple_of(LANES) {
            return Err(format!("{} output channels, not in fours", meta.c_out));
        }
        let bytes = meta.k * meta.c_out * 4;
        let room = FILTER_BYTES.min(caps.limits.max_compute_workgroup_storage_size as usize);
        if bytes > room {
            return Err(format!("a filter of {bytes} bytes (room for {room})"));
        }
        let block = Self {
            k: meta.k as u32,
            groups: (meta.c_out / LANES) as u32,
        };
        let limit = caps.limits.max_compute_workgroups_per_dimension;
        let [_, rows, _] = block.grid(meta, limit);
        if rows > limit {
            return Err(format!("{rows} rows of workgroups"));
        }
        Ok(block)
    }

    /// The workgroups: one invocation per position and channel group, in
    /// rows of at most `limit` workgroups (the kernel numbers them from
    /// `num_workgroups`).
    pub fn grid(&self, meta: &ConvShapeMeta, limit: u32) -> [u32; 3] {
        flat_grid(meta.m * self.groups as usize, THREADS, limit).0
    }

    /// What the source is written with, for the pipeline key.
    pub fn constants(&self) -> [(&'static str, u32); 2] {
        [("DIRECT_K", self.k), ("DIRECT_GROUPS", self.groups)]
    }

    /// The kernel's WGSL, in place of a GEMM core after the forward's parts.
    pub fn core_source(&self) -> String {
        let header: String = self
            .constants()
            .iter()
            .map(|(name, value)| format!("const {name}: u32 = {value}u;\n"))
            .collect();
        header + SOURCE
    }
}
