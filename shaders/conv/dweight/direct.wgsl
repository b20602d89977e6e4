// dweight of a conv over few input channels (the forward's direct kernel's
// convs: a network's first conv), without a GEMM core: workgroup z sums
// slice z of the M reduction into partial[z][K + 1, C_OUT] (row K: dbias),
// as the GEMM core's slices, for the same reduce. Each step stages a chunk
// of DIRECT_ROWS output positions, their K inputs and their output
// gradient, as f32 (operands rounded as the variant's); each invocation
// then adds four output channels of its rows of the partial sums.
//
// Written in by the host (src/conv/direct.rs): DIRECT_K (= R * S * C_IN),
// DIRECT_GROUPS (= C_OUT / 4), DIRECT_ROWS (positions a chunk).

const DIRECT_THREADS: u32 = 256u;
// Partial-sum groups: (K + 1) rows by DIRECT_GROUPS channel groups.
const DIRECT_OUTPUTS: u32 = (DIRECT_K + 1u) * DIRECT_GROUPS;
const DIRECT_SLOTS: u32 = (DIRECT_OUTPUTS + DIRECT_THREADS - 1u) / DIRECT_THREADS;

var<workgroup> chunk_x: array<f32, DIRECT_ROWS * DIRECT_K>;
var<workgroup> chunk_dy: array<vec4<f32>, DIRECT_ROWS * DIRECT_GROUPS>;

@compute @workgroup_size(DIRECT_THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {
    let z = wid.z;
    let range = reduction_range(z);
    var acc: array<vec4<f32>, DIRECT_SLOTS>;
    for (var m0 = range.x; m0 < range.y; m0 += DIRECT_ROWS) {
        for (var i = lidx; i < DIRECT_ROWS * DIRECT_K; i += DIRECT_THREADS) {
            let m = m0 + i / DIRECT_K;
            chunk_x[i] = select(0.0, im2col(m, i % DIRECT_K), m < range.y);
        }
        for (var i = lidx; i < DIRECT_ROWS * DIRECT_GROUPS; i += DIRECT_THREADS) {
            let m = m0 + i / DIRECT_GROUPS;
            var v = vec4(0.0);
            if (m < range.y) {
                let at = m * C_OUT + (i % DIRECT_GROUPS) * 4u;
                v = vec4(dy_at(at), dy_at(at + 1u), dy_at(at + 2u), dy_at(at + 3u));
            }
            chunk_dy[i] = v;
        }
        workgroupBarrier();
        for (var slot = 0u; slot < DIRECT_SLOTS; slot++) {
            let out = lidx + slot * DIRECT_THREADS;
            if (out < DIRECT_OUTPUTS) {
                let k = out / DIRECT_GROUPS;
                let group = out % DIRECT_GROUPS;
                var sum = acc[slot];
                for (var r = 0u; r < DIRECT_ROWS; r++) {
                    // Row K is the row of ones: dbias.
                    let a = select(chunk_x[r * DIRECT_K + min(k, DIRECT_K - 1u)], 1.0, k == DIRECT_K);
                    sum += a * chunk_dy[r * DIRECT_GROUPS + group];
                }
                acc[slot] = sum;
            }
        }
        workgroupBarrier();
    }
    for (var slot = 0u; slot < DIRECT_SLOTS; slot++) {
        let out = lidx + slot * DIRECT_THREADS;
        if (out < DIRECT_OUTPUTS) {
            let k = out / DIRECT_GROUPS;
            let c = (out % DIRECT_GROUPS) * 4u;
            let at = (z * (DIRECT_K + 1u) + k) * C_OUT + c;
            partial[at] = acc[slot].x;
            partial[at + 1u] = acc[slot].y;
            partial[at + 2u] = acc[slot].z;
            partial[at + 3u] = acc[slot].w;
        }
    }
}
