// Batch norm running statistics (Keras convention):
// running = momentum * running + (1 - momentum) * batch, the batch variance
// recovered as 1 / inv_std^2 - eps and scaled by count / (count - 1) (unbiased).

@group(0) @binding(0) var<storage, read> running_mean: array<f32>;
@group(0) @binding(1) var<storage, read> running_var: array<f32>;
@group(0) @binding(2) var<storage, read> mean: array<f32>;
@group(0) @binding(3) var<storage, read> inv_std: array<f32>;
@group(0) @binding(4) var<storage, read_write> new_mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> new_var: array<f32>;

struct Params {
    channels: u32,
    row_stride: u32,
    momentum: f32,
    eps: f32,
    unbiased_scale: f32,
}
@group(0) @binding(6) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x + gid.y * params.row_stride;
    if (c >= params.channels) {
        return;
    }
    let s = inv_std[c];
    let batch_var = max(1.0 / (s * s) - params.eps, 0.0) * params.unbiased_scale;
    let keep = params.momentum;
    new_mean[c] = keep * running_mean[c] + (1.0 - keep) * mean[c];
    new_var[c] = keep * running_var[c] + (1.0 - keep) * batch_var;
}
