// 1 where the row's argmax (first maximum on ties) equals its label, else 0;
// a label >= K is never correct. A separate pass sums the hits.

@group(0) @binding(0) var<storage, read> scores: array<f32>;
@group(0) @binding(1) var<storage, read> labels: array<u32>;
@group(0) @binding(2) var<storage, read_write> hits: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

fn input_value(i: u32) -> f32 {
    return scores[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * params.row_stride;
    if (row >= params.rows) {
        return;
    }
    let top = row_max(row * params.classes, params.classes);
    hits[row] = select(0u, 1u, top.index == labels[row]);
}
