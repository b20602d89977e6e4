// Max pool forward with a spatial dropout folded in (MaxPool2d taking over the
// SpatialDropout after it): y = max * mask, where the mask of (image, channel)
// is ops::dropout's spatial mask, drawn once per workgroup (pool_mask.wgsl).
// Bit-identical to max pooling then spatial dropout: the same max bits, the same
// f32 product. Appended to pool_max_forward.wgsl (its bindings and window_max).
// `main_dropout`: y as f32, an invocation per output.
// `main_dropout_f16`: y as f16 (f16_bits.wgsl, bit-exact with half of the f32
// product) for a conv after it that rounds its input anyway; an invocation per
// four channels (C % 4 == 0, the host checks), so it writes whole 8-byte words.

@group(0) @binding(1) var<storage, read_write> y_f16: array<vec2<u32>>;

@compute @workgroup_size(256)
fn main_dropout(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let first = first_output(wid, 1u);
    let tabled = fill_pool_masks(first, 256u, lidx);
    workgroupBarrier();
    let o = first + lidx;
    if (o >= params.len) {
        return;
    }
    let best = window_max(o);
    y[o] = bitcast<u32>(bitcast<f32>(best.x) * pool_mask(tabled, first, o));
    argmax[o] = best.y;
}

@compute @workgroup_size(256)
fn main_dropout_f16(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // Here `len` counts outputs; an invocation takes outputs o .. o + 3.
    let first = first_output(wid, 4u);
    let tabled = fill_pool_masks(first, 1024u, lidx);
    workgroupBarrier();
    let o = first + 4u * lidx;
    if (o >= params.len) {
        return;
    }
    var v: vec4<f32>;
    for (var k = 0u; k < 4u; k++) {
        let best = window_max(o + k);
        v[k] = bitcast<f32>(best.x) * pool_mask(tabled, first, o + k);
        argmax[o + k] = best.y;
    }
    let h = f16_bits4(bitcast<vec4<u32>>(v));
    y_f16[o / 4u] = vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
}
