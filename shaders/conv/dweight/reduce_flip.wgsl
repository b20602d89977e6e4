// dweight's reduce (dweight_reduce.wgsl) and, in the same dispatch, the
// flipped filter that the same backward's dinput halo kernel reads
// (flip_pair.wgsl), from the f16 weights `w`: one dispatch fewer than
// flip_filter.wgsl on its own. The reduce has more invocations (8 per output
// of dW and dbias) than wt has u32 pairs (half an output of dW each).

@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read_write> wt: array<u32>;
@group(0) @binding(5) var<uniform> params: Params;

@compute @workgroup_size(REDUCE_WORKGROUP)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) index: u32,
) {
    let group = wid.x + wid.y * params.row_stride;
    reduce_slices(group, index);
    let pair = group * REDUCE_WORKGROUP + index;
    if (pair < R * S * C_IN * C_OUT / 2u) {
        wt[pair] = flipped_pair(pair, R * S, C_IN, C_OUT);
    }
}
