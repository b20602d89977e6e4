// The flipped filter (flip_pair.wgsl) as a dispatch of its own: what
// conv2d_dinput records before dinput's halo kernel where no dweight reduce
// of the same backward wrote it (dweight_reduce_flip.wgsl).

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read_write> wt: array<u32>;

struct Params {
    taps: u32,
    c_in: u32,
    c_out: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let pair = gid.x + gid.y * params.row_stride;
    if (pair < params.taps * params.c_in * params.c_out / 2u) {
        wt[pair] = flipped_pair(pair, params.taps, params.c_in, params.c_out);
    }
}
