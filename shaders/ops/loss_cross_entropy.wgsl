// Categorical cross-entropy on probabilities, one thread per row, p clipped to
// [1e-7, 1 - 1e-7] as Aether-ML does:
//   loss_row = -sum_k t_k log p_k,  dprobs_k = -t_k / p_k / N * S
// (S the loss scale, 1 unless SCALED).
// A label >= K matches no class: its target is s / K everywhere.
// Each row writes loss_row / N; a separate pass sums them in a fixed order.

@group(0) @binding(0) var<storage, read> probs: array<f32>;
@group(0) @binding(1) var<storage, read> labels: array<u32>;
@group(0) @binding(2) var<storage, read_write> dprobs: array<f32>;
@group(0) @binding(3) var<storage, read_write> row_losses: array<f32>;
// The loss scale S as f32 bits in word 0, read where SCALED is 1 (see
// loss_softmax_cross_entropy_row.wgsl).
@group(0) @binding(4) var<storage, read> scale_state: array<u32>;
@group(0) @binding(5) var<uniform> params: Params;

override SCALED: u32 = 0u;

const P_MIN: f32 = 1e-7;
const P_MAX: f32 = 1.0 - 1e-7;

fn input_value(i: u32) -> f32 {
    return probs[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * params.row_stride;
    if (row >= params.rows) {
        return;
    }
    let classes = params.classes;
    let base = row * classes;
    let label = labels[row];
    let s = params.smoothing;
    let off_target = s / f32(classes);
    let on_target = (1.0 - s) + off_target;
    let inv_rows = 1.0 / f32(params.rows);
    var grad_scale = 1.0;
    if (SCALED == 1u) {
        grad_scale = bitcast<f32>(scale_state[0]);
    }
    var loss = 0.0;
    for (var k = 0u; k < classes; k++) {
        let p = clamp(probs[base + k], P_MIN, P_MAX);
        let t = select(off_target, on_target, k == label);
        loss -= t * log_probability(p);
        dprobs[base + k] = (-(t / p) * inv_rows) * grad_scale;
    }
    row_losses[row] = loss * inv_rows;
}
