// Softmax backward, one thread per row: dx = p * (dp - sum(dp * p)).
//
// For a near one-hot p, dp_k - sum(dp * p) is a small difference of large terms.
// So it is formed around the dominant class a instead:
//   dp_k - sum(dp * p) = (dp_k - dp_a) + c,
//   c = dp_a (1 - sum p) + sum_{j != a} p_j (dp_a - dp_j),
// with 1 - sum p = (1 - p_a) - sum_{j != a} p_j (1 - p_a is exact for p_a >= 0.5):
// every term is then about as small as the result.

@group(0) @binding(0) var<storage, read> probs: array<f32>;
@group(0) @binding(1) var<storage, read> dprobs: array<f32>;
@group(0) @binding(2) var<storage, read_write> dlogits: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

fn input_value(i: u32) -> f32 {
    return probs[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * params.row_stride;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.classes;
    let top = row_max(base, params.classes);
    let p_top = top.value;
    let dp_top = dprobs[base + top.index];
    var other_mass = 0.0;
    var spread = 0.0;
    for (var k = 0u; k < params.classes; k++) {
        if (k != top.index) {
            let p = probs[base + k];
            other_mass += p;
            spread += p * (dp_top - dprobs[base + k]);
        }
    }
    let c = dp_top * ((1.0 - p_top) - other_mass) + spread;
    for (var k = 0u; k < params.classes; k++) {
        dlogits[base + k] = probs[base + k] * ((dprobs[base + k] - dp_top) + c);
    }
}
