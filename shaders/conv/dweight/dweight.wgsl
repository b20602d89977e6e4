// dweight, pass 1: partial[z][K + 1, C_out] = im2col(X)^T x dY over the z-th
// slice of the M reduction. Row K is a row of ones, so it holds sum(dY): dbias,
// fused into the same GEMM. Pass 2 (dweight_reduce) sums the slices in order.

@group(0) @binding(0) var<storage, read> x: array<x_elem>;
@group(0) @binding(1) var<storage, read> dy: array<dy_elem>;
@group(0) @binding(2) var<storage, read_write> partial: array<f32>;

struct Params {
    n: u32,
    // Reduction rows (of M) per split-K slice: a multiple of TILE_K.
    slice_len: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

fn gemm_rows(z: u32) -> u32 {
    return R * S * C_IN + 1u;
}

fn gemm_cols() -> u32 {
    return C_OUT;
}

fn reduction_range(z: u32) -> vec2<u32> {
    let m = params.n * H_OUT * W_OUT;
    let begin = min(z * params.slice_len, m);
    return vec2<u32>(begin, min(begin + params.slice_len, m));
}

fn load_a(z: u32, row: u32, red: u32) -> f32 {
    if (row == R * S * C_IN) {
        return 1.0;
    }
    return im2col(red, row);
}

fn load_b(z: u32, red: u32, col: u32) -> f32 {
    return dy_at(red * C_OUT + col);
}

// Runs for the coop core: A along its rows (channels of a tap, then the row of
// ones, which starts a run of its own since K % 8 == 0), B along C_out.
fn load_a_run(z: u32, row: u32, red: u32) -> Run {
    if (row == R * S * C_IN) {
        var ones: Run;
        ones[0][0] = operand(1.0);
        return ones;
    }
    return x_run(im2col_offset(red, row));
}

fn load_b_run(z: u32, red: u32, col: u32) -> Run {
    return dy_run(i32(red * C_OUT + col));
}

fn store_c(z: u32, row: u32, col: u32, v: f32) {
    partial[(z * (R * S * C_IN + 1u) + row) * C_OUT + col] = v;
}
