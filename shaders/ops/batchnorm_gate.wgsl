// Where the optimizer's gate is closed (a step with a non-finite loss or
// gradient, see optim/finite_check.wgsl), the running statistics a training
// forward proposed are replaced by the ones from before it, in place: the
// layer then keeps them either way, and no host waits for the gate.

@group(0) @binding(0) var<storage, read> old_mean: array<f32>;
@group(0) @binding(1) var<storage, read> old_var: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<u32>;
@group(0) @binding(3) var<storage, read_write> new_mean: array<f32>;
@group(0) @binding(4) var<storage, read_write> new_var: array<f32>;

struct Params {
    channels: u32,
    row_stride: u32,
}
@group(0) @binding(5) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x + gid.y * params.row_stride;
    if (c >= params.channels || gate[0] == 0xffffffffu) {
        return;
    }
    new_mean[c] = old_mean[c];
    new_var[c] = old_var[c];
}
