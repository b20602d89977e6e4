// Regularization loss sum(l1 * |p| + l2 * p^2) over all packed parameters, pass 1
// of 2: each workgroup reduces its 256 elements in a fixed tree order into one
// partial; sum_in_order.wgsl then adds the partials in index order, so the loss
// is deterministic.

@group(0) @binding(0) var<storage, read> params: array<f32>;
@group(0) @binding(1) var<storage, read> segments: array<Segment>;
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;

struct Params {
    len: u32,
    segment_count: u32,
}
@group(0) @binding(3) var<uniform> sizes: Params;

var<workgroup> scratch: array<f32, 256>;

fn penalty(i: u32) -> f32 {
    let seg = segment_of(i, sizes.segment_count);
    let p = params[i];
    return seg.l1 * abs(p) + seg.l2 * p * p;
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * groups.x;
    let i = group * 256u + lid;
    scratch[lid] = select(0.0, penalty(min(i, sizes.len - 1u)), i < sizes.len);
    workgroupBarrier();
    for (var width = 128u; width > 0u; width /= 2u) {
        if (lid < width) {
            scratch[lid] += scratch[lid + width];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        partials[group] = scratch[0];
    }
}
