// Average pool forward: one invocation per output element sums its window's
// in-bounds elements in scan order (r-major, then s) and divides by their count,
// so padding is excluded from the average.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x + gid.y * params.row_stride;
    if (o >= params.len) {
        return;
    }
    let at = nhwc_position(o, params.h_out, params.w_out);
    let rows = window_span(at.row, params.stride_h, params.pad_top, params.filter_h, params.h);
    let cols = window_span(at.col, params.stride_w, params.pad_left, params.filter_w, params.w);
    var sum = 0.0;
    for (var r = rows.x; r < rows.y; r++) {
        for (var s = cols.x; s < cols.y; s++) {
            sum += x[input_index(at.n, r, s, at.ch)];
        }
    }
    y[o] = sum / f32((rows.y - rows.x) * (cols.y - cols.x));
}
