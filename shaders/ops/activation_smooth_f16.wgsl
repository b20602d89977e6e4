// y = gelu(x) or silu(x) (entry points `gelu`, `silu`) stored as f16, for a
// consumer that rounds its input to f16 anyway (a conv with f16 kernels): eight
// elements an invocation in four words, element 2i in the low half of word i,
// saturated at +-65504 and rounded as half::f16::from_f32, NaN kept
// (f16_bits.wgsl's cast_group), so the consumer sees the values it would have
// rounded to. The helpers come from activation_smooth_common.wgsl, prepended.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<u32>>;

struct Params {
    len: u32,
    // Groups of eight per row of the dispatch grid.
    row_stride: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

// Group `g`'s eight outputs. Elements past `len` read the pooled buffer's
// padding (every buffer is whole 256-byte granules) and are written as 0.
fn write_group(g: u32, silu: bool) {
    let first = g * 8u;
    if (first >= params.len) {
        return;
    }
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let xv = x[first + j];
        if (silu) {
            v[j] = silu_of(xv);
        } else {
            v[j] = gelu_of(xv);
        }
    }
    let lo = bitcast<vec4<u32>>(vec4(v[0], v[1], v[2], v[3]));
    let hi = bitcast<vec4<u32>>(vec4(v[4], v[5], v[6], v[7]));
    y[g] = cast_group(lo, hi, first, params.len, true);
}

@compute @workgroup_size(256)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, false);
}

@compute @workgroup_size(256)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>) {
    write_group(gid.x + gid.y * params.row_stride, true);
}
