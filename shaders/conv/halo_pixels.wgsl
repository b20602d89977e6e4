// Where the halo kernels (forward_halo.wgsl, dweight_halo.wgsl) stage an
// input pixel and where a tile reads it. A block at least a tile wide stages
// one halo of HALO_H x HALO_W pixels (COPIES = 1): T outputs along a block row
// read T consecutive pixels of a halo row. A block narrower than a tile
// (whole rows of W_OUT < T outputs, T / W_OUT rows a tile) would read rows
// HALO_W apart, which no strided matrix load covers; so it stages S copies of
// HALO_H x W_OUT pixels (COPIES = S, HALO_W = W_OUT), copy s holding the halo's
// columns s .. s + W_OUT - 1. For tap (r, s) a tile's T pixels are then
// consecutive in copy s, from its row r + the tile's first row.

const HALO_PIXELS: u32 = COPIES * HALO_H * HALO_W;

// Staged pixel `pixel`'s row and column in the block's halo.
fn halo_source(pixel: u32) -> vec2<u32> {
    let copy = pixel / (HALO_H * HALO_W);
    let at = pixel % (HALO_H * HALO_W);
    return vec2<u32>(at / HALO_W, at % HALO_W + copy);
}

// The staged pixel that tap (r, s) of the output at block row `row`, column
// `col` reads.
fn halo_pixel(row: u32, col: u32, r: u32, s: u32) -> u32 {
    let copy = select(0u, s, COPIES > 1u);
    return (copy * HALO_H + row + r) * HALO_W + col + s - copy;
}
