// Forward: Out[M, C_out] = im2col(X)[M, K] x W[K, C_out] + bias, no im2col buffer.

@group(0) @binding(0) var<storage, read> x: array<x_elem>;
@group(0) @binding(1) var<storage, read> w: array<w_elem>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

struct Params {
    n: u32,
}
@group(0) @binding(4) var<uniform> params: Params;

fn gemm_rows(z: u32) -> u32 {
    return params.n * H_OUT * W_OUT;
}

fn gemm_cols() -> u32 {
    return C_OUT;
}

fn reduction_range(z: u32) -> vec2<u32> {
    return vec2<u32>(0u, R * S * C_IN);
}

fn load_a(z: u32, row: u32, red: u32) -> f32 {
    return im2col(row, red);
}

fn load_b(z: u32, red: u32, col: u32) -> f32 {
    return w_at(red * C_OUT + col);
}

// Runs for the coop core: A along K (channels of a tap), B along C_out.
fn load_a_run(z: u32, row: u32, red: u32) -> Run {
    return im2col_run_at(im2col_position(row), red);
}

fn load_b_run(z: u32, red: u32, col: u32) -> Run {
    return w_run(i32(red * C_OUT + col));
}

// Where C's element (row, col) lives in `y`, and the stride between C's rows.
fn c_index(z: u32, row: u32, col: u32) -> u32 {
    return row * C_OUT + col;
}

fn c_row_stride() -> u32 {
    return C_OUT;
}

fn store_c(z: u32, row: u32, col: u32, v: f32) {
    y[c_index(z, row, col)] = v + bias[col];
}
