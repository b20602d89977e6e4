// The portable tiled GEMM shared by the three conv directions:
//   C[row, col] = sum over red in reduction_range(z) of load_a(z, row, red) * load_b(z, red, col)
// Each direction supplies gemm_rows, gemm_cols, reduction_range, load_a, load_b
// and store_c. A 16x16 workgroup computes a 64x64 tile, 4x4 outputs a thread,
// staging 16-deep slices of A and B through workgroup memory (f32 whatever the
// operand type). Every load and store is predicated, so tiles may end anywhere.
// A workgroup takes row tiles wid.x, wid.x + groups.x, ...: where the rows need
// more workgroups than the adapter launches along x, the host launches the
// limit and they take turns.

const TILE: u32 = 64u;
const TILE_K: u32 = 16u;

var<workgroup> tile_a: array<f32, 1024>; // [TILE_K][TILE]
var<workgroup> tile_b: array<f32, 1024>; // [TILE_K][TILE]

@compute @workgroup_size(16, 16)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let z = wid.z;
    let col0 = wid.y * TILE;
    let flat = lid.y * 16u + lid.x;
    let rows = gemm_rows(z);
    let cols = gemm_cols();
    let range = reduction_range(z);
    for (var row0 = wid.x * TILE; row0 < rows; row0 += groups.x * TILE) {
        tile_gemm(z, row0, col0, flat, lid, rows, cols, range);
    }
}

// One 64x64 tile of C from row0, col0.
fn tile_gemm(z: u32, row0: u32, col0: u32, flat: u32, lid: vec3<u32>, rows: u32, cols: u32, range: vec2<u32>) {
    var acc: array<f32, 16>;
    for (var k0 = range.x; k0 < range.y; k0 += TILE_K) {
        for (var i = 0u; i < 4u; i++) {
            let idx = flat + i * 256u;
            // A with the reduction index fastest (contiguous channels), B with columns fastest.
            let ka = idx % TILE_K;
            let ma = idx / TILE_K;
            var a = 0.0;
            if (k0 + ka < range.y && row0 + ma < rows) {
                a = load_a(z, row0 + ma, k0 + ka);
            }
            tile_a[ka * TILE + ma] = a;
            let nb = idx % TILE;
            let kb = idx / TILE;
            var b = 0.0;
            if (k0 + kb < range.y && col0 + nb < cols) {
                b = load_b(z, k0 + kb, col0 + nb);
            }
            tile_b[kb * TILE + nb] = b;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K; kk++) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = tile_a[kk * TILE + lid.y + 16u * i];
                b[i] = tile_b[kk * TILE + lid.x + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] = fma(a[i], b[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            let row = row0 + lid.y + 16u * i;
            let col = col0 + lid.x + 16u * j;
            if (row < rows && col < cols) {
                store_c(z, row, col, acc[i * 4u + j]);
            }
        }
    }
}
