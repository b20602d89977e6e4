// Max pool forward: one invocation per output element scans its window r-major
// then s over in-bounds elements. A candidate wins when it is greater than the
// best so far, or when it is NaN and the best is not: ties go to the first in scan
// order and the first NaN is the max. NaN is read from the bits (WGSL lets
// implementations assume float compares never see NaN) and values are moved as
// bits, so this matches the CPU path bit for bit.

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@group(0) @binding(2) var<storage, read_write> argmax: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

fn is_nan_bits(bits: u32) -> bool {
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

// The max of output `o`'s window: its bits and its input index.
fn window_max(o: u32) -> vec2<u32> {
    let at = nhwc_position(o, params.h_out, params.w_out);
    let rows = window_span(at.row, params.stride_h, params.pad_top, params.filter_h, params.h);
    let cols = window_span(at.col, params.stride_w, params.pad_left, params.filter_w, params.w);
    var best_index = input_index(at.n, rows.x, cols.x, at.ch);
    var best_bits = x[best_index];
    for (var r = rows.x; r < rows.y; r++) {
        for (var s = cols.x; s < cols.y; s++) {
            let i = input_index(at.n, r, s, at.ch);
            let bits = x[i];
            let candidate_nan = is_nan_bits(bits);
            let best_nan = is_nan_bits(best_bits);
            let greater = !candidate_nan && !best_nan && bitcast<f32>(bits) > bitcast<f32>(best_bits);
            if (greater || (candidate_nan && !best_nan)) {
                best_bits = bits;
                best_index = i;
            }
        }
    }
    return vec2(best_bits, best_index);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x + gid.y * params.row_stride;
    if (o >= params.len) {
        return;
    }
    let best = window_max(o);
    y[o] = best.x;
    argmax[o] = best.y;
}
