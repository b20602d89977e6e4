// dweight, pass 1, for a stride-1 undilated conv: the halo kernel's way
// (forward_halo.wgsl) applied to the weight gradient. For a block of output
// positions, dW[(r, s), ci, co] += sum over the positions p of
// x[p + (r, s), ci] * dy[p, co]: the A tile (T input channels x T positions
// along one output row) is T consecutive halo pixels read column-major, one
// pixel stride apart, and the B tile is T positions of the staged dy block.
// Each input value is fetched once per block instead of once per tap.
//
// Workgroup (z, y): slice z of the blocks of output positions (blocks z,
// z + SLICES, ...; SLICES = the grid's x) and channel chunk y: input channels
// ci0 .. ci0 + CB by output channels co0 .. co0 + CB (CB = 2 tiles). One
// subgroup per filter tap owns that tap's 2 x 2 tiles; subgroup R * S
// multiplies a tile of ones by dy, so every row of its tiles is a dbias sum.
// Per block: stage the halo (BH + R - 1) x (BW + S - 1) pixels of CB channels
// and the BH * BW x CB dy block, barrier, multiply, barrier; the next block's
// halo and dy are fetched into registers while this one multiplies. Partial
// sums go to [z][K + BIAS_ROWS][C_OUT]: rows of dW as the GEMM core writes
// them, then the dbias subgroups' tiles, 2 tiles of rows per input-channel
// chunk (every matrix store is unconditional: naga wants them in uniform
// control flow), of which dweight_reduce.wgsl reads row K.
//
// Written in by the host (src/conv/dweight/halo.rs): T, SUBGROUP, BH, BW, HALO_H,
// HALO_W, TAPS (= R * S), BIAS_ROWS, RAGGED, and the pieces marked `// generated:`.

const CB: u32 = 2u * T;
const THREADS: u32 = (TAPS + 1u) * SUBGROUP;
// Pixel and position strides in vec4<f16>: the chunk's channels plus 8 halves.
const LDP: u32 = CB / 4u + 2u;
const HALO_RUNS: u32 = HALO_H * HALO_W * (CB / 8u);
const DY_RUNS: u32 = BH * BW * (CB / 8u);
// After the halo: T halves of ones, the dbias subgroup's A tile (stride 0).
const ONES: u32 = HALO_H * HALO_W * LDP;

const HALO_SLOTS: u32 = (HALO_RUNS + THREADS - 1u) / THREADS;
const DY_SLOTS: u32 = (DY_RUNS + THREADS - 1u) / THREADS;

var<workgroup> halo: array<vec4<f16>, ONES + T / 4u>;
var<workgroup> dys: array<vec4<f16>, BH * BW * LDP>;

// Blocks along an output row and per image; where the host takes ragged
// blocks (RAGGED), the last along a row and down an image reach past the
// output, and dy reads as zeros there, so those positions add nothing.
override BLOCKS_W: u32 = (W_OUT + BW - 1u) / BW;
override BLOCKS_PER_IMAGE: u32 = (H_OUT + BH - 1u) / BH * BLOCKS_W;

// A block's operands on their way from global to workgroup memory.
struct BlockRuns {
    halo: array<Run, HALO_SLOTS>,
    dy: array<Run, DY_SLOTS>,
}

// Reads this thread's runs of block `block` (image-major, then block rows)
// from global memory: halo pixel g / (CB / 8) and dy position g / (CB / 8),
// channels 8 at a time.
fn fetch_block(regs: ptr<function, BlockRuns>, block: u32, ci0: u32, co0: u32, lidx: u32) {
    let blocks_w = BLOCKS_W;
    let n = block / BLOCKS_PER_IMAGE;
    let within = block % BLOCKS_PER_IMAGE;
    let oh0 = (within / blocks_w) * BH;
    let ow0 = (within % blocks_w) * BW;
    let ih0 = i32(oh0) - i32(PAD_TOP);
    let iw0 = i32(ow0) - i32(PAD_LEFT);
    for (var s = 0u; s < HALO_SLOTS; s++) {
        let g = lidx + s * THREADS;
        let pixel = g / (CB / 8u);
        var run = Run();
        if (g < HALO_RUNS) {
            run = x_pixel_run(n, ih0 + i32(pixel / HALO_W), iw0 + i32(pixel % HALO_W), ci0 + (g % (CB / 8u)) * 8u);
        }
        (*regs).halo[s] = run;
    }
    for (var s = 0u; s < DY_SLOTS; s++) {
        let g = lidx + s * THREADS;
        let p = g / (CB / 8u);
        var run = Run();
        let oh = oh0 + p / BW;
        let ow = ow0 + p % BW;
        if (g < DY_RUNS && (!RAGGED || oh < H_OUT && ow < W_OUT)) {
            let position = (n * H_OUT + oh) * W_OUT + ow;
            run = dy_run(i32(position * C_OUT + co0 + (g % (CB / 8u)) * 8u));
        }
        (*regs).dy[s] = run;
    }
}

fn stage_block(regs: ptr<function, BlockRuns>, lidx: u32) {
    for (var s = 0u; s < HALO_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < HALO_RUNS) {
            let slot = (g / (CB / 8u)) * LDP + (g % (CB / 8u)) * 2u;
            halo[slot] = (*regs).halo[s][0];
            halo[slot + 1u] = (*regs).halo[s][1];
        }
    }
    for (var s = 0u; s < DY_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < DY_RUNS) {
            let slot = (g / (CB / 8u)) * LDP + (g % (CB / 8u)) * 2u;
            dys[slot] = (*regs).dy[s][0];
            dys[slot + 1u] = (*regs).dy[s][1];
        }
    }
}

@compute @workgroup_size(THREADS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let z = wid.x;
    let slices = groups.x;
    let chunks_in = C_IN / CB;
    let ci0 = (wid.y % chunks_in) * CB;
    let co0 = (wid.y / chunks_in) * CB;
    let blocks = params.n * BLOCKS_PER_IMAGE;
    // The tap this subgroup owns; the last subgroup (TAPS) does dbias with ones.
    let is_bias = sg == TAPS;
    let tap = min(sg, TAPS - 1u);
    let r = tap / S;
    let s = tap % S;
    let a_stride = select(LDP, 0u, is_bias);
    for (var i = lidx; i < T / 4u; i += THREADS) {
        halo[ONES + i] = vec4<f16>(1.0);
    }
    // generated: accumulators acc_i_j
    // The next block's runs load while this one multiplies.
    var regs: BlockRuns;
    if (z < blocks) {
        fetch_block(&regs, z, ci0, co0, lidx);
    }
    for (var block = z; block < blocks; block += slices) {
        // The previous block's halo and dy are read.
        workgroupBarrier();
        stage_block(&regs, lidx);
        workgroupBarrier();
        let next = block + slices;
        if (next < blocks) {
            fetch_block(&regs, next, ci0, co0, lidx);
        }
        for (var p0 = 0u; p0 < BH * BW; p0 += T) {
            // T positions along block row p0 / BW, from column p0 % BW.
            let a_at = select(((p0 / BW + r) * HALO_W + p0 % BW + s) * LDP, ONES, is_bias);
            // generated: 2 loads of A (halo, or ones for dbias), 2 of B, 4 multiply-adds
        }
    }
    // The tap's rows of dW, or this chunk's dbias rows.
    let row0 = select(tap * C_IN + ci0, R * S * C_IN + (wid.y % chunks_in) * CB, is_bias);
    let out = (z * (R * S * C_IN + BIAS_ROWS) + row0) * C_OUT + co0;
    // generated: stores of the 2 x 2 tiles
}
