//! The forward conv's halo kernel (shaders/conv/forward/halo.wgsl): for
//! stride-1, undilated convs on the cooperative-matrix variant, MMAs read
//! straight from a staged input tile instead of the GEMM core's im2col
//! staging. This module decides where it applies and writes its WGSL.

use crate::conv::gemm::GEMM_RUN;
use crate::conv::gemm::coop::{const_lines, fill_template, multiply_adds};
use crate::conv::shape::ConvShapeMeta;
use crate::conv::tuning::ConvTuning;
use crate::diagnostics::warn_once;
use crate::gpu::GpuCapabilities;

/// Environment variable for tuning: `0` turns the halo kernel off (the GEMM
/// core runs), `POSITIONSxCHANNEL_TILESxTAPSxSUBGROUPS[xCOLUMNS[xCHUNK]]` (e.g.
/// `256x4x3x16`) pins its block: output positions, output-channel tiles,
/// filter taps staged per step (a divisor of R * S), subgroups, how many
/// columns of subgroups split the channel tiles (default 1: every subgroup
/// takes all of them), and the input channels staged at a time (default: the
/// rule's, 32 where the input has more).
pub const HALO_ENV: &str = "AETHER_FORWARD_HALO";

/// Environment variable for tuning: `K` launches at most K workgroups per
/// compute unit (estimated where the adapter's count is not known), each
/// taking its blocks in turn; `0` one workgroup per block.
pub const GROUPS_ENV: &str = "AETHER_HALO_GROUPS";

/// Environment variable for tuning: `1` stacks the tile's count of images
/// in each position tile, one output position of each (the halo staged
/// image by image at each pixel), wherever a block of whole output rows
/// fits; `0` takes a tile of consecutive positions of one image; unset, the
/// rule: stacked for outputs narrower than a tile (the block of
/// [`Narrow`]), else not.
pub const STACK_ENV: &str = "AETHER_HALO_STACK";

/// Environment variable for tuning: `1` stages every step's taps in one
/// buffer (two barriers a step), `2` in two taken in turn where they fit (one
/// barrier a step, one more a chunk); unset, two where they fit, since one
/// barrier a step fewer was faster (docs/lab/perf-notes.md, entry 83).
pub const TAP_BUFFERS_ENV: &str = "AETHER_HALO_TAP_BUFFERS";

/// Environment variable for tuning: `1` lets the halo kernels take ragged
/// blocks where no block tiles a conv exactly (the forward's and dinput's
/// overlapping at the output's edges, zeros past the input channels;
/// dweight's reaching past the output, its dy zeros there); `0` or unset,
/// only exact blocks. Off by the rule until a device run has timed them
/// against the GEMM core; measured plans time them wherever they fit
/// (docs/lab/perf-notes.md, entry 96).
pub const RAGGED_ENV: &str = "AETHER_HALO_RAGGED";

/// The rule's block for outputs narrower than a tile, where position tiles
/// stack the tile's count of images (one output position of each) and a
/// block is a tile's positions: its channel tiles, taps a step, subgroups and
/// columns of subgroups, one tile of input channels a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Narrow {
    channel_tiles: u32,
    /// Every filter tap in one step, else [`TAPS`] (or a filter row).
    all_taps: bool,
    subgroups: u32,
    columns: u32,
}

impl Narrow {
    /// The forward's: 4 channel tiles over 8 x 2 subgroups, 3 taps a
    /// step (37.6 KiB at tile 16; 32 channels a stage would take 53, and so
    /// would 32 positions). It stages 2.5 input pixels per output where the
    /// GEMM core's im2col stages 9, and was the fastest block swept
    /// (docs/lab/perf-notes.md, entry 82).
    pub const FORWARD: Self = Self {
        channel_tiles: 4,
        all_taps: false,
        subgroups: 16,
        columns: 2,
    };
    /// dinput's transposed conv (more input channels than output ones on the
    /// v1 model's 8x8x64->128 layer): 2 channel tiles over 8 subgroups, all 9
    /// taps a step (41.3 KiB at tile 16), so twice the workgroups of 4-tile
    /// blocks: faster than the GEMM core and than the other blocks swept
    /// (docs/lab/perf-notes.md, entry 86).
    pub const DINPUT: Self = Self {
        channel_tiles: 2,
        all_taps: true,
        subgroups: 8,
        columns: 1,
    };
}

/// Workgroups per compute unit the halo kernels launch at most, where the
/// adapter's count of units is known (else one per block): a workgroup that
/// goes on to its next block fetches that block's halo while it multiplies
/// the last step of the one before, where a fresh workgroup waits for its
/// first halo with nothing to multiply; 2 measured best
/// (docs/lab/perf-notes.md, entry 61). Where that many would
/// leave a workgroup a single block, fewer run, down to one per unit (see
/// [`HaloBlock::grid`]).
pub const GROUPS_PER_UNIT: u32 = 2;

/// The blocks the rule tries, in order: (output positions, output-channel
/// tiles, subgroups, columns of subgroups splitting the channel tiles), the
/// fastest of the sweeps in docs/lab/perf-notes.md, entries 53-58: 256 x 4
/// over 8 x 2 subgroups first, 256 x 2 for outputs of 2 tiles, 128 x 2 over
/// 8 x 1 for adapters with less workgroup memory.
const RULE_BLOCKS: [(usize, u32, u32, u32); 3] = [(256, 4, 16, 2), (256, 2, 16, 2), (128, 2, 8, 1)];
/// Input channels a block stages at a time where the input has more.
const CHANNEL_CHUNK: usize = 32;
/// Filter taps one step stages, where the filter has that many; else one
/// filter row.
const TAPS: usize = 3;
/// Workgroup memory the rule allows a block: the first rule block over 4
/// rows of a 56-wide output takes 41 KiB. (A block staging all 64 input
/// channels of the 64 -> 64 conv at once, 41 KiB at 128 x 2 tiles, only drew
/// level with the GEMM core.)
const RULE_BYTES: usize = 42 * 1024;

/// A block's size: output positions, channel tiles, taps per step,
/// subgroups, columns of subgroups, input channels staged at a time (`None`:
/// the rule's).
type BlockSize = (usize, u32, u32, u32, u32, Option<usize>);

/// The block sizes to try for a filter of `taps` taps in rows of `row`, at
/// `tile` with position tiles of `images` images (`narrow`'s block where
/// they stack): the tuning override, or the rule's, in order.
fn block_sizes(
    taps: usize,
    row: usize,
    tile: u32,
    images: u32,
    narrow: Narrow,
    tuning: &ConvTuning,
) -> std::result::Result<Vec<BlockSize>, String> {
    let Some(text) = tuning.get(HALO_ENV) else {
        let step = if taps.is_multiple_of(TAPS) { TAPS } else { row } as u32;
        if images > 1 {
            let positions = tile as usize;
            return Ok(vec![(
                positions,
                narrow.channel_tiles,
                if narrow.all_taps { taps as u32 } else { step },
                narrow.subgroups,
                narrow.columns,
                Some(positions),
            )]);
        }
        return Ok(RULE_BLOCKS
            .iter()
            .map(|&(positions, tiles, subgroups, columns)| {
                (positions, tiles, step, subgroups, columns, None)
            })
            .collect());
    };
    match parse_block(text) {
        Some(size) => Ok(vec![size]),
        _ if text == "0" => Err(format!("{HALO_ENV}=0")),
        _ => {
            warn_once(
                &format!("halo-env:{text}"),
                &format!(
                    "{HALO_ENV}={text:?} is neither 0 nor \
                     POSITIONSxCHANNEL_TILESxTAPSxSUBGROUPS[xCOLUMNS[xCHUNK]] (e.g. 256x4x3x16): \
                     the forward's halo kernel is off"
                ),
            );
            Err(format!("{HALO_ENV}={text}"))
        }
    }
}

/// The block `text` pins (`POSITIONSxCHANNEL_TILESxTAPSxSUBGROUPS[xCOLUMNS[xCHUNK]]`,
/// every field positive, 1 to 8 channel tiles), or `None`.
fn parse_block(text: &str) -> Option<BlockSize> {
    let fields: Vec<u32> = text
        .split('x')
        .map(|v| v.trim().parse().ok().filter(|&v| v > 0))
        .collect::<Option<_>>()?;
    match fields[..] {
        [positions, tiles, step, subgroups, ref rest @ ..]
            if (1..=8).contains(&tiles) && rest.len() <= 2 =>
        {
            let columns = rest.first().copied().unwrap_or(1);
            let chunk = rest.get(1).map(|&c| c as usize);
            Some((positions as usize, tiles, step, subgroups, columns, chunk))
        }
        _ => None,
    }
}

/// The fewest and the most workgroups a halo kernel launches (where it has
/// blocks for them): one and [`GROUPS_PER_UNIT`] per compute unit where the
/// adapter's count is known; with the tuning override K, K per unit both
/// (estimated where the count is not known); `u32::MAX` both (one workgroup
/// per block) otherwise or with K = 0.
fn group_bounds(caps: &GpuCapabilities, tuning: &ConvTuning) -> [u32; 2] {
    let per_unit = match tuning.get(GROUPS_ENV) {
        None => {
            return caps.known_compute_units().map_or([u32::MAX; 2], |units| {
                [units, GROUPS_PER_UNIT.saturating_mul(units)]
            });
        }
        Some(text) => match text.trim().parse::<u32>() {
            Ok(per_unit) => per_unit,
            Err(_) => {
                warn_once(
                    &format!("halo-groups:{text}"),
                    &format!(
                        "{GROUPS_ENV}={text:?} is not a count of workgroups per compute unit \
                         (e.g. 2, or 0 for one per block): one workgroup per block"
                    ),
                );
                0
            }
        },
    };
    let groups = match per_unit {
        0 => u32::MAX,
        k => k.saturating_mul(caps.estimated_compute_units()),
    };
    [groups; 2]
}

/// Images a position tile stacks at `tile` for `meta`: the tile where the
/// tuning override says `1`, 1 where it says `0`; unset, the tile for an
/// output narrower than a tile, else 1.
fn stacked_images(
    tile: u32,
    meta: &ConvShapeMeta,
    tuning: &ConvTuning,
) -> std::result::Result<u32, String> {
    match tuning.get(STACK_ENV).map(str::trim) {
        None if meta.w_out < tile as usize => Ok(tile),
        None | Some("0") => Ok(1),
        Some("1") => Ok(tile),
        Some(text) => Err(turns_halo_off(STACK_ENV, text, "neither 0 nor 1")),
    }
}

/// Warns once that tuning variable `var` holds `text`, which is `what`, so
/// the halo kernels are off; the reason for the decline.
/// Where a tuning variable pins a block (`pin`: its settings), a warning,
/// once per pin and shape, that the block does not fit `meta` and the GEMM
/// core runs it instead: a sweep must not time the core under a block's label.
pub(crate) fn warn_pin_declined(
    pin: Option<String>,
    kernel: &str,
    meta: &ConvShapeMeta,
    why: &str,
) {
    let Some(pin) = pin else {
        return;
    };
    let shape = format!(
        "{}x{}x{}x{} -> {} ({}x{})",
        meta.n, meta.h, meta.w, meta.c_in, meta.c_out, meta.r, meta.s
    );
    warn_once(
        &format!("pin-declined:{pin}:{kernel}:{shape}"),
        &format!("{pin} does not fit {kernel} on the conv {shape}: {why}; the GEMM core runs it"),
    );
}

/// The settings that pin the forward's halo blocks (a well-formed
/// `AETHER_FORWARD_HALO`, `AETHER_HALO_STACK=1`), or `None`: `0` pins nothing,
/// and malformed values have warned already.
pub(crate) fn forward_pin(tuning: &ConvTuning) -> Option<String> {
    let block = tuning
        .get(HALO_ENV)
        .filter(|v| parse_block(v.trim()).is_some())
        .map(|v| format!("{HALO_ENV}={v}"));
    let stacked = tuning
        .get(STACK_ENV)
        .filter(|v| v.trim() == "1")
        .map(|v| format!("{STACK_ENV}={v}"));
    let pin: Vec<String> = block.into_iter().chain(stacked).collect();
    (!pin.is_empty()).then(|| pin.join(" "))
}

fn turns_halo_off(var: &str, text: &str, what: &str) -> String {
    warn_once(
        &format!("{var}:{text}"),
        &format!("{var}={text:?} is {what}: the halo kernels are off"),
    );
    format!("{var}={text}")
}

/// Whether the tuning lets the halo kernels take ragged blocks
/// ([`RAGGED_ENV`]); a value neither `0` nor `1` warns once and leaves them
/// off.
pub(crate) fn ragged_on(tuning: &ConvTuning) -> bool {
    match tuning.get(RAGGED_ENV).map(str::trim) {
        Some("1") => true,
        None | Some("0") => false,
        Some(text) => {
            warn_once(
                &format!("{RAGGED_ENV}:{text}"),
                &format!("{RAGGED_ENV}={text:?} is neither 0 nor 1: ragged halo blocks stay off"),
            );
            false
        }
    }
}

/// The `(rows, cols)` of a block of whole output rows for position tiles of
/// one position of `tile` stacked images: `positions / width` rows (at least
/// one, a divisor of the height), on a batch of whole stacks.
fn stacked_blocks(
    tile: u32,
    meta: &ConvShapeMeta,
    positions: usize,
) -> std::result::Result<(usize, usize), String> {
    shares_taps(meta)?;
    let rows = positions / meta.w_out;
    if rows == 0 || !meta.h_out.is_multiple_of(rows) || !meta.n.is_multiple_of(tile as usize) {
        return Err(format!(
            "{} images of {}x{} outputs are not whole stacks of {tile} by {positions} positions",
            meta.n, meta.h_out, meta.w_out
        ));
    }
    Ok((rows, meta.w_out))
}

/// `Ok` for a stride-1, undilated conv with more than one filter tap: the
/// kind a halo kernel reads. A 1x1 conv has no taps to share a staged input,
/// and ran slower there than on the GEMM core (docs/lab/perf-notes.md).
pub(crate) fn shares_taps(meta: &ConvShapeMeta) -> std::result::Result<(), String> {
    if (meta.stride_h, meta.stride_w, meta.dil_h, meta.dil_w) != (1, 1, 1, 1) {
        return Err("stride or dilation above 1".into());
    }
    if meta.r * meta.s == 1 {
        return Err("a 1x1 filter".into());
    }
    Ok(())
}

/// The `(rows, cols)` of the forward's block of at most
/// `positions` output positions at `tile`, its tiles split evenly over
/// `row_subgroups`. Where the output's width is a multiple of the tile, the
/// runs of [`whole_blocks`]; else (outputs wider than a tile) whole output
/// rows, whose last tile overlaps the one before it: the two compute the
/// overlapped outputs alike and both store them, so no store leaves the row
/// and none needs a predicate (naga wants matrix stores in uniform control
/// flow).
fn forward_blocks(
    tile: u32,
    meta: &ConvShapeMeta,
    positions: usize,
    row_subgroups: usize,
) -> std::result::Result<(usize, usize), String> {
    let t = tile as usize;
    if meta.w_out.is_multiple_of(t) {
        return whole_blocks(tile, meta, positions);
    }
    shares_taps(meta)?;
    if meta.w_out < t {
        return Err(format!("output {} wide, under a tile", meta.w_out));
    }
    let tiles_w = meta.w_out.div_ceil(t);
    let rows = (1..=meta.h_out).rev().find(|&rows| {
        meta.h_out.is_multiple_of(rows)
            && rows * tiles_w * t <= positions
            && (rows * tiles_w).is_multiple_of(row_subgroups)
    });
    let rows = rows.ok_or_else(|| {
        format!(
            "output {}x{} in no blocks of whole rows of {positions} positions",
            meta.h_out, meta.w_out
        )
    })?;
    Ok((rows, meta.w_out))
}

/// The `(rows, cols)` of a halo kernel's block of about `positions` output
/// positions at `tile`: runs of 2 tiles along a row where the output's width
/// allows, else of 1; or why the shape takes no halo kernel (stride or
/// dilation, a 1x1 filter, or no whole blocks).
pub(crate) fn whole_blocks(
    tile: u32,
    meta: &ConvShapeMeta,
    positions: usize,
) -> std::result::Result<(usize, usize), String> {
    let t = tile as usize;
    shares_taps(meta)?;
    let cols = if meta.w_out.is_multiple_of(2 * t) {
        2 * t
    } else {
        t
    };
    let rows = positions / cols;
    if rows == 0 || !meta.w_out.is_multiple_of(t) || !meta.h_out.is_multiple_of(rows) {
        return Err(format!(
            "output {}x{} is not whole {rows}x{cols} blocks",
            meta.h_out, meta.w_out
        ));
    }
    Ok((rows, cols))
}

/// The least share of a ragged block's computed outputs and multiply-adds
/// that must be the conv's for a halo kernel to take it: on stride-1 3x3
/// convs the halo kernels ran 1.5-2x the GEMM core's TFLOP/s
/// (docs/lab/perf-notes.md, entries 53, 82 and 86), whose own blocks pad
/// such shapes too.
pub(crate) const RAGGED_SHARE: f64 = 2.0 / 3.0;

/// A ragged block's `(rows, cols)` and the share of the output positions
/// it computes that are the output's.
type RaggedPlace = ((usize, usize), f64);

/// The places of a ragged block of at most `positions` output positions
/// (of `images` images a position tile) at `tile`, for outputs that no
/// block tiles exactly, the largest share first, then the most positions:
/// any count of rows up to the height, the last block overlapping the one
/// before it; of whole rows (or runs of tiles along them, as
/// [`whole_blocks`] takes), or, where position tiles stack images, of any
/// width, the last block along a row overlapping too; the position tiles
/// over `row_subgroups` subgroups, the last repeated where they do not
/// split evenly.
fn ragged_places(
    tile: u32,
    meta: &ConvShapeMeta,
    positions: usize,
    images: u32,
    row_subgroups: usize,
) -> std::result::Result<Vec<RaggedPlace>, String> {
    shares_taps(meta)?;
    let t = tile as usize;
    let tile_width = t / images as usize;
    let widths: Vec<usize> = if images > 1 {
        if !meta.n.is_multiple_of(t) {
            return Err(format!("{} images are no whole stacks of {t}", meta.n));
        }
        (1..=meta.w_out).collect()
    } else if meta.w_out.is_multiple_of(2 * t) {
        vec![2 * t]
    } else if meta.w_out.is_multiple_of(t) {
        vec![t]
    } else if meta.w_out > t {
        vec![meta.w_out]
    } else {
        return Err(format!("output {} wide, under a tile", meta.w_out));
    };
    let mut places = Vec::new();
    for cols in widths {
        let tiles_w = cols.div_ceil(tile_width);
        let most_rows = (positions / (tiles_w * tile_width)).min(meta.h_out);
        for rows in 1..=most_rows {
            let subgroup_tiles = (rows * tiles_w).div_ceil(row_subgroups) * row_subgroups;
            let blocks = meta.h_out.div_ceil(rows) * meta.w_out.div_ceil(cols);
            let computed = blocks * subgroup_tiles * tile_width;
            let share = (meta.h_out * meta.w_out) as f64 / computed as f64;
            places.push(((rows, cols), share));
        }
    }
    if places.is_empty() {
        return Err(format!(
            "{}x{} outputs in no blocks of {positions} positions",
            meta.h_out, meta.w_out
        ));
    }
    places
        .sort_by(|((r1, c1), s1), ((r2, c2), s2)| s2.total_cmp(s1).then((r2 * c2).cmp(&(r1 * c1))));
    Ok(places)
}

/// `Ok` where a block of `bytes` of workgroup memory fits the adapter and,
/// unless `pinned` (a tuning override pins the block: the planner's
/// `ConvTuning`, parsed once, never the environment at planning time), the
/// rule's `rule_bytes`.
pub(crate) fn fits_memory(
    bytes: usize,
    caps: &GpuCapabilities,
    rule_bytes: usize,
    pinned: bool,
) -> std::result::Result<(), String> {
    let mut limit = caps.limits.max_compute_workgroup_storage_size as usize;
    if !pinned {
        limit = limit.min(rule_bytes);
    }
    if bytes > limit {
        return Err(format!("{bytes} bytes of workgroup memory"));
    }
    Ok(())
}

/// `Ok` where the adapter runs workgroups of `subgroups` subgroups of one
/// fixed size.
pub(crate) fn runs_subgroups(
    caps: &GpuCapabilities,
    subgroups: u32,
) -> std::result::Result<(), String> {
    let Some((min, max)) = caps.subgroup_size else {
        return Err("no subgroup support".into());
    };
    let limits = &caps.limits;
    let invocations = limits
        .max_compute_invocations_per_workgroup
        .min(limits.max_compute_workgroup_size_x);
    if min != max || subgroups * max > invocations {
        return Err(format!("{subgroups} subgroups of {min}..{max}"));
    }
    Ok(())
}

/// One workgroup's share of the forward: `rows x cols` output positions of
/// one image, or of each of `images` images ([`HaloBlock::tiles_w`] tiles a
/// row), by the output channels of `subgroups[1]` columns of `channel_tiles`
/// tiles, over `subgroups[0] x subgroups[1]` subgroups of `position_tiles x
/// channel_tiles` tiles; with the staged sizes that follow from the filter
/// (written into the WGSL: naga sizes workgroup arrays with constants only,
/// not the shape's override constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HaloBlock {
    pub tile: u32,
    pub rows: u32,
    pub cols: u32,
    pub position_tiles: u32,
    pub channel_tiles: u32,
    /// Subgroups along the positions, along the channels.
    pub subgroups: [u32; 2],
    /// Filter taps one step stages (a divisor of R * S).
    pub taps_per_step: u32,
    /// Input channels staged at a time (a divisor of C_in), and halo rows and
    /// columns: `rows + R - 1`, `cols + S - 1`.
    pub halo: [u32; 3],
    /// Rows of one step's taps: `taps_per_step` times the staged channels.
    pub tap_rows: u32,
    /// Images a position tile stacks: 1 (a tile is `tile` consecutive
    /// positions of one image) or the tile (one position of `tile` images).
    pub images: u32,
    /// Workgroups launched, fewest and most, where there are blocks for them
    /// (each takes blocks as many apart as there are workgroups).
    pub groups: [u32; 2],
    /// Buffers of taps that steps take in turn: 1 (two barriers a step) or 2
    /// (one barrier a step, one more a chunk).
    pub tap_buffers: u32,
    /// The input channels are no multiple of the staged ones: the last stage
    /// holds zeros past them.
    pub pad_channels: bool,
    /// The output channels are no multiple of the block's: a channel tile
    /// past them overlaps the one before it.
    pub clamp_channels: bool,
}

impl HaloBlock {
    /// The first block of the rule's (or the pinned one) that fits `meta` at
    /// `tile`, outputs narrower than a tile taken as `narrow` says; where none
    /// tiles it and the tuning lets them ([`RAGGED_ENV`]), the ragged block
    /// with the largest share of its work the conv's; or why none does (the
    /// GEMM core then runs).
    pub fn fit(
        tile: u32,
        meta: &ConvShapeMeta,
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
        narrow: Narrow,
    ) -> std::result::Result<Self, String> {
        let images = stacked_images(tile, meta, tuning)?;
        let sizes = block_sizes(meta.r * meta.s, meta.s, tile, images, narrow, tuning)?;
        let mut declined = Vec::new();
        for &size in &sizes {
            match Self::fit_size(tile, meta, (caps, tuning), images, size, None) {
                Ok((block, _)) => return Ok(block),
                Err(why) => declined.push(why),
            }
        }
        if !ragged_on(tuning) {
            return Err(declined.join("; "));
        }
        // No block tiles the shape exactly: the ragged block that computes
        // the least beyond the output, in the rule's order where two tie.
        let mut best: Option<(Self, f64)> = None;
        for &size in &sizes {
            let (positions, _, _, subgroups, columns, _) = size;
            let row_subgroups = (subgroups / columns) as usize;
            let places = ragged_places(tile, meta, positions, images, row_subgroups);
            // Why the best place declined, where every place does.
            let mut first_decline = None;
            let fitted = match places {
                Ok(places) => places.into_iter().find_map(|place| {
                    let fit = Self::fit_size(tile, meta, (caps, tuning), images, size, Some(place));
                    fit.map_err(|why| {
                        first_decline.get_or_insert(why);
                    })
                    .ok()
                }),
                Err(why) => {
                    first_decline = Some(why);
                    None
                }
            };
            if fitted.is_none()
                && let Some(why) = first_decline
            {
                declined.push(format!("ragged: {why}"));
            }
            if let Some((block, share)) = fitted
                && best.is_none_or(|(_, most)| share > most)
            {
                best = Some((block, share));
            }
        }
        best.map(|(block, _)| block)
            .ok_or_else(|| declined.join("; "))
    }

    /// The block of `size` for `meta` at `tile` with position tiles of
    /// `images` images and the share of its computed outputs that are the
    /// conv's, or why it does not fit: stride 1, no dilation and a filter
    /// over 1x1, blocks that tile the output (`ragged` `None`: whole blocks
    /// or rows, channel counts that tile, position tiles that split evenly
    /// over the subgroups; else a [`ragged_places`] place, overlapping where
    /// they do not, at least [`RAGGED_SHARE`] of it the conv's), and
    /// workgroup memory and invocations within the adapter's limits.
    fn fit_size(
        tile: u32,
        meta: &ConvShapeMeta,
        (caps, tuning): (&GpuCapabilities, &ConvTuning),
        images: u32,
        (positions, block_tiles, taps_per_step, subgroups, columns, chunk): BlockSize,
        ragged: Option<RaggedPlace>,
    ) -> std::result::Result<(Self, f64), String> {
        let t = tile as usize;
        let block_channels = block_tiles as usize * t;
        let row_subgroups = subgroups / columns;
        if !block_tiles.is_multiple_of(columns) || !subgroups.is_multiple_of(columns) {
            return Err(format!(
                "{block_tiles} channel tiles or {subgroups} subgroups in {columns} columns"
            ));
        }
        let ((rows, cols), position_share) = match ragged {
            None if images > 1 => (stacked_blocks(tile, meta, positions)?, 1.0),
            None => (
                forward_blocks(tile, meta, positions, row_subgroups as usize)?,
                1.0,
            ),
            Some(place) => place,
        };
        let ragged_channels = ragged.is_some()
            && meta.c_in.is_multiple_of(GEMM_RUN)
            && meta.c_out.is_multiple_of(GEMM_RUN)
            && meta.c_out >= t;
        let clamp_channels = !meta.c_out.is_multiple_of(block_channels);
        if !ragged_channels && (!meta.c_in.is_multiple_of(t) || clamp_channels) {
            return Err(format!(
                "channels {} -> {} do not tile by {t} and {block_channels}",
                meta.c_in, meta.c_out
            ));
        }
        if !(meta.r * meta.s).is_multiple_of(taps_per_step as usize) {
            return Err(format!(
                "{taps_per_step} taps a step of {}",
                meta.r * meta.s
            ));
        }
        // Wider inputs are staged 32 channels at a time, so the block stays
        // within the workgroup-memory rule; in a ragged block, input channels
        // no multiple of the tile as many at a time, rounded up to it, the
        // last stage's channels past them zeros.
        let chunk = chunk.unwrap_or(
            if meta.c_in > CHANNEL_CHUNK && meta.c_in.is_multiple_of(CHANNEL_CHUNK) {
                CHANNEL_CHUNK
            } else if ragged_channels && !meta.c_in.is_multiple_of(t) {
                meta.c_in.next_multiple_of(t).min(CHANNEL_CHUNK)
            } else {
                meta.c_in
            },
        );
        let pad_channels = !meta.c_in.is_multiple_of(chunk);
        if !chunk.is_multiple_of(t) || pad_channels && !ragged_channels {
            return Err(format!("{chunk} input channels a stage of {}", meta.c_in));
        }
        let tiles = rows * cols.div_ceil(t / images as usize);
        if ragged.is_none() && !tiles.is_multiple_of(row_subgroups as usize) {
            return Err(format!(
                "{positions} positions in {row_subgroups} subgroups"
            ));
        }
        let share = position_share * meta.c_in as f64 / meta.c_in.next_multiple_of(chunk) as f64
            * meta.c_out as f64
            / meta.c_out.next_multiple_of(block_channels) as f64;
        if share < RAGGED_SHARE {
            return Err(format!(
                "{:.0}% of a ragged block's outputs and channels the conv's",
                share * 100.0
            ));
        }
        let block = Self {
            tile,
            rows: rows as u32,
            cols: cols as u32,
            position_tiles: tiles.div_ceil(row_subgroups as usize) as u32,
            subgroups: [row_subgroups, columns],
            channel_tiles: block_tiles / columns,
            taps_per_step,
            halo: [chunk, rows + meta.r - 1, cols + meta.s - 1].map(|v| v as u32),
            tap_rows: taps_per_step * chunk as u32,
            images,
            groups: group_bounds(caps, tuning),
            tap_buffers: 1,
            pad_channels,
            clamp_channels,
        };
        runs_subgroups(caps, subgroups)?;
        fits_memory(
            block.workgroup_bytes(),
            caps,
            RULE_BYTES,
            tuning.get(HALO_ENV).is_some(),
        )?;
        let block = block.with_tap_buffers(caps, tuning)?;
        let blocks = block.grid(meta)[0];
        if blocks > caps.limits.max_compute_workgroups_per_dimension as usize {
            return Err(format!("{blocks} blocks"));
        }
        Ok((block, share))
    }

    /// Output positions along a row that one position tile covers: the
    /// tile, or 1 where it stacks images.
    fn tile_width(&self) -> u32 {
        self.tile / self.images
    }

    /// Position tiles along a block row: `cols` over the tile's width, or one
    /// more where the last tile overlaps the one before it.
    pub fn tiles_w(&self) -> u32 {
        self.cols.div_ceil(self.tile_width())
    }

    /// Output channels per block.
    fn channels(&self) -> usize {
        (self.subgroups[1] * self.channel_tiles * self.tile) as usize
    }

    /// The halo and the tap buffers, each padded by 8 halves per row.
    pub fn workgroup_bytes(&self) -> usize {
        let [c_in, h, w] = self.halo.map(|v| v as usize);
        let images = self.images as usize;
        let taps = (self.tap_buffers * self.tap_rows) as usize;
        (h * w * images * (c_in + 8) + taps * (self.channels() + 8)) * 2
    }

    /// This block with the tap buffers [`TAP_BUFFERS_ENV`] asks for, or the
    /// rule's: two where they fit the adapter's workgroup memory (beyond the
    /// rule's bytes, which choose the block), else one.
    fn with_tap_buffers(
        self,
        caps: &GpuCapabilities,
        tuning: &ConvTuning,
    ) -> std::result::Result<Self, String> {
        let two = Self {
            tap_buffers: 2,
            ..self
        };
        let fits = two.workgroup_bytes() <= caps.limits.max_compute_workgroup_storage_size as usize;
        match tuning.get(TAP_BUFFERS_ENV).map(str::trim) {
            None | Some("2") if fits => Ok(two),
            None | Some("1") | Some("2") => Ok(self),
            Some(text) => Err(turns_halo_off(TAP_BUFFERS_ENV, text, "neither 1 nor 2")),
        }
    }

    /// Blocks of output positions (each by all of a block's channels).
    pub fn blocks(&self, meta: &ConvShapeMeta) -> usize {
        meta.n / self.images as usize
            * meta.h_out.div_ceil(self.rows as usize)
            * meta.w_out.div_ceil(self.cols as usize)
    }

    /// Workgroups: over the blocks of positions, blocks of channels. A
    /// workgroup takes every n-th block of positions, n the workgroups along
    /// them: as many as fit within `groups` while each takes two blocks, so
    /// its second block's halo is fetched while it multiplies the first
    /// (docs/lab/perf-notes.md, entry 64).
    pub fn grid(&self, meta: &ConvShapeMeta) -> [usize; 3] {
        let blocks = self.blocks(meta);
        let [fewest, most] = self.groups.map(|g| g as usize);
        [
            blocks.div_ceil(2).clamp(fewest, most).min(blocks),
            meta.c_out.div_ceil(self.channels()),
            1,
        ]
    }

    /// The constants forward_halo.wgsl expects, for `subgroup` invocations per
    /// subgroup.
    pub fn constants(&self, subgroup: u32) -> [(&'static str, u32); 16] {
        let [c_in, halo_h, halo_w] = self.halo;
        [
            ("T", self.tile),
            ("SUBGROUP", subgroup),
            ("SG_M", self.subgroups[0]),
            ("SG_N", self.subgroups[1]),
            ("PT", self.position_tiles),
            ("CT", self.channel_tiles),
            ("BH", self.rows),
            ("BW", self.cols),
            ("TILES_W", self.tiles_w()),
            ("TPS", self.taps_per_step),
            ("HALO_C", c_in),
            ("HALO_H", halo_h),
            ("HALO_W", halo_w),
            ("TAP_ROWS", self.tap_rows),
            ("IMAGES", self.images),
            ("TAP_BUFFERS", self.tap_buffers),
        ]
    }

    /// The kernel's WGSL for this block: `template` with the constants and the
    /// generated pieces filled in; the accumulators start from the `bias`
    /// binding where the kernel has one, else from zero.
    pub fn core_source(&self, template: &str, subgroup: u32, bias: Option<&str>) -> String {
        let mat = format!("coop_mat{t}x{t}", t = self.tile);
        let pt = self.position_tiles;
        let ct = self.channel_tiles;
        let tiles = || (0..pt).flat_map(|i| (0..ct).map(move |j| (i, j)));
        let mut decls = String::new();
        for i in 0..pt {
            decls += &format!(
                "    let p_{i} = min(sg_m * PT + {i}u, TILES - 1u);
    let br_{i} = p_{i} / TILES_W;
    let bc_{i} = min((p_{i} % TILES_W) * TW, BW - TW);
"
            );
        }
        for j in 0..ct {
            decls += &format!("    let col_{j} = tile_col(sub_col + {j}u * T);\n");
        }
        // Stride 0: every row of the tile starts as the same T biases.
        let start = |j: u32| match bias {
            Some(bias) => format!("coopLoadT<{mat}<f32, C>>(&{bias}[col_{j}], 0u)"),
            None => format!("{mat}<f32, C>()"),
        };
        for (i, j) in tiles() {
            decls += &format!("    var acc_{i}_{j} = {};\n", start(j));
        }
        let mut step = String::new();
        for i in 0..pt {
            step += &format!(
                "                        let a_{i} = coopLoadT<{mat}<f16, A>>(&halo[((br_{i} + r) * HALO_W + bc_{i} + s) * IMAGES * LDP + c0 / 4u], LDP);\n"
            );
        }
        for j in 0..ct {
            step += &format!(
                "                        let b_{j} = coopLoadT<{mat}<f16, B>>(&taps[tap0 + (tt * HALO_C + c0) * LDW + (sub_col - col0 + {j}u * T) / 4u], LDW);\n"
            );
        }
        step += &multiply_adds(tiles(), "                        ");
        // A tile's rows: consecutive positions, or one position of
        // consecutive images.
        let row_stride = if self.images > 1 {
            "H_OUT * W_OUT * C_OUT"
        } else {
            "C_OUT"
        };
        let mut stores = String::new();
        for (i, j) in tiles() {
            stores += &format!(
                "        coopStoreT(acc_{i}_{j}, &y[((n * H_OUT + oh0 + br_{i}) * W_OUT + ow0 + bc_{i}) * C_OUT + col_{j}], {row_stride});
        acc_{i}_{j} = {};
",
                start(j)
            );
        }
        let flags = format!(
            "const PAD_C: bool = {};\nconst CLAMP_C: bool = {};\n",
            self.pad_channels, self.clamp_channels
        );
        fill_template(
            template,
            const_lines(&self.constants(subgroup)) + &flags,
            &[
                ("tile origins br_i, bc_i and accumulators acc_i_j", decls),
                (
                    "PT loads of A from the halo, CT loads of B from the taps, PT*CT multiply-adds",
                    step,
                ),
                (
                    "per accumulator, coopStore into y, then its start again",
                    stores,
                ),
            ],
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::conv::{ConvParams, Padding};

    const TEMPLATE: &str = include_str!("../../../shaders/conv/forward/halo.wgsl");

    #[test]
    fn every_generated_piece_is_filled_in() {
        let block = HaloBlock {
            tile: 16,
            rows: 4,
            cols: 32,
            position_tiles: 2,
            channel_tiles: 2,
            subgroups: [4, 1],
            taps_per_step: 3,
            halo: [32, 6, 34],
            tap_rows: 96,
            images: 1,
            groups: [u32::MAX; 2],
            tap_buffers: 1,
            pad_channels: false,
            clamp_channels: false,
        };
        let src = block.core_source(TEMPLATE, 32, Some("bias"));
        let marker = |line: &str| line.trim_start().starts_with("// generated:");
        assert!(!src.lines().any(marker), "a marker was left unreplaced");
        assert!(src.contains("acc_1_1 = coopMultiplyAdd(a_1, b_1, acc_1_1);"));
        assert!(!src.contains("acc_2_0"));
        assert!(src.contains("const BW: u32 = 32u;"));
    }

    /// An H200-like adapter: subgroups of 32, 48 KiB of workgroup memory.
    pub(crate) fn caps() -> GpuCapabilities {
        GpuCapabilities {
            adapter_name: "test".into(),
            backend: wgpu::Backend::Vulkan,
            device_type: wgpu::DeviceType::DiscreteGpu,
            driver: String::new(),
            shader_f16: true,
            subgroup_size: Some((32, 32)),
            timestamps: false,
            pipeline_cache: false,
            immediate_bytes: 0,
            coop_matrix: Vec::new(),
            coop_disabled: false,
            limits: wgpu::Limits {
                max_compute_workgroup_storage_size: 48 * 1024,
                max_compute_invocations_per_workgroup: 1024,
                max_compute_workgroup_size_x: 1024,
                ..wgpu::Limits::default()
            },
        }
    }

    /// The rule's workgroup-memory bound gives way to a block pinned in the
    /// planner's tuning (as the measured plans' candidates are), whatever
    /// the environment holds, and never to the device's own limit.
    #[test]
    fn only_a_pinned_block_passes_the_rules_workgroup_memory() {
        let meta =
            ConvShapeMeta::new([2, 32, 32, 64], &ConvParams::new(64, 3, Padding::Same)).unwrap();
        let caps = caps();
        let pinned = ["128x2x3x8x2x64", "128x4x3x8x2x32"]
            .into_iter()
            .find_map(|pin| {
                let tuning = ConvTuning::default().set(HALO_ENV, pin).ok()?;
                let block = HaloBlock::fit(16, &meta, &caps, &tuning, Narrow::FORWARD).ok()?;
                (block.workgroup_bytes() > RULE_BYTES).then_some(block)
            })
            .expect("a pinned block past the rule's workgroup memory");
        let bytes = pinned.workgroup_bytes();
        assert!(fits_memory(bytes, &caps, RULE_BYTES, false).is_err());
        assert!(fits_memory(bytes, &caps, RULE_BYTES, true).is_ok());
        let device = caps.limits.max_compute_workgroup_storage_size as usize;
        assert!(fits_memory(device + 1, &caps, RULE_BYTES, true).is_err());
    }

    #[test]
    fn a_pinned_block_takes_four_to_six_positive_fields() {
        assert_eq!(parse_block("256x4x3x16"), Some((256, 4, 3, 16, 1, None)));
        assert_eq!(parse_block("256x4x3x16x2"), Some((256, 4, 3, 16, 2, None)));
        assert_eq!(
            parse_block("256x4x9x16x2x16"),
            Some((256, 4, 9, 16, 2, Some(16)))
        );
        for bad in [
            "0",
            "256x4x3",
            "256x9x3x16",
            "256x4x3x16x0",
            "256x4x3x16x2x16x1",
            "a",
        ] {
            assert_eq!(parse_block(bad), None, "{bad}");
        }
    }

    #[test]
    fn workgroups_take_turns_over_blocks_where_compute_units_are_known() {
        let meta = |input, c_out| {
            ConvShapeMeta::new(input, &ConvParams::new(c_out, 3, Padding::Same)).unwrap()
        };
        let large = meta([256, 56, 56, 64], 64);
        let conv3 = meta([256, 16, 16, 32], 64);
        // An unknown discrete adapter: one workgroup per block.
        let block =
            HaloBlock::fit(16, &large, &caps(), &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!(block.grid(&large), [block.blocks(&large), 1, 1]);
        // An H200's 132 units: 2 workgroups each over the large shape's
        // 3584 blocks; over the v1 32 -> 64 conv's 256 blocks one each, so
        // that most take two blocks; 8 images' 8 blocks one workgroup each.
        let h200 = GpuCapabilities {
            adapter_name: "NVIDIA H200".into(),
            ..caps()
        };
        let block =
            HaloBlock::fit(16, &large, &h200, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!(
            (block.blocks(&large), block.grid(&large)),
            (3584, [264, 1, 1])
        );
        let block =
            HaloBlock::fit(16, &conv3, &h200, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!(
            (block.blocks(&conv3), block.grid(&conv3)),
            (256, [132, 1, 1])
        );
        let few = meta([8, 16, 16, 32], 64);
        assert_eq!(block.grid(&few), [8, 1, 1]);
    }

    #[test]
    fn v1_layers_take_the_blocks_the_halo_and_taps_fit() {
        let meta = |input, c_out| {
            ConvShapeMeta::new(input, &ConvParams::new(c_out, 3, Padding::Same)).unwrap()
        };
        let caps = caps();
        let conv2 = meta([256, 32, 32, 32], 32);
        let block =
            HaloBlock::fit(16, &conv2, &caps, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!((block.rows, block.cols, block.position_tiles), (8, 32, 2));
        assert_eq!((block.subgroups, block.channel_tiles), ([8, 2], 1));
        // 10 x 34 pixels of 40 halves, two buffers of 3 x 32 tap rows of 40
        // halves (41.6 KiB: over the rule's bytes, within the adapter's).
        assert_eq!(block.tap_buffers, 2);
        assert_eq!(block.workgroup_bytes(), (10 * 34 * 40 + 2 * 96 * 40) * 2);
        assert_eq!(block.grid(&conv2), [256 * 4, 1, 1]);
        // 32 -> 64 at 16 x 16: the first rule block, a whole image by 64
        // channels: 18 x 18 pixels of 40 halves, 3 x 32 tap rows of 72 (a
        // second buffer of taps would pass 48 KiB).
        let conv3 = meta([256, 16, 16, 32], 64);
        let block =
            HaloBlock::fit(16, &conv3, &caps, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!((block.rows, block.cols, block.subgroups), (16, 16, [8, 2]));
        assert_eq!((block.position_tiles, block.channel_tiles), (2, 2));
        assert_eq!(block.tap_buffers, 1);
        assert_eq!(block.workgroup_bytes(), (18 * 18 * 40 + 96 * 72) * 2);
        assert_eq!(block.grid(&conv3), [256, 1, 1]);
        // 64 -> 64 stages 32 input channels at a time: the same sizes.
        let conv4 = meta([256, 16, 16, 64], 64);
        let block =
            HaloBlock::fit(16, &conv4, &caps, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!(block.halo, [32, 18, 18]);
        assert_eq!(block.workgroup_bytes(), (18 * 18 * 40 + 96 * 72) * 2);
        // Where the adapter has less workgroup memory, the last rule block.
        let mut small = caps.clone();
        small.limits.max_compute_workgroup_storage_size = 32 * 1024;
        let block =
            HaloBlock::fit(16, &conv4, &small, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!((block.rows, block.cols, block.channel_tiles), (8, 16, 2));
        assert_eq!(block.workgroup_bytes(), (10 * 18 * 40 + 2 * 96 * 40) * 2);
        // The large bench shape, 56 wide: 4 whole rows a block, tiles from
        // columns 0, 16, 32 and 40; 6 x 58 pixels of 40 halves.
        let large = meta([256, 56, 56, 64], 64);
        let block =
            HaloBlock::fit(16, &large, &caps, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!((block.rows, block.cols, block.tiles_w()), (4, 56, 4));
        assert_eq!(block.workgroup_bytes(), (6 * 58 * 40 + 96 * 72) * 2);
        assert_eq!(block.grid(&large), [256 * 14, 1, 1]);
        // A 1x1 conv shares no taps: the GEMM core runs it.
        let pointwise = ConvShapeMeta::new([1, 64, 64, 64], &ConvParams::new(64, 1, Padding::Same));
        assert!(
            HaloBlock::fit(
                16,
                &pointwise.unwrap(),
                &caps,
                &ConvTuning::default(),
                Narrow::FORWARD
            )
            .is_err()
        );
        // 8 x 8 outputs are narrower than a tile: the forward stacks 16
        // images a tile, 2 rows a block; 4 x 10 pixels of 16 images of 24
        // halves, two buffers of 3 x 16 tap rows of 72; 16 image stacks of 4
        // blocks by 2 of channels. A batch of no whole stacks declines them.
        // Stride 2 has no halo.
        let conv5 = meta([256, 8, 8, 64], 128);
        let block =
            HaloBlock::fit(16, &conv5, &caps, &ConvTuning::default(), Narrow::FORWARD).unwrap();
        assert_eq!((block.images, block.rows, block.cols), (16, 2, 8));
        assert_eq!((block.position_tiles, block.channel_tiles), (2, 2));
        assert_eq!((block.halo, block.tiles_w()), ([16, 4, 10], 8));
        assert_eq!(
            block.workgroup_bytes(),
            (4 * 10 * 16 * 24 + 2 * 48 * 72) * 2
        );
        assert_eq!(block.grid(&conv5), [64, 2, 1]);
        // dinput's transposed conv (128 channels in, 64 out) stacks too, in
        // blocks of 2 channel tiles over 8 subgroups with all 9 taps a step:
        // the same pixels, one buffer of 9 x 16 tap rows of 40 halves.
        let t = crate::conv::dinput::halo::transposed(&conv5).unwrap();
        let block = HaloBlock::fit(16, &t, &caps, &ConvTuning::default(), Narrow::DINPUT).unwrap();
        assert_eq!((block.images, block.rows, block.cols), (16, 2, 8));
        assert_eq!((block.position_tiles, block.channel_tiles), (2, 2));
        assert_eq!((block.taps_per_step, block.subgroups), (9, [8, 1]));
        assert_eq!(block.tap_buffers, 1);
        assert_eq!(
            block.workgroup_bytes(),
            (4 * 10 * 16 * 24 + 9 * 16 * 40) * 2
        );
        assert_eq!(block.grid(&t), [64, 2, 1]);
        let ragged = meta([100, 8, 8, 64], 128);
        assert!(
            HaloBlock::fit(16, &ragged, &caps, &ConvTuning::default(), Narrow::FORWARD).is_err()
        );
        let strided = ConvParams {
            stride: (2, 2),
            ..ConvParams::new(32, 3, Padding::Same)
        };
        let strided = ConvShapeMeta::new([2, 32, 32, 32], &strided).unwrap();
        assert!(
            HaloBlock::fit(16, &strided, &caps, &ConvTuning::default(), Narrow::FORWARD).is_err()
        );
    }

    /// Outputs no block tiles exactly take ragged blocks where most of what
    /// they compute is the conv's (airbench94's convs: 31 x 31 with 24
    /// channels, 15 x 15, 7 x 7), and decline where it would not be (3 x 3
    /// outputs); exact blocks keep their place.
    #[test]
    fn ragged_blocks_fit_odd_outputs_and_channels_and_decline_wasteful_ones() {
        let caps = caps();
        let fit = |input: [usize; 4], c_out: usize, dinput: bool| {
            let meta = ConvShapeMeta::new(input, &ConvParams::new(c_out, 3, Padding::Same));
            let meta = meta.unwrap();
            let tuning = ConvTuning::default().set(RAGGED_ENV, "1").unwrap();
            if dinput {
                let t = crate::conv::dinput::halo::transposed(&meta).unwrap();
                HaloBlock::fit(16, &t, &caps, &tuning, Narrow::DINPUT)
            } else {
                HaloBlock::fit(16, &meta, &caps, &tuning, Narrow::FORWARD)
            }
        };
        // 31 x 31 x 24 -> 64: blocks of 8 whole rows (the fourth from row
        // 23), two tiles a row (the second from column 15); the forward
        // stages 32 input channels, 8 of them zeros; dinput's transposed
        // conv (64 -> 24) in blocks of 32 channels, tiles from 0 and 8.
        let forward = fit([1024, 31, 31, 24], 64, false).unwrap();
        assert_eq!((forward.rows, forward.cols, forward.tiles_w()), (8, 31, 2));
        assert_eq!((forward.halo[0], forward.pad_channels), (32, true));
        assert!(!forward.clamp_channels);
        assert_eq!(
            forward.grid(
                &ConvShapeMeta::new([1024, 31, 31, 24], &ConvParams::new(64, 3, Padding::Same))
                    .unwrap()
            )[1],
            1
        );
        let dinput = fit([1024, 31, 31, 24], 64, true).unwrap();
        assert_eq!((dinput.channels(), dinput.clamp_channels), (32, true));
        assert!(!dinput.pad_channels);
        // 15 x 15 stacks images in blocks of 5 rows by 3 columns (15 tiles
        // over 8 subgroups: the last repeated), 94% of them outputs.
        let stacked = fit([1024, 15, 15, 64], 256, false).unwrap();
        assert_eq!((stacked.images, stacked.rows, stacked.cols), (16, 5, 3));
        assert_eq!((stacked.position_tiles, stacked.subgroups[0]), (2, 8));
        let meta = ConvShapeMeta::new([1024, 15, 15, 64], &ConvParams::new(256, 3, Padding::Same));
        assert_eq!(stacked.blocks(&meta.unwrap()), 64 * 15);
        // 7 x 7: 7 tiles a block over 8 subgroups (87.5%).
        let seven = fit([1024, 7, 7, 256], 256, false).unwrap();
        assert_eq!((seven.rows * seven.cols, seven.position_tiles), (7, 1));
        assert!(fit([1024, 7, 7, 256], 256, true).is_ok());
        // 3 x 3: at most 9 of 16 tiles outputs (56%): the GEMM core.
        let why = fit([1024, 3, 3, 256], 256, false).unwrap_err();
        assert!(why.contains("ragged: 56%"), "{why}");
        // Channels past a run of 8 take no ragged block.
        assert!(fit([64, 16, 16, 20], 64, false).is_err());
        // Only where the tuning lets them.
        let meta = ConvShapeMeta::new([1024, 15, 15, 64], &ConvParams::new(64, 3, Padding::Same));
        let rule = ConvTuning::default();
        let why = HaloBlock::fit(16, &meta.unwrap(), &caps, &rule, Narrow::FORWARD).unwrap_err();
        assert!(!why.contains("ragged"), "{why}");
        // An exact shape keeps the exact block.
        let exact = fit([256, 32, 32, 64], 64, false).unwrap();
        assert_eq!((exact.rows, exact.cols, exact.position_tiles), (8, 32, 2));
        assert!(!exact.pad_channels && !exact.clamp_channels);
    }
}
