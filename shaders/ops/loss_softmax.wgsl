// Row-wise softmax, one thread per row: y = exp(x - max) / sum exp(x - max).

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> probs: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

fn input_value(i: u32) -> f32 {
    return logits[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * params.row_stride;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.classes;
    let m = row_max(base, params.classes).value;
    var total = 0.0;
    for (var k = 0u; k < params.classes; k++) {
        let e = exp_of_difference(logits[base + k], m);
        probs[base + k] = e;
        total += e;
    }
    let norm = 1.0 / total;
    for (var k = 0u; k < params.classes; k++) {
        probs[base + k] *= norm;
    }
}
