// The filter of the transposed conv that dinput's halo kernel runs: taps in
// reverse order, input and output channels swapped,
//   wt[taps - 1 - tap, c_out, c_in] = w[tap, c_in, c_out],
// f16 in and out, two adjacent input channels of wt per u32 (c_in is even
// wherever the halo kernel runs). Reads the binding `w` (f16 bits, two per
// u32) of the kernel that includes it: flip_filter.wgsl on its own, or
// dweight_reduce_flip.wgsl beside dweight's reduce.

// The bits of f16 element i of w.
fn w_bits(i: u32) -> u32 {
    return (w[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
}

// u32 `pair` of wt: input channels 2 * pair % c_in and the next one.
fn flipped_pair(pair: u32, taps: u32, c_in: u32, c_out: u32) -> u32 {
    let ci = 2u * pair % c_in;
    let co = 2u * pair / c_in % c_out;
    let flipped_tap = 2u * pair / (c_in * c_out);
    let tap_ci = ((taps - 1u - flipped_tap) * c_in + ci) * c_out + co;
    return w_bits(tap_ci) | (w_bits(tap_ci + c_out) << 16u);
}
