//! The cooperative-matrix GEMM core's block geometry: how many subgroups a
//! workgroup has, how many tiles each owns, how deep a staged step is, and the
//! WGSL written from it (shaders/conv/gemm/coop.wgsl has the rest).

use std::fmt;

use crate::conv::gemm::DirectC;
use crate::conv::plan::ConvDirection;
use crate::conv::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};
use crate::gpu::GpuCapabilities;

/// Environment variable that pins coop GEMMs to one block, for tuning:
/// `SG_MxSG_NxTMxTNxKT` (e.g. `2x2x2x2x2`) for every direction, or a list of
/// `direction=block` (e.g. `dweight=2x1x2x2x4,forward=4x2x4x2x2`) where the
/// directions not named keep the rule.
pub const BLOCK_ENV: &str = "AETHER_COOP_BLOCK";

/// A workgroup of `subgroups[0] x subgroups[1]` subgroups, each computing
/// `tiles[0] x tiles[1]` tiles of `tile x tile`, staging `k_tiles` tiles of the
/// reduction per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopBlock {
    pub tile: u32,
    pub subgroups: [u32; 2],
    pub tiles: [u32; 2],
    pub k_tiles: u32,
}

impl fmt::Display for CoopBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [sm, sn] = self.subgroups;
        let [tm, tn] = self.tiles;
        write!(f, "{sm}x{sn}x{tm}x{tn}x{}", self.k_tiles)
    }
}

impl CoopBlock {
    /// Output rows, output columns and reduction depth per workgroup step.
    pub fn dims(&self) -> (u32, u32, u32) {
        (
            self.subgroups[0] * self.tiles[0] * self.tile,
            self.subgroups[1] * self.tiles[1] * self.tile,
            self.k_tiles * self.tile,
        )
    }

    fn subgroup_count(&self) -> u32 {
        self.subgroups[0] * self.subgroups[1]
    }

    /// Workgroup memory the core declares at most (see coop_gemm.wgsl: A and
    /// B slices padded by 8 halves along their run axis, for the larger
    /// padding of either run axis; with `scratch`, one f32 scratch tile per
    /// subgroup, which the core leaves out where tiles go straight into C).
    pub fn workgroup_bytes(&self, scratch: bool) -> u32 {
        let (bm, bn, bk) = self.dims();
        let t = self.tile;
        let padded = |rows: u32, cols: u32| rows * cols + 8 * rows.max(cols);
        let scratch_bytes = if scratch {
            self.subgroup_count() * t * (t + 4) * 4
        } else {
            0
        };
        (padded(bm, bk) + padded(bk, bn)) * 2 + scratch_bytes
    }

    /// Whether the core stores C's tiles straight into it: C is one span
    /// (`direct_span`, its `[rows, cols]`) that whole blocks tile.
    pub fn stores_directly(&self, direct_span: Option<[usize; 2]>) -> bool {
        let (bm, bn, _) = self.dims();
        direct_span.is_some_and(|[rows, cols]| {
            rows.is_multiple_of(bm as usize) && cols.is_multiple_of(bn as usize)
        })
    }

    /// Whether this block runs on the adapter: a fixed subgroup size, the
    /// invocation and workgroup-memory limits (with `scratch` tiles or not),
    /// and groups of 8 that tile the staged slices exactly.
    pub fn fits(&self, caps: &GpuCapabilities, scratch: bool) -> std::result::Result<(), String> {
        let Some((min, max)) = caps.subgroup_size else {
            return Err("no subgroup support".into());
        };
        if min != max {
            return Err(format!("subgroup size varies ({min}..{max})"));
        }
        let (bm, bn, bk) = self.dims();
        let threads = self.subgroup_count() * max;
        let limits = &caps.limits;
        if threads
            > limits
                .max_compute_invocations_per_workgroup
                .min(limits.max_compute_workgroup_size_x)
        {
            return Err(format!("block {self}: {threads} invocations per workgroup"));
        }
        let bytes = self.workgroup_bytes(scratch);
        if bytes > caps.limits.max_compute_workgroup_storage_size {
            return Err(format!("block {self}: {bytes} bytes of workgroup memory"));
        }
        if bm % 8 != 0 || bn % 8 != 0 || bk % 8 != 0 {
            return Err(format!("block {self}: sides must be multiples of 8"));
        }
        Ok(())
    }

    /// The block for `direction`'s GEMM of `rows x cols` outputs over a
    /// reduction `depth` deep at `tile` on this adapter: the tuning
    /// override when set, else the first of the rule's blocks that fits; an
    /// error (the coop variant declines) when none does. `direct_span` is C's
    /// `[rows, cols]` where the kernel stores tiles straight into it (see
    /// [`Self::stores_directly`]): blocks that do so need no scratch tiles.
    pub fn choose(
        tile: u32,
        direction: ConvDirection,
        [rows, cols, depth]: [usize; 3],
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
        direct_span: Option<[usize; 2]>,
    ) -> Result<Self> {
        let pinned = match tuning.get(BLOCK_ENV) {
            Some(text) => Self::from_env(tile, direction, text).ok_or(AetherError::InvalidEnv {
                var: BLOCK_ENV,
                value: text.to_owned(),
                expected: "SG_MxSG_NxTMxTNxKT, each 1..=8 (e.g. 2x2x2x2x2), or \
                           direction=block pairs (e.g. dweight=2x1x2x2x4,forward=4x2x4x2x2)",
            })?,
            None => None,
        };
        let candidates = match pinned {
            Some(block) => vec![block],
            None => Self::preferred(tile, direction, [rows, cols, depth], direct_span),
        };
        let mut reasons = Vec::new();
        for block in candidates {
            match block.fits(caps, !block.stores_directly(direct_span)) {
                Ok(()) if reasons.is_empty() => return Ok(block),
                Ok(()) => {
                    warn_once(
                        &format!("coop-block:{direction:?}:{}", reasons.join(";")),
                        &format!(
                            "{direction:?} conv on {:?}: coop block {block} instead of the \
                             preferred one, which does not fit: {}",
                            caps.adapter_name,
                            reasons.join("; ")
                        ),
                    );
                    return Ok(block);
                }
                Err(reason) => reasons.push(reason),
            }
        }
        Err(AetherError::InvalidShape {
            op: "conv coop block",
            shape: vec![tile as usize],
            reason: reasons.join("; "),
        })
    }

    /// The blocks for `direction`'s `rows x cols` GEMM over a reduction
    /// `depth` deep, best first: the measured rule, then smaller ones for
    /// adapters with less workgroup memory or fewer invocations.
    /// `direct_span` as for [`Self::choose`].
    fn preferred(
        tile: u32,
        direction: ConvDirection,
        [rows, cols, depth]: [usize; 3],
        direct_span: Option<[usize; 2]>,
    ) -> Vec<Self> {
        let block = |subgroups, tiles, k_tiles| Self {
            tile,
            subgroups,
            tiles,
            k_tiles,
        };
        // The fastest blocks of the sweeps in docs/lab/perf-notes.md (entries
        // 13, 16, 20, 62, 74 and 83): tall forward and dinput GEMMs take 16
        // subgroups of 2x1 or 2x2 tiles, 128 x 128 where 256-row blocks would
        // leave part of the GPU idle; dweight (a few hundred rows, a long split
        // reduction) 128 rows by its output width. GEMMs at most 64 wide take
        // 128 x 64 blocks with a 64-deep step. GEMMs at least 256 wide: the
        // forward 256 x 128 over 16 subgroups of 4x2 tiles where it stores
        // straight into C (too big with scratch tiles), else 128 x 128 like
        // dinput; dweight 64 x 128 over 8 subgroups. A narrow forward with one
        // 32-deep step (the first layer's 27 taps) and a dweight of at most 32
        // rows take blocks half as tall, which keeps more of the GPU busy.
        let t = tile as usize;
        let narrow = cols <= 2 * t;
        let wide = cols >= 16 * t;
        let tall = rows >= 2048 * t;
        let rule = match direction {
            ConvDirection::Forward if narrow && depth <= 2 * t => block([8, 2], [1, 1], 2),
            ConvDirection::Forward | ConvDirection::DInput if narrow => block([8, 2], [2, 1], 2),
            ConvDirection::Forward if wide => {
                // 4x2 tiles a subgroup, not 2x4: faster without naga's index
                // clamping (docs/lab/perf-notes.md, entry 83).
                let sixteen_subgroups = block([4, 4], [4, 2], 2);
                if sixteen_subgroups.stores_directly(direct_span) {
                    sixteen_subgroups
                } else {
                    block([4, 4], [2, 2], 2)
                }
            }
            ConvDirection::Forward | ConvDirection::DInput if tall && cols <= 4 * t => {
                block([8, 2], [2, 2], 2)
            }
            ConvDirection::Forward | ConvDirection::DInput if cols <= 4 * t => {
                block([4, 4], [2, 1], 4)
            }
            ConvDirection::Forward | ConvDirection::DInput => block([4, 4], [2, 2], 2),
            ConvDirection::DWeight if narrow && rows <= 2 * t => block([2, 2], [1, 1], 2),
            ConvDirection::DWeight if narrow && rows <= 4 * t => block([2, 2], [2, 1], 2),
            ConvDirection::DWeight if narrow => block([4, 2], [2, 1], 2),
            ConvDirection::DWeight if wide => block([2, 4], [2, 2], 2),
            ConvDirection::DWeight if cols <= 4 * t => block([4, 2], [2, 2], 2),
            ConvDirection::DWeight => block([2, 4], [2, 2], 2),
        };
        vec![
            rule,
            block([4, 2], [4, 2], 2),
            block([2, 2], [2, 2], 2),
            block([2, 2], [1, 1], 1),
        ]
    }

    /// The block `text` pins for `direction`: `Some(None)` where it names
    /// other directions only, `None` where it does not parse.
    fn from_env(tile: u32, direction: ConvDirection, text: &str) -> Option<Option<Self>> {
        if !text.contains('=') {
            return Self::parse(tile, text).map(Some);
        }
        let mut pinned = None;
        for pair in text.split(',') {
            let (name, block) = pair.split_once('=')?;
            let named = match name.trim() {
                "forward" => ConvDirection::Forward,
                "dweight" => ConvDirection::DWeight,
                "dinput" => ConvDirection::DInput,
                _ => return None,
            };
            let block = Self::parse(tile, block)?;
            if named == direction {
                pinned = Some(block);
            }
        }
        Some(pinned)
    }

    fn parse(tile: u32, text: &str) -> Option<Self> {
        let parsed: Vec<u32> = text
            .split('x')
            .map(|p| p.trim().parse().ok().filter(|v| (1..=8).contains(v)))
            .collect::<Option<_>>()?;
        match parsed[..] {
            [sm, sn, tm, tn, kt] => Some(Self {
                tile,
                subgroups: [sm, sn],
                tiles: [tm, tn],
                k_tiles: kt,
            }),
            _ => None,
        }
    }

    /// The constants coop_gemm.wgsl expects, for `subgroup` invocations per subgroup.
    pub fn constants(&self, subgroup: u32) -> [(&'static str, u32); 7] {
        [
            ("T", self.tile),
            ("SUBGROUP", subgroup),
            ("SG_M", self.subgroups[0]),
            ("SG_N", self.subgroups[1]),
            ("TM", self.tiles[0]),
            ("TN", self.tiles[1]),
            ("KT", self.k_tiles),
        ]
    }

    /// The core's WGSL for this block: `template` with the constants and the
    /// generated pieces filled in. `runs_along_k` says, for A and B, whether the
    /// kernel's runs go along the reduction (see coop_gemm.wgsl), which picks
    /// the staged layout and so the matrix loads' row or column order.
    /// `direct_c`, where every block of the shape lies wholly inside C, has
    /// the core store each accumulator tile straight into C (starting from
    /// the bias, if any), with no scratch tile and no barrier.
    pub(crate) fn core_source(
        &self,
        template: &str,
        subgroup: u32,
        runs_along_k: [bool; 2],
        direct_c: Option<&DirectC>,
    ) -> String {
        let t = self.tile;
        let mat = format!("coop_mat{t}x{t}");
        let [tm, tn] = self.tiles;
        let tiles = || (0..tm).flat_map(move |i| (0..tn).map(move |j| (i, j)));
        let mut consts = const_lines(&self.constants(subgroup));
        let [a_along_k, b_along_k] = runs_along_k;
        consts += &format!("const A_RUNS_ALONG_K: bool = {a_along_k};\n");
        consts += &format!("const B_RUNS_ALONG_K: bool = {b_along_k};\n");
        consts += &format!("const C_VIA_SCRATCH: bool = {};\n", direct_c.is_none());
        // A staged [BM][BK] is row-major for the A tile, [BK][BM] column-major;
        // B staged [BK][BN] is row-major for the B tile, [BN][BK] column-major.
        let load = |row_major: bool| if row_major { "coopLoadT" } else { "coopLoad" };
        let (load_a, load_b) = (load(a_along_k), load(!b_along_k));
        let mut decls = String::new();
        let mut step = String::new();
        let mut stores = String::new();
        let tile_row = |i| format!("row0 + sub_row + {i}u * T");
        let tile_col = |j| format!("col0 + sub_col + {j}u * T");
        for (i, j) in tiles() {
            decls += &match direct_c.and_then(|direct| direct.bias) {
                // Stride 0: every row of the tile starts as the same T biases.
                Some(bias) => format!(
                    "    var acc_{i}_{j} = coopLoadT<{mat}<f32, C>>(&{bias}[{}], 0u);\n",
                    tile_col(j)
                ),
                None => format!("    var acc_{i}_{j} = {mat}<f32, C>();\n"),
            };
        }
        for i in 0..tm {
            step += &format!(
                "            let a_{i} = {load_a}<{mat}<f16, A>>(&stage_a[a_slot(sub_row + {i}u * T, kk)], LDA);\n"
            );
        }
        for j in 0..tn {
            step += &format!(
                "            let b_{j} = {load_b}<{mat}<f16, B>>(&stage_b[b_slot(kk, sub_col + {j}u * T)], LDB);\n"
            );
        }
        step += &multiply_adds(tiles(), "            ");
        for (i, j) in tiles() {
            let (row, col) = (tile_row(i), tile_col(j));
            stores += &match direct_c {
                Some(direct) => format!(
                    "    coopStoreT(acc_{i}_{j}, &{c}[c_index(z, {row}, {col})], c_row_stride());\n",
                    c = direct.c
                ),
                None => format!(
                    "    coopStoreT(acc_{i}_{j}, &stage_c[scratch], LDC);
    workgroupBarrier();
    store_tile(z, {row}, {col}, rows, cols, scratch, lane);
    workgroupBarrier();
"
                ),
            };
        }
        fill_template(
            template,
            consts,
            &[
                ("accumulators acc_i_j", decls),
                ("TM loads of A, TN loads of B, TM*TN multiply-adds", step),
                (
                    "per tile, coopStore into C, or into scratch, barrier, store_tile, barrier",
                    stores,
                ),
            ],
        )
    }
}

/// `const NAME: u32 = value;` lines for the constants a template expects.
pub(crate) fn const_lines(constants: &[(&str, u32)]) -> String {
    constants
        .iter()
        .map(|(name, value)| format!("const {name}: u32 = {value}u;\n"))
        .collect()
}

/// `acc_i_j = coopMultiplyAdd(a_i, b_j, acc_i_j);` for every tile, at `indent`.
pub(crate) fn multiply_adds(tiles: impl Iterator<Item = (u32, u32)>, indent: &str) -> String {
    tiles
        .map(|(i, j)| {
            format!("{indent}acc_{i}_{j} = coopMultiplyAdd(a_{i}, b_{j}, acc_{i}_{j});\n")
        })
        .collect()
}

/// A generated kernel's WGSL: `header` (its constants), then `template` with
/// each line `// generated: NAME` replaced by the piece named NAME. Every
/// piece must have its marker: a mismatch is a bug in this crate, caught by
/// debug builds (the tests); in a release build the WGSL then fails to
/// compile, which the pipeline cache announces like any compile failure.
pub(crate) fn fill_template(template: &str, header: String, pieces: &[(&str, String)]) -> String {
    let mut out = header;
    let mut used = 0;
    for line in template.lines() {
        let marker = line.trim_start().strip_prefix("// generated: ");
        match marker.and_then(|name| pieces.iter().find(|(piece, _)| *piece == name)) {
            Some((_, piece)) => {
                out += piece;
                used += 1;
            }
            None => {
                out += line;
                out.push('\n');
            }
        }
    }
    debug_assert_eq!(used, pieces.len(), "a generated piece lost its marker");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = include_str!("../../../shaders/conv/gemm/coop.wgsl");

    #[test]
    fn every_generated_piece_is_filled_in() {
        let block = CoopBlock {
            tile: 16,
            subgroups: [2, 1],
            tiles: [3, 2],
            k_tiles: 2,
        };
        let src = block.core_source(TEMPLATE, 32, [false, false], None);
        let marker = |line: &str| line.trim_start().starts_with("// generated:");
        assert!(!src.lines().any(marker), "a marker was left unreplaced");
        assert!(src.contains("var acc_2_1 = coop_mat16x16<f32, C>();"));
        assert!(src.contains("acc_2_1 = coopMultiplyAdd(a_2, b_1, acc_2_1);"));
        assert!(!src.contains("acc_3_0"));
        assert!(src.contains("const TM: u32 = 3u;"));
        // A's runs go along M: staged [BK][BM], so its tiles load column-major.
        assert!(src.contains("let a_2 = coopLoad<coop_mat16x16<f16, A>>(&stage_a[a_slot("));
        assert!(src.contains("let b_1 = coopLoadT<coop_mat16x16<f16, B>>(&stage_b[b_slot("));
    }

    #[test]
    fn whole_blocks_go_straight_into_c_from_the_bias() {
        let block = CoopBlock {
            tile: 16,
            subgroups: [2, 1],
            tiles: [1, 2],
            k_tiles: 2,
        };
        let direct = DirectC {
            c: "y",
            bias: Some("bias"),
            span: |_, _| None,
        };
        let src = block.core_source(TEMPLATE, 32, [true, false], Some(&direct));
        assert!(src.contains("const C_VIA_SCRATCH: bool = false;"));
        assert!(src.contains(
            "var acc_0_1 = coopLoadT<coop_mat16x16<f32, C>>(&bias[col0 + sub_col + 1u * T], 0u);"
        ));
        assert!(src.contains(
            "coopStoreT(acc_0_1, &y[c_index(z, row0 + sub_row + 0u * T, col0 + sub_col + 1u * T)], c_row_stride());"
        ));
        assert!(
            !src.contains("store_tile(z,"),
            "no tile goes through scratch"
        );
        let scratch = block.core_source(TEMPLATE, 32, [true, false], None);
        assert!(scratch.contains("const C_VIA_SCRATCH: bool = true;"));
        assert!(!scratch.contains("&bias["));
    }

    #[test]
    fn workgroup_bytes_counts_padding_and_scratch() {
        let block = CoopBlock {
            tile: 16,
            subgroups: [2, 2],
            tiles: [2, 2],
            k_tiles: 2,
        };
        // A 64 x 32 and B 32 x 64 halves, each padded by 8 halves per row of
        // the longer run axis (64), and 4 scratch tiles of 16 x 20 f32.
        let staged = (64 * 40 + 32 * 80) * 2;
        assert_eq!(block.workgroup_bytes(true), staged + 4 * 16 * 20 * 4);
        assert_eq!(block.workgroup_bytes(false), staged);
    }

    #[test]
    fn blocks_storing_straight_into_c_need_no_scratch_room() {
        let caps = crate::conv::forward::halo::tests::caps();
        // 16 subgroups of 4x2 tiles: 30 KiB staged, 20 KiB more of scratch.
        let big = CoopBlock {
            tile: 16,
            subgroups: [4, 4],
            tiles: [4, 2],
            k_tiles: 2,
        };
        assert!(big.fits(&caps, false).is_ok());
        let too_big = big.fits(&caps, true).unwrap_err();
        assert!(too_big.contains("51200 bytes"), "{too_big}");
        assert!(big.stores_directly(Some([4096, 4096])));
        assert!(!big.stores_directly(Some([4096 + 16, 4096])));
        assert!(!big.stores_directly(None));
        // The wide forward takes it only where it stores directly.
        let wide = |direct_span| {
            CoopBlock::choose(
                16,
                ConvDirection::Forward,
                [4096, 4096, 4096],
                &caps,
                &ConvTuning::default(),
                direct_span,
            )
        };
        assert_eq!(wide(Some([4096, 4096])).unwrap(), big);
        assert_eq!(wide(None).unwrap().dims(), (128, 128, 32));
    }

    #[test]
    fn the_tuning_override_pins_named_directions_only() {
        let dweight = CoopBlock::from_env(
            16,
            ConvDirection::DWeight,
            "dweight=2x1x2x2x4,forward=4x2x4x2x2",
        );
        let block = dweight.expect("parses").expect("dweight named");
        assert_eq!(
            (block.subgroups, block.tiles, block.k_tiles),
            ([2, 1], [2, 2], 4)
        );
        assert_eq!(
            CoopBlock::from_env(16, ConvDirection::DInput, "dweight=2x1x2x2x4"),
            Some(None)
        );
        let all = CoopBlock::from_env(8, ConvDirection::DInput, "1x2x3x4x5")
            .unwrap()
            .unwrap();
        assert_eq!(
            (all.tile, all.subgroups, all.tiles, all.k_tiles),
            (8, [1, 2], [3, 4], 5)
        );
        for bad in ["2x2x2x2", "dw=2x2x2x2x2", "forward=2x2x0x2x2", "9x1x1x1x1"] {
            assert_eq!(
                CoopBlock::from_env(16, ConvDirection::Forward, bad),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn the_rule_follows_the_gemm_shape() {
        let first = |direction, rows, cols| {
            // Deeper than one step, as all but the first layer's forward.
            let depth = 288;
            CoopBlock::preferred(16, direction, [rows, cols, depth], Some([rows, cols]))[0]
        };
        // The v1 model's layers at batch 256, and the 4096^3 GEMM.
        assert_eq!(
            first(ConvDirection::Forward, 262_144, 32).dims(),
            (256, 32, 32)
        );
        // The first layer: its 27 taps are one step.
        let conv0 = CoopBlock::preferred(16, ConvDirection::Forward, [262_144, 32, 27], None);
        assert_eq!(conv0[0].dims(), (128, 32, 32));
        assert_eq!(
            first(ConvDirection::DInput, 65_536, 24).dims(),
            (256, 32, 32)
        );
        assert_eq!(
            first(ConvDirection::Forward, 65_536, 64).dims(),
            (256, 64, 32)
        );
        assert_eq!(
            first(ConvDirection::DInput, 16_384, 64).dims(),
            (128, 64, 64)
        );
        assert_eq!(
            first(ConvDirection::Forward, 16_384, 128).dims(),
            (128, 128, 32)
        );
        assert_eq!(
            first(ConvDirection::Forward, 4096, 4096).dims(),
            (256, 128, 32)
        );
        assert_eq!(
            first(ConvDirection::DInput, 4096, 4096).dims(),
            (128, 128, 32)
        );
        // Through scratch, the wide forward's block would not fit 48 KiB.
        let through_scratch =
            CoopBlock::preferred(16, ConvDirection::Forward, [4096, 4096, 4096], None);
        assert_eq!(through_scratch[0].dims(), (128, 128, 32));
        assert_eq!(first(ConvDirection::DWeight, 28, 32).dims(), (32, 32, 32));
        assert_eq!(first(ConvDirection::DWeight, 40, 32).dims(), (64, 32, 32));
        assert_eq!(first(ConvDirection::DWeight, 289, 32).dims(), (128, 32, 32));
        assert_eq!(first(ConvDirection::DWeight, 577, 64).dims(), (128, 64, 32));
        assert_eq!(
            first(ConvDirection::DWeight, 577, 128).dims(),
            (64, 128, 32)
        );
        assert_eq!(
            first(ConvDirection::DWeight, 4096, 4096).dims(),
            (64, 128, 32)
        );
        // Every list ends in blocks of at most 256 invocations for smaller adapters.
        let fallback = CoopBlock::preferred(16, ConvDirection::Forward, [1, 1, 1], None);
        assert!(fallback[1..].iter().all(|b| b.subgroup_count() * 32 <= 256));
    }
}
