// Batch norm, pass 2 of every reduction: one invocation per channel sums the
// chunk partials in chunk order (deterministic) and finishes the statistic:
// mode 0: mean = sum / count; mode 1: inv_std = 1 / sqrt(sum / count + eps);
// mode 2: the plain sum (dgamma, dbeta).

@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

struct Params {
    channels: u32,
    chunks: u32,
    count: u32,
    eps: f32,
    mode: u32,
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x + gid.y * params.row_stride;
    if (c >= params.channels) {
        return;
    }
    var sum = 0.0;
    for (var k = 0u; k < params.chunks; k++) {
        sum += partials[k * params.channels + c];
    }
    let count = f32(params.count);
    switch params.mode {
        case 0u: {
            out[c] = sum / count;
        }
        case 1u: {
            out[c] = 1.0 / sqrt(sum / count + params.eps);
        }
        default: {
            out[c] = sum;
        }
    }
}
