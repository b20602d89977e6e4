// The forward of a stride-1, undilated conv as cooperative-matrix MMAs read
// straight from a staged input tile (the "halo"), with no im2col staging:
// for T output positions along one output row, tap (r, s) and T input
// channels from c0, the A tile is T consecutive pixels of the halo row
// (br + r), starting at column (bc + s): rows one pixel apart, channels
// contiguous, so one row-major matrix load with the pixel stride. Each input
// value is fetched from global memory once per block (the GEMM core fetches it
// once per tap, R * S times), and the whole reduction needs 2 barriers per
// step of TPS taps instead of 2 per staged step of the GEMM core.
//
// A workgroup computes BH x BW output positions (whole T-wide runs of one
// image's rows) by BN output channels. Per chunk of HALO_C input channels it
// stages the halo, (BH + R - 1) x (BW + S - 1) pixels of the chunk's channels
// (zeros in the padding); then per step of TPS filter taps the TPS * HALO_C
// x BN slice of the weights ("taps").
// SG_M x SG_N subgroups each own PT position tiles by CT channel tiles; the
// accumulators start from the bias and go straight into y (the host only
// picks this kernel where every block lies inside the output). Staged pixels
// and tap rows are padded by 8 halves: 16-byte aligned matrix loads,
// successive rows in different banks.
//
// Written in by the host (src/conv/halo.rs): T, SUBGROUP, SG_M, SG_N, PT, CT,
// BH, BW, TPS, the staged sizes HALO_C (a divisor of C_IN), HALO_H, HALO_W and
// TAP_ROWS (= TPS * HALO_C), and the pieces marked `// generated:` (declaring,
// multiplying and storing the PT x CT accumulators, which WGSL cannot hold in
// an indexable array). The operand readers `x_run` / `w_run` come from the conv kernel
// (src/conv/common.rs), reading x as f16 or, converting, as f32.

const BN: u32 = SG_N * CT * T;
const THREADS: u32 = SG_M * SG_N * SUBGROUP;
// Pixel and tap-row strides in vec4<f16>, the unit the matrix loads count
// strides in: the channels plus 8 halves of padding.
const LDP: u32 = HALO_C / 4u + 2u;
const LDW: u32 = BN / 4u + 2u;
const HALO_RUNS: u32 = HALO_H * HALO_W * (HALO_C / 8u);
const TAP_RUNS: u32 = TAP_ROWS * (BN / 8u);

var<workgroup> halo: array<vec4<f16>, HALO_H * HALO_W * LDP>;
var<workgroup> taps: array<vec4<f16>, TAP_ROWS * LDW>;

// Stores one run of 8 halves at vec4 index `slot`.
fn stage_run(to_halo: bool, slot: u32, run: Run) {
    if (to_halo) {
        halo[slot] = run[0];
        halo[slot + 1u] = run[1];
    } else {
        taps[slot] = run[0];
        taps[slot + 1u] = run[1];
    }
}

@compute @workgroup_size(THREADS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let col0 = wid.y * BN;
    let blocks_w = W_OUT / BW;
    let blocks_per_image = (H_OUT / BH) * blocks_w;
    let n = wid.x / blocks_per_image;
    let block = wid.x % blocks_per_image;
    let oh0 = (block / blocks_w) * BH;
    let ow0 = (block % blocks_w) * BW;
    let ih0 = i32(oh0) - i32(PAD_TOP);
    let iw0 = i32(ow0) - i32(PAD_LEFT);
    // This subgroup's corner: position tiles from sg_m * PT, channel tiles
    // from sg_n * CT. Position tile p covers T outputs of block row
    // p / (BW / T), from block column (p % (BW / T)) * T.
    let sg_m = sg / SG_N;
    let sub_col = col0 + (sg % SG_N) * CT * T;
    // generated: tile origins br_i, bc_i and accumulators acc_i_j
    for (var cc = 0u; cc < C_IN; cc += HALO_C) {
        // The previous chunk's halo is read.
        workgroupBarrier();
        for (var g = lidx; g < HALO_RUNS; g += THREADS) {
            let pixel = g / (HALO_C / 8u);
            let c = (g % (HALO_C / 8u)) * 8u;
            let run = x_pixel_run(n, ih0 + i32(pixel / HALO_W), iw0 + i32(pixel % HALO_W), cc + c);
            stage_run(true, pixel * LDP + c / 4u, run);
        }
        for (var step = 0u; step < R * S / TPS; step++) {
            // The halo is staged, and the previous step's taps are read.
            workgroupBarrier();
            for (var g = lidx; g < TAP_RUNS; g += THREADS) {
                // Row k of the step's taps: tap k / HALO_C, channel cc + k % HALO_C.
                let k = g / (BN / 8u);
                let n8 = (g % (BN / 8u)) * 8u;
                let row = (step * TPS + k / HALO_C) * C_IN + cc + k % HALO_C;
                stage_run(false, k * LDW + n8 / 4u, w_run(i32(row * C_OUT + col0 + n8)));
            }
            workgroupBarrier();
            for (var tt = 0u; tt < TPS; tt++) {
                let r = (step * TPS + tt) / S;
                let s = (step * TPS + tt) % S;
                for (var c0 = 0u; c0 < HALO_C; c0 += T) {
                    // generated: PT loads of A from the halo, CT loads of B from the taps, PT*CT multiply-adds
                }
            }
        }
    }
    // generated: per accumulator, coopStore into y
}
