// y = relu(x), leaky_relu(x), gelu(x) or silu(x) (entry points `relu`,
// `leaky_relu`, `gelu`, `silu`) stored as f16, for a consumer that rounds its
// input to f16 anyway (a conv with f16 kernels): eight elements an invocation
// in four words, element 2i in the low half of word i, saturated at +-65504
// and rounded as half::f16::from_f32, NaN kept (f16_bits.wgsl's cast_group),
// so the consumer sees the values it would have rounded to. Each value is the
// f32 kernels': ReLU on the bits (relu.wgsl, relu_bits.wgsl), leaky ReLU as
// activation_leaky_relu.wgsl, the smooth ones by
// activation_smooth_common.wgsl, prepended.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<u32>>;

struct Params {
    len: u32,
    // Groups of eight per row of the dispatch grid.
    row_stride: u32,
    // Leaky ReLU's slope below zero (0 for the others).
    alpha: f32,
}
@group(0) @binding(2) var<uniform> params: Params;

const ACT_RELU: u32 = 0u;
const ACT_LEAKY_RELU: u32 = 1u;
const ACT_GELU: u32 = 2u;
const ACT_SILU: u32 = 3u;

fn activation_of(v: f32, kind: u32) -> f32 {
    switch kind {
        case ACT_RELU: {
            let b = bitcast<u32>(v);
            return bitcast<f32>(select(b, 0u, is_negative(b)));
        }
        case ACT_LEAKY_RELU: {
            return select(params.alpha * v, v, v > 0.0);
        }
        case ACT_GELU: {
            return gelu_of(v);
        }
        default: {
            return silu_of(v);
        }
    }
}

// Group `g`'s eight outputs. Elements past `len` read the pooled buffer's
// padding (every buffer is whole 256-byte granules) and are written as 0.
fn write_group(g: u32, kind: u32) {
    let first = g * 8u;
    if (first >= params.len) {
        return;
    }
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        v[j] = activation_of(x[first + j], kind);
    }
    let lo = bitcast<vec4<u32>>(vec4(v[0], v[1], v[2], v[3]));
    let hi = bitcast<vec4<u32>>(vec4(v[4], v[5], v[6], v[7]));
    y[g] = cast_group(lo, hi, first, params.len, true);
}

@compute @workgroup_size(256)
fn relu(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, ACT_RELU);
}

@compute @workgroup_size(256)
fn leaky_relu(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, ACT_LEAKY_RELU);
}

@compute @workgroup_size(256)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, ACT_GELU);
}

@compute @workgroup_size(256)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, ACT_SILU);
}
