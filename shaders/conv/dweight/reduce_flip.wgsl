// dweight's reduce (dweight_reduce.wgsl) and, in the same dispatch, the
// flipped filter that the same backward's dinput halo kernel reads
// (flip_pair.wgsl), from the f16 weights `w`: one dispatch fewer than
// flip_filter.wgsl on its own. Each invocation writes the pairs (half an
// output of dW each) its flat index reaches in steps of the whole grid's.

@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read_write> wt: array<u32>;
@group(0) @binding(5) var<uniform> params: Params;

@compute @workgroup_size(REDUCE_WORKGROUP)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) index: u32,
) {
    reduce(wid, index);
    let invocations = groups.x * groups.y * REDUCE_WORKGROUP;
    let first = (wid.x + wid.y * groups.x) * REDUCE_WORKGROUP + index;
    for (var pair = first; pair < R * S * C_IN * C_OUT / 2u; pair += invocations) {
        wt[pair] = flipped_pair(pair, R * S, C_IN, C_OUT);
    }
}
