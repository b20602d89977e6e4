// Max pool forward with a spatial dropout folded in (MaxPool2d taking over the
// SpatialDropout after it): y = max * mask, where the mask of (image, channel)
// is ops::dropout's spatial mask, drawn once per workgroup (pool_mask.wgsl).
// Bit-identical to max pooling then spatial dropout: the same max bits, the same
// f32 product. Appended to pool_max_forward.wgsl (its bindings and window_max).
// `main_dropout`: y as f32, an invocation per output, any channel count; at
// rate 0 the max's own bits (mask_is_identity).
// Where C % 4 == 0 (the host checks) an invocation takes four channels of one
// pixel, loading and storing 16 bytes at a time (window_max4, entry 69):
// `main_dropout4` writes y as f32; `main_dropout_f16` as f16 (f16_bits.wgsl,
// bit-exact with half of the f32 product) for a conv after it that rounds its
// input anyway; `main_f16` likewise without a dropout (no masks, no barrier).
// All find their windows' maxima between drawing the masks and the barrier
// after it: the other invocations' loads are in flight while the few that draw
// run Philox (docs/lab/perf-notes.md, entry 69).

@group(0) @binding(0) var<storage, read> x4: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> y4: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> y_f16: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> argmax4: array<vec4<u32>>;

// window_max for outputs o .. o + 3 (four channels of one pixel, o % 4 == 0):
// the same scan and the same decisions, per channel, on 16-byte loads. The
// decisions stay scalar, with window_max's short-circuits: evaluated on whole
// vectors, the float compare saw NaN lanes, and Mesa 26's lavapipe (LLVM 19)
// then dropped NaNs that should have won.
fn window_max4(o: u32) -> array<vec4<u32>, 2> {
    let at = nhwc_position(o, params.h_out, params.w_out);
    let rows = window_span(at.row, params.stride_h, params.pad_top, params.filter_h, params.h);
    let cols = window_span(at.col, params.stride_w, params.pad_left, params.filter_w, params.w);
    let first = input_index(at.n, rows.x, cols.x, at.ch);
    var best_index = vec4(first) + vec4(0u, 1u, 2u, 3u);
    var best_bits = x4[first / 4u];
    for (var r = rows.x; r < rows.y; r++) {
        for (var s = cols.x; s < cols.y; s++) {
            let i = input_index(at.n, r, s, at.ch);
            let bits = x4[i / 4u];
            for (var k = 0u; k < 4u; k++) {
                let candidate_nan = is_nan_bits(bits[k]);
                let best_nan = is_nan_bits(best_bits[k]);
                let greater = !candidate_nan && !best_nan
                    && bitcast<f32>(bits[k]) > bitcast<f32>(best_bits[k]);
                if (greater || (candidate_nan && !best_nan)) {
                    best_bits[k] = bits[k];
                    best_index[k] = i + k;
                }
            }
        }
    }
    return array(best_bits, best_index);
}

// What an invocation of main_dropout4 or main_dropout_f16 has found before
// the barrier: its lane (outputs o .. o + 3) and the maxima's bits and indices.
struct Maxima4 {
    lane: PoolLane,
    best: array<vec4<u32>, 2>,
}

// Draws the workgroup's masks and, meanwhile, finds this invocation's four
// maxima; the caller's barrier follows (every invocation calls it from
// uniform control flow, as pool_lane needs).
fn maxima4_before_barrier(wid: vec3<u32>, lidx: u32) -> Maxima4 {
    let lane = pool_lane(wid, lidx, 4u);
    var best: array<vec4<u32>, 2>;
    if (lane.live) {
        best = window_max4(lane.o);
    }
    return Maxima4(lane, best);
}

// The four maxima times their masks, as f32 bits.
fn masked4(m: Maxima4) -> vec4<u32> {
    let masks = pool_masks4(m.lane.tabled, m.lane.first, m.lane.o);
    return bitcast<vec4<u32>>(bitcast<vec4<f32>>(m.best[0]) * masks);
}

@compute @workgroup_size(256)
fn main_dropout(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let lane = pool_lane(wid, lidx, 1u);
    // Before the barrier: the windows load while the table's draws run.
    var best = vec2(0u);
    if (lane.live) {
        best = window_max(lane.o);
    }
    workgroupBarrier();
    if (!lane.live) {
        return;
    }
    let product = bitcast<u32>(bitcast<f32>(best.x) * pool_mask(lane.tabled, lane.first, lane.o));
    y[lane.o] = select(product, best.x, mask_is_identity());
    argmax[lane.o] = best.y;
}

@compute @workgroup_size(256)
fn main_dropout4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let m = maxima4_before_barrier(wid, lidx);
    workgroupBarrier();
    if (!m.lane.live) {
        return;
    }
    y4[m.lane.o / 4u] = select(masked4(m), m.best[0], mask_is_identity());
    argmax4[m.lane.o / 4u] = m.best[1];
}

@compute @workgroup_size(256)
fn main_dropout_f16(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let m = maxima4_before_barrier(wid, lidx);
    workgroupBarrier();
    if (!m.lane.live) {
        return;
    }
    let h = f16_bits4(clip_f16_range4(masked4(m)));
    y_f16[m.lane.o / 4u] = vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
    argmax4[m.lane.o / 4u] = m.best[1];
}

@compute @workgroup_size(256)
fn main_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = 4u * (gid.x + gid.y * params.row_stride);
    if (o >= params.len) {
        return;
    }
    let best = window_max4(o);
    let h = f16_bits4(clip_f16_range4(best[0]));
    y_f16[o / 4u] = vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
    argmax4[o / 4u] = best[1];
}
