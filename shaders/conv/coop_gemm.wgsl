// The cooperative-matrix GEMM shared by the three conv directions, with the same
// contract as portable_gemm.wgsl (gemm_rows, gemm_cols, reduction_range, load_a,
// load_b, store_c) plus run loads: `load_a_run` / `load_b_run` return 8
// consecutive elements along the operand's contiguous axis (A_RUNS_ALONG_K /
// B_RUNS_ALONG_K say which), so the index arithmetic is done once per 8
// elements. The host sets RUN_A / RUN_B to 8 when the shape keeps every run
// inside one contiguous, in-bounds span (channel counts divisible by 8), else 1
// (element loads). `coop_matTxT` is replaced by the adapter's tile (8 or 16).
//
// A workgroup of 4 subgroups (2 x 2) computes a BM x BN block; each subgroup owns
// 2 x 2 tiles of T x T. Per step the workgroup gathers a BM x BK slice of A and a
// BK x BN slice of B into workgroup memory as f16 (zeros outside the matrix), the
// subgroups multiply-accumulate in f32, and the result goes back through
// workgroup memory so edge tiles are written with predicated stores only: no
// access outside any buffer.

override SUBGROUP: u32;
override RUN_A: u32;
override RUN_B: u32;

const T: u32 = TILE_SIZEu;
const TILES: u32 = 2u;
const BM: u32 = 2u * TILES * T;
const BN: u32 = 2u * TILES * T;
const BK: u32 = 2u * T;
const RUN: u32 = 8u;

var<workgroup> stage_a: array<f16, BM * BK>; // row-major [BM][BK]
var<workgroup> stage_b: array<f16, BK * BN>; // row-major [BK][BN]
var<workgroup> stage_c: array<f32, BM * BN>; // row-major [BM][BN]

// Gathers A[row0.., k0..] into stage_a.
fn stage_a_slice(z: u32, row0: u32, k0: u32, rows: u32, k_end: u32, lidx: u32, threads: u32) {
    if (RUN_A == 1u) {
        for (var idx = lidx; idx < BM * BK; idx += threads) {
            let m = idx / BK;
            let k = idx % BK;
            var a = 0.0;
            if (row0 + m < rows && k0 + k < k_end) {
                a = f32(load_a(z, row0 + m, k0 + k));
            }
            stage_a[idx] = f16(a);
        }
        return;
    }
    for (var v = lidx; v < BM * BK / RUN; v += threads) {
        // Consecutive threads take consecutive runs along the contiguous axis.
        var m: u32;
        var k: u32;
        if (A_RUNS_ALONG_K) {
            m = v / (BK / RUN);
            k = (v % (BK / RUN)) * RUN;
        } else {
            k = v / (BM / RUN);
            m = (v % (BM / RUN)) * RUN;
        }
        var run: array<operand, 8>;
        if (row0 + m < rows && k0 + k < k_end) {
            run = load_a_run(z, row0 + m, k0 + k);
        }
        for (var j = 0u; j < RUN; j++) {
            if (A_RUNS_ALONG_K) {
                stage_a[m * BK + k + j] = f16(run[j]);
            } else {
                stage_a[(m + j) * BK + k] = f16(run[j]);
            }
        }
    }
}

// Gathers B[k0.., col0..] into stage_b.
fn stage_b_slice(z: u32, col0: u32, k0: u32, cols: u32, k_end: u32, lidx: u32, threads: u32) {
    if (RUN_B == 1u) {
        for (var idx = lidx; idx < BK * BN; idx += threads) {
            let k = idx / BN;
            let n = idx % BN;
            var b = 0.0;
            if (k0 + k < k_end && col0 + n < cols) {
                b = f32(load_b(z, k0 + k, col0 + n));
            }
            stage_b[idx] = f16(b);
        }
        return;
    }
    for (var v = lidx; v < BK * BN / RUN; v += threads) {
        var k: u32;
        var n: u32;
        if (B_RUNS_ALONG_K) {
            n = v / (BK / RUN);
            k = (v % (BK / RUN)) * RUN;
        } else {
            k = v / (BN / RUN);
            n = (v % (BN / RUN)) * RUN;
        }
        var run: array<operand, 8>;
        if (k0 + k < k_end && col0 + n < cols) {
            run = load_b_run(z, k0 + k, col0 + n);
        }
        for (var j = 0u; j < RUN; j++) {
            if (B_RUNS_ALONG_K) {
                stage_b[(k + j) * BN + n] = f16(run[j]);
            } else {
                stage_b[k * BN + n + j] = f16(run[j]);
            }
        }
    }
}

@compute @workgroup_size(4u * SUBGROUP)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let z = wid.z;
    let row0 = wid.x * BM;
    let col0 = wid.y * BN;
    let threads = 4u * SUBGROUP;
    let rows = gemm_rows(z);
    let cols = gemm_cols();
    let range = reduction_range(z);
    // This subgroup's 2T x 2T corner of the block.
    let sub_row = (sg / 2u) * TILES * T;
    let sub_col = (sg % 2u) * TILES * T;
    var acc00 = coop_matTxT<f32, C>();
    var acc01 = coop_matTxT<f32, C>();
    var acc10 = coop_matTxT<f32, C>();
    var acc11 = coop_matTxT<f32, C>();
    for (var k0 = range.x; k0 < range.y; k0 += BK) {
        stage_a_slice(z, row0, k0, rows, range.y, lidx, threads);
        stage_b_slice(z, col0, k0, cols, range.y, lidx, threads);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += T) {
            let a0 = coopLoadT<coop_matTxT<f16, A>>(&stage_a[sub_row * BK + kk], BK);
            let a1 = coopLoadT<coop_matTxT<f16, A>>(&stage_a[(sub_row + T) * BK + kk], BK);
            let b0 = coopLoadT<coop_matTxT<f16, B>>(&stage_b[kk * BN + sub_col], BN);
            let b1 = coopLoadT<coop_matTxT<f16, B>>(&stage_b[kk * BN + sub_col + T], BN);
            acc00 = coopMultiplyAdd(a0, b0, acc00);
            acc01 = coopMultiplyAdd(a0, b1, acc01);
            acc10 = coopMultiplyAdd(a1, b0, acc10);
            acc11 = coopMultiplyAdd(a1, b1, acc11);
        }
        workgroupBarrier();
    }
    coopStoreT(acc00, &stage_c[sub_row * BN + sub_col], BN);
    coopStoreT(acc01, &stage_c[sub_row * BN + sub_col + T], BN);
    coopStoreT(acc10, &stage_c[(sub_row + T) * BN + sub_col], BN);
    coopStoreT(acc11, &stage_c[(sub_row + T) * BN + sub_col + T], BN);
    workgroupBarrier();
    for (var idx = lidx; idx < BM * BN; idx += threads) {
        let m = idx / BN;
        let n = idx % BN;
        if (row0 + m < rows && col0 + n < cols) {
            store_c(z, row0 + m, col0 + n, stage_c[idx]);
        }
    }
}
