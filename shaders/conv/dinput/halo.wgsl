// dinput of a stride-1, undilated conv as the forward of its transposed conv:
// dX = conv(dy, wt), wt the filter with its taps reversed and its channels
// swapped (flip_filter.wgsl), padded R - 1 - PAD_TOP above and S - 1 - PAD_LEFT
// on the left. The shape constants are that conv's (H, W and C_IN are dy's;
// H_OUT, W_OUT and C_OUT are dX's), and the forward's halo kernel
// (forward_halo.wgsl) runs it, its accumulators starting from zero: no bias.

@group(0) @binding(0) var<storage, read> x: array<x_elem>;
@group(0) @binding(1) var<storage, read> w: array<w_elem>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

struct Params {
    n: u32,
}
@group(0) @binding(3) var<uniform> params: Params;
