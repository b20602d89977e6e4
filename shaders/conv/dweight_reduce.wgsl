// dweight, pass 2: sums the split-K slices in a fixed order (bit-identical runs,
// no float atomics) and splits the result into dW[K, C_out] and dbias[C_out].

@group(0) @binding(0) var<storage, read> partial: array<f32>;
@group(0) @binding(1) var<storage, read_write> dw: array<f32>;
@group(0) @binding(2) var<storage, read_write> dbias: array<f32>;

struct Params {
    splits: u32,
    row_stride: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    let weights = R * S * C_IN * C_OUT;
    let per_slice = weights + C_OUT;
    if (i >= per_slice) {
        return;
    }
    var sum = 0.0;
    for (var z = 0u; z < params.splits; z++) {
        sum += partial[z * per_slice + i];
    }
    if (i < weights) {
        dw[i] = sum;
    } else {
        dbias[i - weights] = sum;
    }
}
