// One level of a deterministic sum: workgroup w adds values[256 w .. 256 w + 255]
// by a fixed tree and writes sums[w]. Repeated until one value is left, so the
// order of additions depends only on the length, never on scheduling.
// The Rust side prepends `alias Elem = f32;` or `alias Elem = u32;`.

@group(0) @binding(0) var<storage, read> values: array<Elem>;
@group(0) @binding(1) var<storage, read_write> sums: array<Elem>;

struct SumParams {
    len: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: SumParams;

const WORKGROUP: u32 = 256u;
var<workgroup> partial: array<Elem, WORKGROUP>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let base = wid.x * WORKGROUP + wid.y * params.row_stride;
    let i = base + lid;
    var v = Elem(0);
    if (i < params.len) {
        v = values[i];
    }
    partial[lid] = v;
    for (var stride = WORKGROUP / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
    }
    // The folded grid may have spare workgroups past the end; they write nothing.
    if (lid == 0u && base < params.len) {
        sums[base / WORKGROUP] = partial[0];
    }
}
