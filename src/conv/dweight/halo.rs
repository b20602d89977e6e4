//! dweight's halo kernel (shaders/conv/dweight/halo.wgsl): for stride-1,
//! undilated convs on the cooperative-matrix variant, the weight gradient's
//! MMAs read straight from a staged input tile and dy block, instead of the
//! GEMM core's im2col staging. This module decides where it applies, sizes
//! its split over blocks of positions and writes its WGSL.

use crate::conv::dweight::pinned_split_per_unit;
use crate::conv::forward::halo::{
    RAGGED_SHARE, fits_memory, ragged_on, runs_subgroups, shares_taps, whole_blocks,
};
use crate::conv::gemm::coop::{const_lines, fill_template, multiply_adds};
use crate::conv::shape::ConvShapeMeta;
use crate::conv::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::gpu::GpuCapabilities;

/// Environment variable for tuning: `0` turns dweight's halo kernel off (the
/// GEMM core runs), a number pins the output positions of its blocks.
pub const DWEIGHT_HALO_ENV: &str = "AETHER_DWEIGHT_HALO";

/// Output positions per block: 64 was the fastest of 32-256, and faster than
/// the GEMM core on the v1 model's convs (docs/lab/perf-notes.md, entry 54).
const BLOCK_POSITIONS: usize = 64;
/// Workgroup memory a block may take (64-position blocks take 14-16 KiB).
const RULE_BYTES: usize = 32 * 1024;

/// The output positions per block: the tuning override, or the rule.
fn block_positions(tuning: &ConvTuning) -> std::result::Result<usize, String> {
    let Some(text) = tuning.get(DWEIGHT_HALO_ENV) else {
        return Ok(BLOCK_POSITIONS);
    };
    match text.trim().parse::<usize>() {
        Ok(positions) if positions > 0 => Ok(positions),
        Ok(_) => Err(format!("{DWEIGHT_HALO_ENV}=0")),
        Err(_) => {
            warn_once(
                &format!("dweight-halo-env:{text}"),
                &format!(
                    "{DWEIGHT_HALO_ENV}={text:?} is neither 0 nor a number of positions: \
                     dweight's halo kernel is off"
                ),
            );
            Err(format!("{DWEIGHT_HALO_ENV}={text}"))
        }
    }
}

/// `AETHER_DWEIGHT_HALO=N` where it pins a block of N positions, else `None`.
pub(crate) fn pin(tuning: &ConvTuning) -> Option<String> {
    tuning
        .get(DWEIGHT_HALO_ENV)
        .filter(|v| v.trim().parse::<usize>().is_ok_and(|p| p > 0))
        .map(|v| format!("{DWEIGHT_HALO_ENV}={v}"))
}

/// Chunks of 2 tiles of input by 2 tiles of output channels at `tile`.
fn channel_chunks(tile: u32, meta: &ConvShapeMeta) -> usize {
    let chunk = 2 * tile as usize;
    (meta.c_in / chunk) * (meta.c_out / chunk)
}

/// One workgroup's share: a slice of the blocks of `rows x cols` output
/// positions, for one chunk of 2 tiles of input by 2 tiles of output
/// channels, with one subgroup per filter tap and one for dbias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DWeightHalo {
    pub tile: u32,
    pub rows: u32,
    pub cols: u32,
    /// Filter taps `R * S`, and halo rows and columns (`rows + R - 1`, `cols + S - 1`).
    pub taps: u32,
    pub halo: [u32; 2],
    /// Slices of the blocks (the grid's x): the split-K of the GEMM core.
    pub slices: u32,
    /// The blocks do not tile the output: the last along a row or down an
    /// image reach past it, where dy reads as zeros.
    pub ragged: bool,
}

/// The `(rows, cols)` of a ragged block of `positions` output positions,
/// where no block tiles the output: runs of 2 tiles or of 1 along a row and
/// `positions` over that many rows, the last block along a row and down an
/// image reaching past the output (dy zeros there: a sum must not count a
/// position twice, so blocks do not overlap); the run with the larger share
/// of positions the output's, at least [`RAGGED_SHARE`].
fn ragged_block(
    tile: u32,
    meta: &ConvShapeMeta,
    positions: usize,
) -> std::result::Result<(usize, usize), String> {
    shares_taps(meta)?;
    let t = tile as usize;
    let share = |cols: usize| {
        let rows = (positions / cols).min(meta.h_out);
        let computed = meta.h_out.div_ceil(rows) * rows * meta.w_out.div_ceil(cols) * cols;
        (
            (rows, cols),
            (meta.h_out * meta.w_out) as f64 / computed as f64,
        )
    };
    let best = [2 * t, t]
        .into_iter()
        .filter(|&cols| cols <= positions)
        .map(share)
        .fold(
            None,
            |best: Option<((usize, usize), f64)>, (block, s)| match best {
                Some((_, most)) if most >= s => best,
                _ => Some((block, s)),
            },
        );
    match best {
        Some((block, s)) if s >= RAGGED_SHARE => Ok(block),
        Some((_, s)) => Err(format!("{:.0}% of its positions the output's", s * 100.0)),
        None => Err(format!("{positions} positions under a tile")),
    }
}

impl DWeightHalo {
    /// The block for `meta` at `tile`, with about 2 workgroups per compute
    /// unit (the adapter's estimate), or why the kernel does not apply (the
    /// GEMM core then runs).
    pub fn fit(
        tile: u32,
        meta: &ConvShapeMeta,
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
    ) -> std::result::Result<Self, String> {
        let positions = block_positions(tuning)?;
        let t = tile as usize;
        let ((rows, cols), ragged) = match whole_blocks(tile, meta, positions) {
            Ok(block) => (block, false),
            Err(why) if ragged_on(tuning) => {
                let block = ragged_block(tile, meta, positions)
                    .map_err(|ragged| format!("{why}; ragged: {ragged}"))?;
                (block, true)
            }
            Err(why) => return Err(why),
        };
        if !meta.c_in.is_multiple_of(2 * t) || !meta.c_out.is_multiple_of(2 * t) {
            return Err(format!(
                "channels {} -> {} are not whole chunks of {}",
                meta.c_in,
                meta.c_out,
                2 * t
            ));
        }
        let taps = (meta.r * meta.s) as u32;
        runs_subgroups(caps, taps + 1)?;
        let chunks = channel_chunks(tile, meta);
        let blocks = meta.n * meta.h_out.div_ceil(rows) * meta.w_out.div_ceil(cols);
        let units = caps.estimated_compute_units() as usize;
        let per_unit = pinned_split_per_unit(tuning).unwrap_or(2) as usize;
        let slices = (per_unit * units / chunks).clamp(1, blocks);
        let block = Self {
            tile,
            rows: rows as u32,
            cols: cols as u32,
            taps,
            halo: [rows + meta.r - 1, cols + meta.s - 1].map(|v| v as u32),
            slices: slices as u32,
            ragged,
        };
        fits_memory(
            block.workgroup_bytes(),
            caps,
            RULE_BYTES,
            tuning.get(DWEIGHT_HALO_ENV).is_some(),
        )?;
        Ok(block)
    }

    /// The halo and the dy block (2 tiles of channels plus 8 halves a
    /// pixel) and the dbias subgroup's ones.
    pub fn workgroup_bytes(&self) -> usize {
        let pixel = 2 * self.tile as usize + 8;
        let [h, w] = self.halo.map(|v| v as usize);
        (h * w * pixel + (self.rows * self.cols) as usize * pixel + self.tile as usize) * 2
    }

    /// Rows of each slice's partial sums: the `K` rows of dW, then `C_in`
    /// rows for the dbias subgroups (2 tiles per input-channel chunk).
    pub fn partial_rows(meta: &ConvShapeMeta) -> usize {
        meta.k + meta.c_in
    }

    /// Workgroups: slices of the blocks, chunks of channels.
    pub fn grid(&self, meta: &ConvShapeMeta) -> [u32; 3] {
        [self.slices, channel_chunks(self.tile, meta) as u32, 1]
    }

    /// The constants dweight_halo.wgsl expects.
    pub fn constants(&self, subgroup: u32, meta: &ConvShapeMeta) -> [(&'static str, u32); 8] {
        let [halo_h, halo_w] = self.halo;
        [
            ("T", self.tile),
            ("SUBGROUP", subgroup),
            ("BH", self.rows),
            ("BW", self.cols),
            ("HALO_H", halo_h),
            ("HALO_W", halo_w),
            ("TAPS", self.taps),
            ("BIAS_ROWS", meta.c_in as u32),
        ]
    }

    /// The kernel's WGSL: `template` with the constants and the generated
    /// pieces filled in.
    pub fn core_source(&self, template: &str, subgroup: u32, meta: &ConvShapeMeta) -> String {
        let mat = format!("coop_mat{t}x{t}", t = self.tile);
        let tiles = [(0, 0), (0, 1), (1, 0), (1, 1)];
        let mut decls = String::new();
        let mut step = String::new();
        let mut stores = String::new();
        for (i, j) in tiles {
            decls += &format!("    var acc_{i}_{j} = {mat}<f32, C>();\n");
            stores += &format!(
                "    coopStoreT(acc_{i}_{j}, &partial[out + {i}u * T * C_OUT + {j}u * T], C_OUT);\n"
            );
        }
        for i in 0..2 {
            // The ones are T halves: the dbias subgroup reads them for both tiles.
            step += &format!(
                "            let a_{i} = coopLoad<{mat}<f16, A>>(&halo[a_at + select({i}u * T / 4u, 0u, is_bias)], a_stride);\n"
            );
        }
        for j in 0..2 {
            step += &format!(
                "            let b_{j} = coopLoadT<{mat}<f16, B>>(&dys[p0 * LDP + {j}u * T / 4u], LDP);\n"
            );
        }
        step += &multiply_adds(tiles.into_iter(), "            ");
        fill_template(
            template,
            const_lines(&self.constants(subgroup, meta))
                + &format!("const RAGGED: bool = {};\n", self.ragged),
            &[
                ("accumulators acc_i_j", decls),
                (
                    "2 loads of A (halo, or ones for dbias), 2 of B, 4 multiply-adds",
                    step,
                ),
                ("stores of the 2 x 2 tiles", stores),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::{ConvParams, Padding};

    const TEMPLATE: &str = include_str!("../../../shaders/conv/dweight/halo.wgsl");

    fn meta(input: [usize; 4], c_out: usize) -> ConvShapeMeta {
        ConvShapeMeta::new(input, &ConvParams::new(c_out, 3, Padding::Same)).unwrap()
    }

    #[test]
    fn every_generated_piece_is_filled_in() {
        let m = meta([2, 8, 32, 32], 32);
        let block = DWeightHalo {
            tile: 16,
            rows: 4,
            cols: 32,
            taps: 9,
            halo: [6, 34],
            slices: 4,
            ragged: false,
        };
        let src = block.core_source(TEMPLATE, 32, &m);
        let marker = |line: &str| line.trim_start().starts_with("// generated:");
        assert!(!src.lines().any(marker), "a marker was left unreplaced");
        assert!(src.contains("acc_1_1 = coopMultiplyAdd(a_1, b_1, acc_1_1);"));
        assert!(src.contains("const BIAS_ROWS: u32 = 32u;"));
    }

    #[test]
    fn sizes_follow_the_shape() {
        // An H200: 132 compute units.
        let caps = GpuCapabilities {
            adapter_name: "NVIDIA H200".into(),
            ..crate::conv::forward::halo::tests::caps()
        };
        // The v1 32 -> 32 conv at batch 256: 2 x 32 blocks, one channel chunk.
        let conv2 = meta([256, 32, 32, 32], 32);
        let block = DWeightHalo::fit(16, &conv2, &caps, &ConvTuning::default()).unwrap();
        assert_eq!((block.rows, block.cols, block.slices), (2, 32, 264));
        assert_eq!(block.grid(&conv2), [264, 1, 1]);
        assert_eq!(block.workgroup_bytes(), (4 * 34 * 40 + 64 * 40 + 16) * 2);
        assert_eq!(DWeightHalo::partial_rows(&conv2), 288 + 32);
        // 64 -> 64: four channel chunks share the slices.
        let conv4 = meta([256, 16, 16, 64], 64);
        let block = DWeightHalo::fit(16, &conv4, &caps, &ConvTuning::default()).unwrap();
        assert_eq!(block.grid(&conv4), [66, 4, 1]);
        // 3 input channels are no chunk; 8 x 8 outputs no whole blocks.
        assert!(
            DWeightHalo::fit(
                16,
                &meta([256, 32, 32, 3], 32),
                &caps,
                &ConvTuning::default()
            )
            .is_err()
        );
        assert!(
            DWeightHalo::fit(
                16,
                &meta([256, 8, 8, 64], 128),
                &caps,
                &ConvTuning::default()
            )
            .is_err()
        );
        // A 1x1 conv shares no taps (the 4096^3 GEMM of the conv bench).
        let pointwise = ConvParams::new(4096, 1, Padding::Same);
        let pointwise = ConvShapeMeta::new([1, 64, 64, 4096], &pointwise).unwrap();
        assert!(DWeightHalo::fit(16, &pointwise, &caps, &ConvTuning::default()).is_err());
    }

    /// Where no block tiles the output, ragged blocks reach past it (15 x 15
    /// in 4 x 16 blocks, 88% of their positions the output's; ImageNet's 56
    /// wide in runs of 32), only where `AETHER_HALO_RAGGED=1`, and not where
    /// most of a block would be past the output (7 x 7 at tile 16).
    #[test]
    fn ragged_blocks_reach_past_odd_outputs() {
        let caps = crate::conv::forward::halo::tests::caps();
        let ragged = ConvTuning::default()
            .set(crate::conv::forward::halo::RAGGED_ENV, "1")
            .unwrap();
        let fit = |m: &ConvShapeMeta, t: &ConvTuning| DWeightHalo::fit(16, m, &caps, t);
        let odd = meta([64, 15, 15, 64], 64);
        assert!(fit(&odd, &ConvTuning::default()).is_err());
        let block = fit(&odd, &ragged).unwrap();
        assert_eq!((block.rows, block.cols, block.ragged), (4, 16, true));
        let wide = fit(&meta([8, 56, 56, 64], 64), &ragged).unwrap();
        assert_eq!((wide.rows, wide.cols), (2, 32));
        let why = fit(&meta([64, 7, 7, 64], 64), &ragged).unwrap_err();
        assert!(why.contains("ragged: 38%"), "{why}");
        let exact = fit(&meta([8, 32, 32, 64], 64), &ragged).unwrap();
        assert!(!exact.ragged);
    }
}
