// Window geometry shared by the windowed pooling kernels; prepended to each of
// them by src/ops/pool.rs. All indices are u32: the host checks that every
// tensor has fewer than 2^31 elements.

struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    h_out: u32,
    w_out: u32,
    filter_h: u32,
    filter_w: u32,
    stride_h: u32,
    stride_w: u32,
    pad_top: u32,
    pad_left: u32,
    // Elements this dispatch covers (outputs for forward, inputs for backward).
    len: u32,
    row_stride: u32,
    // A folded spatial dropout's draws (spatial_mask.wgsl; zero elsewhere).
    mask_threshold: u32,
    mask_scale: f32,
    mask_key0: u32,
    mask_key1: u32,
    mask_step: u32,
    mask_stream: u32,
}

// In-bounds input positions [x, y) of the window of output position `o` along one
// axis: padding is left out, so it can never win a max nor count in an average.
fn window_span(o: u32, stride: u32, pad: u32, window_size: u32, size: u32) -> vec2<u32> {
    let start = o * stride;
    let end = start + window_size;
    let lo = select(0u, start - pad, start >= pad);
    let hi = min(select(0u, end - pad, end >= pad), size);
    return vec2<u32>(lo, hi);
}

// Output positions [x, y) along one axis whose windows cover input position `i`.
fn covering_span(i: u32, stride: u32, pad: u32, window_size: u32, size_out: u32) -> vec2<u32> {
    let reach = i + pad + 1u;
    let lo = select(0u, (reach - window_size + stride - 1u) / stride, reach > window_size);
    let hi = min((i + pad) / stride + 1u, size_out);
    return vec2<u32>(min(lo, hi), hi);
}

// Where a flat NHWC index lies: image, row, column and channel.
struct NhwcPosition {
    n: u32,
    row: u32,
    col: u32,
    ch: u32,
}

// The position of flat NHWC index `i` in a tensor `rows x cols`.
fn nhwc_position(i: u32, rows: u32, cols: u32) -> NhwcPosition {
    let ch = i % params.c;
    let col = (i / params.c) % cols;
    let row = (i / (params.c * cols)) % rows;
    return NhwcPosition(i / (params.c * cols * rows), row, col, ch);
}

fn input_index(n: u32, r: u32, s: u32, ch: u32) -> u32 {
    return ((n * params.h + r) * params.w + s) * params.c + ch;
}

fn output_index(n: u32, oh: u32, ow: u32, ch: u32) -> u32 {
    return ((n * params.h_out + oh) * params.w_out + ow) * params.c + ch;
}
