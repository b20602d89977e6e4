// An activation's backward storing dx as f16, for a conv before it that rounds
// its output gradient to f16 anyway: eight elements an invocation in four
// words (element 2i in the low half of word i), clipped to +-65504 and rounded
// as the conv's cast rounds them (f16_bits.wgsl's cast_group), and the loss
// scaler's flag raised where one saturates (activation_grad_flag.wgsl, or
// activation_grad_unflagged.wgsl, which binds only the parameters). Each
// value is the f32 kernels' (activation_relu_backward.wgsl,
// activation_leaky_relu_backward.wgsl, activation_smooth_backward.wgsl): x > 0
// on the bits (relu_bits.wgsl), the smooth slopes of
// activation_smooth_common.wgsl, both prepended. Elements past `len` read the
// pooled buffers' padding (every buffer is whole 256-byte granules) and are
// written as 0.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> dx: array<vec4<u32>>;

struct Params {
    len: u32,
    // Groups of eight per row of the dispatch grid.
    row_stride: u32,
    // Leaky ReLU's slope below zero (0 for the others).
    alpha: f32,
}

const GRAD_RELU: u32 = 0u;
const GRAD_LEAKY_RELU: u32 = 1u;
const GRAD_GELU: u32 = 2u;
const GRAD_SILU: u32 = 3u;

fn grad_of(i: u32, kind: u32) -> f32 {
    let v = x[i];
    let d = dy[i];
    switch kind {
        case GRAD_RELU: {
            return select(0.0, d, is_positive(bitcast<u32>(v)));
        }
        case GRAD_LEAKY_RELU: {
            return select(params.alpha * d, d, is_positive(bitcast<u32>(v)));
        }
        case GRAD_GELU: {
            return d * gelu_slope(v);
        }
        default: {
            return d * silu_slope(v);
        }
    }
}

fn write_group(g: u32, kind: u32) {
    let first = g * 8u;
    if (first >= params.len) {
        return;
    }
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        v[j] = grad_of(first + j, kind);
    }
    let lo = bitcast<vec4<u32>>(vec4(v[0], v[1], v[2], v[3]));
    let hi = bitcast<vec4<u32>>(vec4(v[4], v[5], v[6], v[7]));
    let words = cast_group(lo, hi, first, params.len, true);
    dx[g] = words;
    flag_saturation(words);
}

@compute @workgroup_size(256)
fn relu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, GRAD_RELU);
}

@compute @workgroup_size(256)
fn leaky_relu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, GRAD_LEAKY_RELU);
}

@compute @workgroup_size(256)
fn gelu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, GRAD_GELU);
}

@compute @workgroup_size(256)
fn silu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, GRAD_SILU);
}
