// The cooperative-matrix GEMM shared by the three conv directions, with the same
// contract as portable_gemm.wgsl (gemm_rows, gemm_cols, reduction_range, load_a,
// load_b, store_c). `coop_matTxT` is replaced by the adapter's tile (8 or 16).
//
// A workgroup of 4 subgroups (2 x 2) computes a BM x BN block; each subgroup owns
// 2 x 2 tiles of T x T. Per step the workgroup gathers a BM x BK slice of A and a
// BK x BN slice of B into workgroup memory as f16 (zeros outside the matrix), the
// subgroups multiply-accumulate in f32, and the result goes back through
// workgroup memory so edge tiles are written with predicated stores only: no
// access outside any buffer.

override SUBGROUP: u32;

const T: u32 = TILE_SIZEu;
const TILES: u32 = 2u;
const BM: u32 = 2u * TILES * T;
const BN: u32 = 2u * TILES * T;
const BK: u32 = 2u * T;

var<workgroup> stage_a: array<f16, BM * BK>; // row-major [BM][BK]
var<workgroup> stage_b: array<f16, BK * BN>; // row-major [BK][BN]
var<workgroup> stage_c: array<f32, BM * BN>; // row-major [BM][BN]

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
        for (var idx = lidx; idx < BM * BK; idx += threads) {
            let m = idx / BK;
            let k = idx % BK;
            var a = 0.0;
            if (row0 + m < rows && k0 + k < range.y) {
                a = load_a(z, row0 + m, k0 + k);
            }
            stage_a[idx] = f16(a);
        }
        for (var idx = lidx; idx < BK * BN; idx += threads) {
            let k = idx / BN;
            let n = idx % BN;
            var b = 0.0;
            if (k0 + k < range.y && col0 + n < cols) {
                b = load_b(z, k0 + k, col0 + n);
            }
            stage_b[idx] = f16(b);
        }
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
