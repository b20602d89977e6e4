// The cooperative-matrix GEMM shared by the three conv directions, with the same
// contract as portable.wgsl (gemm_rows, gemm_cols, reduction_range, load_a,
// load_b, store_c) plus run loads: `load_a_run` / `load_b_run` return 8
// consecutive elements along the operand's contiguous axis as a `Run` (two
// vec4<f16>), so the index arithmetic is done once per 8 elements and a run
// moves as two 8-byte values. A_RUNS_ALONG_K / B_RUNS_ALONG_K say which axis
// that is. The host sets RUN_A / RUN_B to 8 when the shape keeps every run
// inside one contiguous, in-bounds span (channel counts divisible by 8), else 1
// (element loads, gathered into a Run here).
//
// The block geometry is written in by the host (src/conv/gemm/coop.rs) as constants:
// T (the adapter's tile, 8 or 16), SUBGROUP, SG_M x SG_N subgroups each owning
// TM x TN tiles, KT tiles of reduction per step, and the run axes. So are the
// three generated pieces marked `// generated:` below (declaring, multiplying
// and storing the TM x TN accumulators, which WGSL cannot hold in an indexable
// array).
//
// Each step, the workgroup stages a BM x BK slice of A and a BK x BN slice of B
// in workgroup memory as f16 (zeros outside the matrix) and the subgroups
// multiply-accumulate in f32. Each operand is staged with its runs contiguous
// (A as [BM][BK] when its runs go along K, else as [BK][BM]; likewise B), so
// every run is two 8-byte stores, and the matrix loads read it row- or
// column-major to match. The next slice is fetched from global memory into
// registers while the current one is multiplied, so load latency overlaps the
// MMAs. Staged rows are padded by 8 halves (16 bytes): rows stay 16-byte aligned
// for the matrix loads and successive rows start in different banks. Results go
// out one tile at a time through a per-subgroup scratch tile, so edge tiles are
// written with predicated stores only: no access outside any buffer. Where
// every block lies wholly inside C (C_VIA_SCRATCH false: the host's DirectC),
// each tile is instead one matrix store straight into C, the accumulators
// starting from the bias: no scratch, no barrier. (A tile cannot be skipped
// instead: naga wants matrix loads and stores in uniform control flow.)

override RUN_A: u32;
override RUN_B: u32;

const BM: u32 = SG_M * TM * T;
const BN: u32 = SG_N * TN * T;
const BK: u32 = KT * T;
const THREADS: u32 = SG_M * SG_N * SUBGROUP;
// Elements per run: a run, or 8 single loads along the same axis.
const GROUP: u32 = 8u;
// Staged rows hold vec4<f16>, the element type the matrix loads count their
// stride in (drivers read the pointer's components as matrix elements).
// Row lengths in vec4 units: the run axis plus 8 halves of padding.
const LDA: u32 = select(BM, BK, A_RUNS_ALONG_K) / 4u + 2u;
const LDB: u32 = select(BN, BK, B_RUNS_ALONG_K) / 4u + 2u;
const LDC: u32 = T + 4u;
const A_GROUPS: u32 = BM * BK / GROUP;
const B_GROUPS: u32 = BK * BN / GROUP;
const A_SLOTS: u32 = (A_GROUPS + THREADS - 1u) / THREADS;
const B_SLOTS: u32 = (B_GROUPS + THREADS - 1u) / THREADS;

var<workgroup> stage_a: array<vec4<f16>, select(BK, BM, A_RUNS_ALONG_K) * LDA>;
var<workgroup> stage_b: array<vec4<f16>, select(BK, BN, B_RUNS_ALONG_K) * LDB>;
// One [T][LDC] scratch tile per subgroup, where C goes out through them.
var<workgroup> stage_c: array<f32, select(1u, SG_M * SG_N * T * LDC, C_VIA_SCRATCH)>;

// Group g of the A slice: its first element (m, k) within the block.
fn a_group_origin(g: u32) -> vec2<u32> {
    if (A_RUNS_ALONG_K) {
        return vec2<u32>(g / (BK / GROUP), (g % (BK / GROUP)) * GROUP);
    }
    return vec2<u32>((g % (BM / GROUP)) * GROUP, g / (BM / GROUP));
}

// Group g of the B slice: its first element (k, n) within the block.
fn b_group_origin(g: u32) -> vec2<u32> {
    if (B_RUNS_ALONG_K) {
        return vec2<u32>((g % (BK / GROUP)) * GROUP, g / (BK / GROUP));
    }
    return vec2<u32>(g / (BN / GROUP), (g % (BN / GROUP)) * GROUP);
}

// Index in stage_a of the vec4 holding element (m, k), m and k within the
// block, the run-axis coordinate a multiple of 4.
fn a_slot(m: u32, k: u32) -> u32 {
    if (A_RUNS_ALONG_K) {
        return m * LDA + k / 4u;
    }
    return k * LDA + m / 4u;
}

fn b_slot(k: u32, n: u32) -> u32 {
    if (B_RUNS_ALONG_K) {
        return n * LDB + k / 4u;
    }
    return k * LDB + n / 4u;
}

// Reads this thread's groups of A[row0.., k0..] from global memory.
fn fetch_a(regs: ptr<function, array<Run, A_SLOTS>>, z: u32, row0: u32, k0: u32, rows: u32, k_end: u32, lidx: u32) {
    for (var s = 0u; s < A_SLOTS; s++) {
        let g = lidx + s * THREADS;
        let o = a_group_origin(g);
        var group = Run();
        if (RUN_A == GROUP) {
            if (g < A_GROUPS && row0 + o.x < rows && k0 + o.y < k_end) {
                group = load_a_run(z, row0 + o.x, k0 + o.y);
            }
        } else if (g < A_GROUPS) {
            for (var j = 0u; j < GROUP; j++) {
                let m = row0 + o.x + select(j, 0u, A_RUNS_ALONG_K);
                let k = k0 + o.y + select(0u, j, A_RUNS_ALONG_K);
                if (m < rows && k < k_end) {
                    group[j / 4u][j % 4u] = f16(load_a(z, m, k));
                }
            }
        }
        (*regs)[s] = group;
    }
}

// Reads this thread's groups of B[k0.., col0..] from global memory.
fn fetch_b(regs: ptr<function, array<Run, B_SLOTS>>, z: u32, col0: u32, k0: u32, cols: u32, k_end: u32, lidx: u32) {
    for (var s = 0u; s < B_SLOTS; s++) {
        let g = lidx + s * THREADS;
        let o = b_group_origin(g);
        var group = Run();
        if (RUN_B == GROUP) {
            if (g < B_GROUPS && k0 + o.x < k_end && col0 + o.y < cols) {
                group = load_b_run(z, k0 + o.x, col0 + o.y);
            }
        } else if (g < B_GROUPS) {
            for (var j = 0u; j < GROUP; j++) {
                let k = k0 + o.x + select(0u, j, B_RUNS_ALONG_K);
                let n = col0 + o.y + select(j, 0u, B_RUNS_ALONG_K);
                if (k < k_end && n < cols) {
                    group[j / 4u][j % 4u] = f16(load_b(z, k, n));
                }
            }
        }
        (*regs)[s] = group;
    }
}

fn stage_groups(regs_a: ptr<function, array<Run, A_SLOTS>>, regs_b: ptr<function, array<Run, B_SLOTS>>, lidx: u32) {
    for (var s = 0u; s < A_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < A_GROUPS) {
            let o = a_group_origin(g);
            let slot = a_slot(o.x, o.y);
            stage_a[slot] = (*regs_a)[s][0];
            stage_a[slot + 1u] = (*regs_a)[s][1];
        }
    }
    for (var s = 0u; s < B_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < B_GROUPS) {
            let o = b_group_origin(g);
            let slot = b_slot(o.x, o.y);
            stage_b[slot] = (*regs_b)[s][0];
            stage_b[slot + 1u] = (*regs_b)[s][1];
        }
    }
}

// Writes one accumulator tile (scratch holds it) to C at block tile (ti, tj).
fn store_tile(z: u32, row: u32, col: u32, rows: u32, cols: u32, scratch: u32, lane: u32) {
    for (var e = lane; e < T * T; e += SUBGROUP) {
        let r = e / T;
        let c = e % T;
        if (row + r < rows && col + c < cols) {
            store_c(z, row + r, col + c, stage_c[scratch + r * LDC + c]);
        }
    }
}

@compute @workgroup_size(THREADS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let z = wid.z;
    let row0 = wid.x * BM;
    let col0 = wid.y * BN;
    let rows = gemm_rows(z);
    let cols = gemm_cols();
    let range = reduction_range(z);
    // This subgroup's TM*T x TN*T corner of the block.
    let sub_row = (sg / SG_N) * TM * T;
    let sub_col = (sg % SG_N) * TN * T;
    // generated: accumulators acc_i_j
    var regs_a: array<Run, A_SLOTS>;
    var regs_b: array<Run, B_SLOTS>;
    fetch_a(&regs_a, z, row0, range.x, rows, range.y, lidx);
    fetch_b(&regs_b, z, col0, range.x, cols, range.y, lidx);
    for (var k0 = range.x; k0 < range.y; k0 += BK) {
        stage_groups(&regs_a, &regs_b, lidx);
        workgroupBarrier();
        if (k0 + BK < range.y) {
            fetch_a(&regs_a, z, row0, k0 + BK, rows, range.y, lidx);
            fetch_b(&regs_b, z, col0, k0 + BK, cols, range.y, lidx);
        }
        for (var kk = 0u; kk < BK; kk += T) {
            // generated: TM loads of A, TN loads of B, TM*TN multiply-adds
        }
        workgroupBarrier();
    }
    let scratch = sg * T * LDC;
    // generated: per tile, coopStore into C, or into scratch, barrier, store_tile, barrier
}
