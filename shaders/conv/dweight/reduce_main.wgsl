// dweight's reduce as a dispatch (dweight_reduce.wgsl).

@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(REDUCE_WORKGROUP)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) index: u32,
) {
    reduce(wid, index);
}
