// The Adam step (adam_update.wgsl) over the packed parameters.

@group(0) @binding(0) var<storage, read> grads: array<f32>;
@group(0) @binding(1) var<storage, read_write> params: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read> segments: array<Segment>;
@group(0) @binding(5) var<uniform> step: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * step.row_stride;
    if (i < step.len) {
        update(i);
    }
}
