//! The direct kernels for convs over a few input channels: a network's first
//! conv, whose 3 channels the GEMM cores gather one element at a time, and
//! whose reduction (27 values for a 3x3 filter) fills a fraction of each of
//! their steps. Plain multiply-adds of the variant's operands instead, four
//! output channels an invocation: the forward
//! (shaders/conv/forward/direct.wgsl) computes them for one position with the
//! filter staged per workgroup; dweight (shaders/conv/dweight/direct.wgsl)
//! sums them for one row of the partial sums over chunks of positions staged
//! per workgroup, each workgroup a slice of the reduction, as the GEMM core's
//! slices for the same reduce.

use crate::conv::gemm::GEMM_RUN;
use crate::conv::plan::ConvDirection;
use crate::conv::shape::ConvShapeMeta;
use crate::conv::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::gpu::{GpuCapabilities, flat_grid};

/// Environment variable for comparison runs: `0` turns the direct kernels
/// off (the GEMM cores run); any other value warns once and keeps them.
pub const DIRECT_ENV: &str = "AETHER_CONV_DIRECT";

/// The longest reduction of the forward (`R * S * C_in`) the direct kernels
/// take: past it the multiply-adds outweigh what the GEMM cores lose to
/// gathers and padding.
pub const DIRECT_MAX_K: usize = 32;
/// The direct kernels' cost per multiply-add over the GEMM cores' per padded
/// one, as a ratio: 5 / 2.
const DIRECT_COST: [usize; 2] = [5, 2];
/// Output channels an invocation computes.
const LANES: usize = 4;
/// Invocations a workgroup (`DIRECT_THREADS` in both shaders).
pub(crate) const DIRECT_THREADS: usize = 256;
/// Workgroup memory the staged filter (forward) or chunk (dweight) may take.
const STAGED_BYTES: usize = 16 * 1024;
/// Positions a dweight chunk stages, at most and at least.
const MAX_ROWS: usize = 64;
const MIN_ROWS: usize = 8;

const FORWARD: &str = include_str!("../../shaders/conv/forward/direct.wgsl");
const DWEIGHT: &str = include_str!("../../shaders/conv/dweight/direct.wgsl");

/// A direct kernel's geometry for one shape: the forward's reduction length,
/// the output channel groups of one position, and (dweight) the positions a
/// chunk stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirectConv {
    pub direction: ConvDirection,
    pub k: u32,
    pub groups: u32,
    pub rows: u32,
}

impl DirectConv {
    /// The direct kernel of `direction` (forward or dweight) for `meta`, or
    /// why it declines: input channels that the GEMM cores load in runs, a
    /// reduction over [`DIRECT_MAX_K`], output channels not in fours, more
    /// multiply-adds than the GEMM cores' padded ones would cost, staged
    /// values over the workgroup memory they may take, or (forward) more
    /// positions than the adapter's grid holds.
    pub fn fit(
        direction: ConvDirection,
        meta: &ConvShapeMeta,
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
    ) -> Result<Self, String> {
        match tuning.get(DIRECT_ENV).map(str::trim) {
            Some("0") => return Err(format!("{DIRECT_ENV}=0")),
            Some(other) => {
                warn_once(
                    &format!("direct-env:{other}"),
                    &format!("{DIRECT_ENV}={other:?} is not 0 (off): the direct kernels stay on"),
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
        // Their multiply-adds (K x C_out a position) cost about 2.5 times the
        // GEMM cores', which pad K to a 32-deep step and C_out to 16-wide
        // tiles (run M9, an H100: a 2x2x3 -> 24 first conv ran 2.2x faster
        // forward and 1.3x dweight, 3x3x3 -> 32 and -> 64 ones 1.6x and 2.1x
        // slower forward).
        let padded = meta.k.next_multiple_of(32) * meta.c_out.next_multiple_of(16);
        if DIRECT_COST[0] * meta.k * meta.c_out >= DIRECT_COST[1] * padded {
            return Err(format!(
                "{} x {} multiply-adds a position against the GEMM core's {padded} padded",
                meta.k, meta.c_out
            ));
        }
        let room = STAGED_BYTES.min(caps.limits.max_compute_workgroup_storage_size as usize);
        let groups = (meta.c_out / LANES) as u32;
        let limit = caps.limits.max_compute_workgroups_per_dimension;
        match direction {
            ConvDirection::Forward => {
                let bytes = meta.k * meta.c_out * 4;
                if bytes > room {
                    return Err(format!("a filter of {bytes} bytes (room for {room})"));
                }
                let block = Self {
                    direction,
                    k: meta.k as u32,
                    groups,
                    rows: 1,
                };
                let [_, rows, _] = block.grid(meta, limit);
                if rows > limit {
                    return Err(format!("{rows} rows of workgroups"));
                }
                Ok(block)
            }
            ConvDirection::DWeight => {
                // A position's inputs and output gradient, as f32.
                let per_row = (meta.k + meta.c_out) * 4;
                let rows = (room / per_row).min(MAX_ROWS);
                if rows < MIN_ROWS {
                    return Err(format!(
                        "{MIN_ROWS} positions of {per_row} bytes (room for {room})"
                    ));
                }
                Ok(Self {
                    direction,
                    k: meta.k as u32,
                    groups,
                    rows: 1 << rows.ilog2(),
                })
            }
            ConvDirection::DInput => Err("no direct kernel for dinput".into()),
        }
    }

    /// The forward's workgroups: one invocation per position and channel
    /// group, in rows of at most `limit` workgroups (the kernel numbers them
    /// from `num_workgroups`).
    pub fn grid(&self, meta: &ConvShapeMeta, limit: u32) -> [u32; 3] {
        flat_grid(meta.m * self.groups as usize, DIRECT_THREADS as u32, limit).0
    }

    /// What the source is written with, for the pipeline key.
    pub fn constants(&self) -> [(&'static str, u32); 3] {
        [
            ("DIRECT_K", self.k),
            ("DIRECT_GROUPS", self.groups),
            ("DIRECT_ROWS", self.rows),
        ]
    }

    /// The direction's kernel, in place of a GEMM core after its parts.
    pub fn core_source(&self) -> String {
        let header: String = self
            .constants()
            .iter()
            .map(|(name, value)| format!("const {name}: u32 = {value}u;\n"))
            .collect();
        let source = match self.direction {
            ConvDirection::DWeight => DWEIGHT,
            _ => FORWARD,
        };
        header + source
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::forward::halo::tests::caps;
    use crate::conv::shape::{ConvParams, Padding};

    fn fit(
        direction: ConvDirection,
        input: [usize; 4],
        params: ConvParams,
    ) -> Result<DirectConv, String> {
        let meta = ConvShapeMeta::new(input, &params).unwrap();
        DirectConv::fit(direction, &meta, &caps(), &ConvTuning::default())
    }

    /// Run M9's first convs: airbench's 2x2x3 -> 24 ran faster direct, the
    /// 3x3x3 -> 32 and -> 64 ones slower; the rule keeps the first alone.
    #[test]
    fn the_rule_takes_the_first_convs_that_ran_faster() {
        let whitening = ConvParams::new(24, 2, Padding::Valid);
        for direction in [ConvDirection::Forward, ConvDirection::DWeight] {
            let taken = fit(direction, [1024, 32, 32, 3], whitening).unwrap();
            assert_eq!((taken.k, taken.groups), (12, 6));
            for c_out in [32, 64] {
                let stem = ConvParams::new(c_out, 3, Padding::Same);
                let why = fit(direction, [256, 32, 32, 3], stem).unwrap_err();
                assert!(why.contains("multiply-adds"), "{why}");
            }
        }
        // Eight input channels load in runs; a 4x4x3 filter's 48 values pass
        // the longest reduction; 6 channels out are not in fours.
        let eight = fit(
            ConvDirection::Forward,
            [8, 8, 8, 8],
            ConvParams::new(8, 1, Padding::Same),
        );
        assert!(eight.unwrap_err().contains("runs"));
        let long = fit(
            ConvDirection::Forward,
            [8, 8, 8, 3],
            ConvParams::new(8, 4, Padding::Same),
        );
        assert!(long.unwrap_err().contains("reduction"));
        let six = fit(
            ConvDirection::Forward,
            [8, 8, 8, 1],
            ConvParams::new(6, 3, Padding::Same),
        );
        assert!(six.unwrap_err().contains("fours"));
        let off = ConvTuning::default().set(DIRECT_ENV, "0").unwrap();
        let meta = ConvShapeMeta::new([8, 8, 8, 3], &whitening).unwrap();
        assert!(DirectConv::fit(ConvDirection::Forward, &meta, &caps(), &off).is_err());
    }
}
