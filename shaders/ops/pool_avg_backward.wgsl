// Average pool backward as a gather: one invocation per input element sums, in
// (oh, ow) order, dy / count over every window that covers it, where count is
// that window's number of in-bounds elements (as in the forward pass).

@group(0) @binding(0) var<storage, read> dy: array<f32>;
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i >= params.len) {
        return;
    }
    let at = nhwc_position(i, params.h, params.w);
    let rows = covering_span(at.row, params.stride_h, params.pad_top, params.filter_h, params.h_out);
    let cols = covering_span(at.col, params.stride_w, params.pad_left, params.filter_w, params.w_out);
    var sum = 0.0;
    for (var oh = rows.x; oh < rows.y; oh++) {
        let window_rows = window_span(oh, params.stride_h, params.pad_top, params.filter_h, params.h);
        for (var ow = cols.x; ow < cols.y; ow++) {
            let window_cols = window_span(ow, params.stride_w, params.pad_left, params.filter_w, params.w);
            let count = (window_rows.y - window_rows.x) * (window_cols.y - window_cols.x);
            sum += dy[output_index(at.n, oh, ow, at.ch)] / f32(count);
        }
    }
    dx[i] = sum;
}
