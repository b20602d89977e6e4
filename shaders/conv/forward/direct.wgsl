// The forward of a conv over few input channels (a network's first conv: 3
// channels, a few taps), without a GEMM core: an invocation computes DIRECT_LANES
// output channels of one output position from its K = R * S * C_IN inputs,
// with the filter staged once per workgroup as f32 (operands rounded as the
// variant's). The GEMM cores would gather such an input one element at a time
// and spend most of each reduction step on padding.
//
// Written in by the host (src/conv/direct.rs): DIRECT_K (= R * S * C_IN),
// DIRECT_GROUPS (= C_OUT / DIRECT_LANES, output channel groups a position),
// DIRECT_ROWS (unused here).

const DIRECT_THREADS: u32 = 256u;
const DIRECT_LANES: u32 = 4u;

var<workgroup> direct_filter: array<vec4<f32>, DIRECT_K * DIRECT_GROUPS>;

@compute @workgroup_size(DIRECT_THREADS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    for (var i = lidx; i < DIRECT_K * DIRECT_GROUPS; i += DIRECT_THREADS) {
        let at = (i / DIRECT_GROUPS) * C_OUT + (i % DIRECT_GROUPS) * DIRECT_LANES;
        direct_filter[i] = vec4(w_at(at), w_at(at + 1u), w_at(at + 2u), w_at(at + 3u));
    }
    workgroupBarrier();
    let index = (wid.x + wid.y * groups.x) * DIRECT_THREADS + lidx;
    let m = index / DIRECT_GROUPS;
    let group = index % DIRECT_GROUPS;
    if (m >= gemm_rows(0u)) {
        return;
    }
    let c = group * DIRECT_LANES;
    var acc = vec4(bias[c], bias[c + 1u], bias[c + 2u], bias[c + 3u]);
    let position = im2col_position(m);
    for (var r = 0u; r < R; r++) {
        let ih = position.y + i32(r * DIL_H);
        for (var s = 0u; s < S; s++) {
            let iw = position.z + i32(s * DIL_W);
            if (ih < 0 || ih >= i32(H) || iw < 0 || iw >= i32(W)) {
                continue;
            }
            let pixel = u32(position.x + i32((r * DIL_H * W + s * DIL_W) * C_IN));
            let tap = (r * S + s) * C_IN;
            for (var ci = 0u; ci < C_IN; ci++) {
                acc += x_at(pixel + ci) * direct_filter[(tap + ci) * DIRECT_GROUPS + group];
            }
        }
    }
    let out = m * C_OUT + c;
    y[out] = acc.x;
    y[out + 1u] = acc.y;
    y[out + 2u] = acc.z;
    y[out + 3u] = acc.w;
}
