// The forward of a stride-1, undilated conv as cooperative-matrix MMAs read
// straight from a staged input tile (the "halo"), with no im2col staging:
// for T output positions along one output row, tap (r, s) and T input
// channels from c0, the A tile is T consecutive pixels of the halo row
// (br + r), starting at column (bc + s): rows one pixel apart, channels
// contiguous, so one row-major matrix load with the pixel stride. Each input
// value is fetched from global memory once per block (the GEMM core fetches it
// once per tap, R * S times), and the whole reduction needs 1 or 2 barriers
// per step of TPS taps (TAP_BUFFERS, below) instead of 2 per staged step of
// the GEMM core.
//
// A block is BH x BW output positions by BN output channels: whole T-wide
// runs of one image's rows, or, where the width is no multiple of T, whole
// rows of TILES_W tiles, the last overlapping the one before it. Where BH
// does not divide the height, the last block row overlaps the one before it
// too; where C_OUT is no multiple of BN (CLAMP_C), a channel tile that would
// leave the output overlaps the one before it; where the tiles of a block
// do not split evenly over the subgroups, the subgroups past the last tile
// repeat it. Overlapping tiles compute their common outputs alike and both
// store them, so no store leaves the output and none needs a predicate
// (naga wants matrix stores in uniform control flow). A workgroup
// takes blocks wid.x, wid.x + groups.x, ... in turn (the host launches about
// 2 per compute unit where it knows their count, else one per block), so the
// next block's first halo loads while the last step of the one before
// multiplies, and its accumulators go out between the two. Per block and
// chunk of HALO_C input channels it stages the halo, (BH + R - 1) x
// (BW + S - 1) pixels of the chunk's channels (zeros in the padding, and past
// C_IN where the host rounds the staged channels up to the tile, PAD_C); then per
// step of TPS filter taps the TPS * HALO_C x BN slice of the weights ("taps"),
// into one buffer or, where the host finds room (TAP_BUFFERS = 2), two that
// steps take in turn.
// SG_M x SG_N subgroups each own PT position tiles by CT channel tiles; the
// accumulators start from the bias (from zero in dinput's transposed conv,
// dinput_halo.wgsl) and go straight into y (the host only picks this kernel
// where every block lies inside the output). Staged pixels
// and tap rows are padded by 8 halves: 16-byte aligned matrix loads,
// successive rows in different banks. The next step's taps (and, where a
// chunk ends, the next chunk's halo) are fetched from global memory into
// registers while the current step multiplies, so their latency overlaps the
// MMAs, as in the GEMM core.
//
// Where IMAGES is the tile (set by the host), a position tile is one output
// position of IMAGES consecutive images instead: the halo holds each pixel's
// IMAGES images one after another, so the A tile of a tap is IMAGES pixel rows
// one LDP apart as before, and the tile's rows go out H_OUT * W_OUT * C_OUT
// apart in y. This fits outputs narrower than a tile (TW, the positions a tile
// covers along a row, is then 1) and blocks are IMAGES images of whole rows.
//
// Written in by the host (src/conv/forward/halo.rs): T, SUBGROUP, SG_M, SG_N, PT, CT,
// BH, BW, TILES_W, TPS, the staged sizes HALO_C (a divisor of C_IN, or C_IN
// rounded up to the tile), HALO_H, HALO_W and TAP_ROWS (= TPS * HALO_C),
// IMAGES, TAP_BUFFERS, PAD_C, CLAMP_C, and the pieces
// marked `// generated:` (declaring, multiplying and storing the PT x CT
// accumulators, which WGSL cannot hold in an indexable array). The operand
// readers `x_run` / `w_run` come from the conv kernel (src/conv/gemm/mod.rs),
// reading x as f16 or, converting, as f32.

const BN: u32 = SG_N * CT * T;
const TW: u32 = T / IMAGES;
// Position tiles of a block; where SG_M * PT is more, the subgroups past the
// last tile repeat it.
const TILES: u32 = BH * TILES_W;
const THREADS: u32 = SG_M * SG_N * SUBGROUP;
// Pixel and tap-row strides in vec4<f16>, the unit the matrix loads count
// strides in: the channels plus 8 halves of padding.
const LDP: u32 = HALO_C / 4u + 2u;
const LDW: u32 = BN / 4u + 2u;
const HALO_RUNS: u32 = HALO_H * HALO_W * IMAGES * (HALO_C / 8u);
const TAP_RUNS: u32 = TAP_ROWS * (BN / 8u);

const HALO_SLOTS: u32 = (HALO_RUNS + THREADS - 1u) / THREADS;
const TAP_SLOTS: u32 = (TAP_RUNS + THREADS - 1u) / THREADS;

var<workgroup> halo: array<vec4<f16>, HALO_H * HALO_W * IMAGES * LDP>;
var<workgroup> taps: array<vec4<f16>, TAP_BUFFERS * TAP_ROWS * LDW>;

// Reads this thread's runs of the halo of input channels cc.. from global
// memory: slot g / (HALO_C / 8) of the halo (its pixel, then its image),
// channels 8 at a time.
fn fetch_halo(regs: ptr<function, array<Run, HALO_SLOTS>>, n: u32, ih0: i32, iw0: i32, cc: u32, lidx: u32) {
    for (var s = 0u; s < HALO_SLOTS; s++) {
        let g = lidx + s * THREADS;
        let pixel = g / (HALO_C / 8u) / IMAGES;
        let image = g / (HALO_C / 8u) % IMAGES;
        let c = cc + (g % (HALO_C / 8u)) * 8u;
        var run = Run();
        if (g < HALO_RUNS && (!PAD_C || c < C_IN)) {
            run = x_pixel_run(n + image, ih0 + i32(pixel / HALO_W), iw0 + i32(pixel % HALO_W), c);
        }
        (*regs)[s] = run;
    }
}

fn stage_halo(regs: ptr<function, array<Run, HALO_SLOTS>>, lidx: u32) {
    for (var s = 0u; s < HALO_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < HALO_RUNS) {
            let slot = (g / (HALO_C / 8u)) * LDP + (g % (HALO_C / 8u)) * 2u;
            halo[slot] = (*regs)[s][0];
            halo[slot + 1u] = (*regs)[s][1];
        }
    }
}

// The first output channel of the channel tile at `col`: `col`, or, where
// the host clamps channel tiles (CLAMP_C: C_OUT is no multiple of BN), at
// most the last whole tile's, so a tile past the output overlaps the one
// before it instead.
fn tile_col(col: u32) -> u32 {
    if (CLAMP_C) {
        return min(col, C_OUT - T);
    }
    return col;
}

// Reads this thread's runs of one step's taps: row k is filter tap
// step * TPS + k / HALO_C, input channel cc + k % HALO_C (zeros past C_IN
// where the host pads the staged channels, PAD_C); staged column q holds
// output channel tile_col(col0 + q - q % T) + q % T.
fn fetch_taps(regs: ptr<function, array<Run, TAP_SLOTS>>, step: u32, cc: u32, col0: u32, lidx: u32) {
    for (var s = 0u; s < TAP_SLOTS; s++) {
        let g = lidx + s * THREADS;
        let k = g / (BN / 8u);
        let c = cc + k % HALO_C;
        let q = (g % (BN / 8u)) * 8u;
        var run = Run();
        if (g < TAP_RUNS && (!PAD_C || c < C_IN)) {
            let row = (step * TPS + k / HALO_C) * C_IN + c;
            var col = col0 + q;
            if (CLAMP_C) {
                col = tile_col(col - q % T) + q % T;
            }
            run = w_run(i32(row * C_OUT + col));
        }
        (*regs)[s] = run;
    }
}

fn stage_taps(regs: ptr<function, array<Run, TAP_SLOTS>>, tap0: u32, lidx: u32) {
    for (var s = 0u; s < TAP_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < TAP_RUNS) {
            let slot = tap0 + (g / (BN / 8u)) * LDW + (g % (BN / 8u)) * 2u;
            taps[slot] = (*regs)[s][0];
            taps[slot + 1u] = (*regs)[s][1];
        }
    }
}

// Blocks along an output row, down an image and per image (overrides: the
// output's size arrives as override constants). Where BH or BW does not
// divide the output, the last block overlaps the one before it.
override BLOCKS_W: u32 = (W_OUT + BW - 1u) / BW;
override BLOCKS_H: u32 = (H_OUT + BH - 1u) / BH;
override BLOCKS_PER_IMAGE: u32 = BLOCKS_H * BLOCKS_W;

// Block b's (first) image and first output row and column: blocks of an
// image (of IMAGES images) in row-major order, images in turn; a last block
// that would leave the image starts BH rows above its bottom (BW columns
// left of its right edge) instead.
fn block_origin(b: u32) -> vec3<u32> {
    let block = b % BLOCKS_PER_IMAGE;
    let row = min((block / BLOCKS_W) * BH, H_OUT - BH);
    let col = min((block % BLOCKS_W) * BW, W_OUT - BW);
    return vec3<u32>(b / BLOCKS_PER_IMAGE * IMAGES, row, col);
}

fn fetch_block_halo(regs: ptr<function, array<Run, HALO_SLOTS>>, b: u32, cc: u32, lidx: u32) {
    let o = block_origin(b);
    fetch_halo(regs, o.x, i32(o.y) - i32(PAD_TOP), i32(o.z) - i32(PAD_LEFT), cc, lidx);
}

@compute @workgroup_size(THREADS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let col0 = wid.y * BN;
    // This workgroup's blocks: wid.x, wid.x + groups.x, ... (the host
    // launches at most one workgroup per block).
    let blocks = params.n / IMAGES * BLOCKS_PER_IMAGE;
    let mine = (blocks - wid.x + groups.x - 1u) / groups.x;
    // This subgroup's corner: position tiles from sg_m * PT, channel tiles
    // from sg_n * CT. Position tile p covers TW positions (of IMAGES images)
    // of block row p / TILES_W, from block column (p % TILES_W) * TW, or
    // BW - TW for a last tile that would leave the row.
    let sg_m = sg / SG_N;
    let sub_col = col0 + (sg % SG_N) * CT * T;
    // generated: tile origins br_i, bc_i and accumulators acc_i_j
    // Per chunk of HALO_C input channels a block stages the halo, then per
    // step filter taps step * TPS.. of those channels. (The store after each
    // block sits in a loop, not behind a branch on the loop counter: naga
    // takes a branch on a local variable for non-uniform control flow, where
    // matrix operations are not allowed.) With two tap buffers, steps take
    // them in turn, so a step's taps are staged while the step before still
    // reads the other buffer: one barrier a step, plus one a chunk before the
    // halo is overwritten, where one buffer needs two a step.
    let steps = R * S / TPS;
    let chunks = (C_IN + HALO_C - 1u) / HALO_C;
    var halo_regs: array<Run, HALO_SLOTS>;
    var tap_regs: array<Run, TAP_SLOTS>;
    fetch_block_halo(&halo_regs, wid.x, 0u, lidx);
    fetch_taps(&tap_regs, 0u, 0u, col0, lidx);
    for (var blk = 0u; blk < mine; blk++) {
        let b = wid.x + blk * groups.x;
        for (var chunk = 0u; chunk < chunks; chunk++) {
            if (TAP_BUFFERS == 2u) {
                // The previous chunk's halo and taps are read.
                workgroupBarrier();
            }
            stage_halo(&halo_regs, lidx);
            for (var step = 0u; step < steps; step++) {
                let tap0 = step % TAP_BUFFERS * TAP_ROWS * LDW;
                stage_taps(&tap_regs, tap0, lidx);
                workgroupBarrier();
                // The next step's operands (of this block or the next) load
                // while this one multiplies.
                let chunk_ends = step + 1u == steps;
                let last = chunk_ends && chunk + 1u == chunks;
                if (!last || blk + 1u < mine) {
                    let next_chunk = select(chunk + select(0u, 1u, chunk_ends), 0u, last);
                    let cc = next_chunk * HALO_C;
                    fetch_taps(&tap_regs, select(step + 1u, 0u, chunk_ends), cc, col0, lidx);
                    if (chunk_ends) {
                        fetch_block_halo(&halo_regs, select(b, b + groups.x, last), cc, lidx);
                    }
                }
                for (var tt = 0u; tt < TPS; tt++) {
                    let r = (step * TPS + tt) / S;
                    let s = (step * TPS + tt) % S;
                    for (var c0 = 0u; c0 < HALO_C; c0 += T) {
                        // generated: PT loads of A from the halo, CT loads of B from the taps, PT*CT multiply-adds
                    }
                }
                if (TAP_BUFFERS == 1u) {
                    // This step's halo and taps are read.
                    workgroupBarrier();
                }
            }
        }
        let o = block_origin(b);
        let n = o.x;
        let oh0 = o.y;
        let ow0 = o.z;
        // generated: per accumulator, coopStore into y, then its start again
    }
}
