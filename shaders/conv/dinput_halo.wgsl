// dinput of a stride-1, undilated conv as the forward of its transposed conv:
// dX = conv(dy, wt), wt the filter with its taps reversed and its channels
// swapped, padded R - 1 - PAD_TOP above and S - 1 - PAD_LEFT on the left. The
// shape constants are that conv's (H, W and C_IN are dy's; H_OUT, W_OUT and
// C_OUT are dX's), and the forward's halo kernel (forward_halo.wgsl) runs it,
// its accumulators starting from zero: no bias.

@group(0) @binding(0) var<storage, read> x: array<x_elem>;
@group(0) @binding(1) var<storage, read> w: array<w_elem>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

struct Params {
    n: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

// Row `red` = tap * C_IN + c of wt, its 8 columns from `col`, gathered from
// the conv's own filter w[tap, c_in, c_out] (here [tap, C_OUT, C_IN]):
//   wt[tap, c, col + j] = w[R * S - 1 - tap, col + j, c],
// C_IN apart. The weights are small and stay in cache; the gather spares a
// dispatch that would write wt.
fn load_b_run(z: u32, red: u32, col: u32) -> Run {
    let flipped_tap = R * S - 1u - red / C_IN;
    let first = (flipped_tap * C_OUT + col) * C_IN + red % C_IN;
    var run: Run;
    for (var j = 0u; j < 8u; j++) {
        run[j / 4u][j % 4u] = operand(w_at(first + j * C_IN));
    }
    return run;
}
