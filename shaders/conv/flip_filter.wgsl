// The filter of the transposed conv that dinput's halo kernel runs: taps in
// reverse order, input and output channels swapped,
//   wt[R * S - 1 - tap, c_out, c_in] = w[tap, c_in, c_out],
// f16 in and out. Each invocation writes two adjacent input channels as one
// u32 (C_IN is even wherever the halo kernel runs).

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read_write> wt: array<u32>;

struct Params {
    taps: u32,
    c_in: u32,
    c_out: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

// The bits of f16 element i of w.
fn w_bits(i: u32) -> u32 {
    return (w[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let pair = gid.x + gid.y * params.row_stride;
    let ci = 2u * pair % params.c_in;
    let co = 2u * pair / params.c_in % params.c_out;
    let flipped_tap = 2u * pair / (params.c_in * params.c_out);
    if (flipped_tap < params.taps) {
        let tap_ci = ((params.taps - 1u - flipped_tap) * params.c_in + ci) * params.c_out + co;
        wt[pair] = w_bits(tap_ci) | (w_bits(tap_ci + params.c_out) << 16u);
    }
}
