// Max pool forward with a spatial dropout folded in (MaxPool2d taking over the
// SpatialDropout after it): y = max * mask, where the mask of (image, channel)
// is ops::dropout's spatial mask, drawn once per workgroup (spatial_mask.wgsl).
// Bit-identical to max pooling then spatial dropout: the same max bits, the same
// f32 product. Appended to pool_max_forward.wgsl (its bindings and window_max).
// `main_dropout`: y as f32, an invocation per output.
// `main_dropout_f16`: y as f16 (f16_bits.wgsl, bit-exact with half of the f32
// product) for a conv after it that rounds its input anyway; an invocation per
// four channels (C % 4 == 0, the host checks), so it writes whole 8-byte words.

@group(0) @binding(1) var<storage, read_write> y_f16: array<vec2<u32>>;

fn pool_mask_draws() -> MaskDraws {
    return MaskDraws(
        params.mask_threshold,
        params.mask_scale,
        vec2(params.mask_key0, params.mask_key1),
        params.mask_step,
        params.mask_stream,
    );
}

// First output of this workgroup's invocations, each covering `per_lane`.
fn first_output(wid: vec3<u32>, per_lane: u32) -> u32 {
    return (wid.x + wid.y * (params.row_stride / 256u)) * 256u * per_lane;
}

@compute @workgroup_size(256)
fn main_dropout(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let span = params.h_out * params.w_out * params.c;
    let first = first_output(wid, 1u);
    let draws = pool_mask_draws();
    let first_map = first / span;
    let last_map = min(first + 255u, params.len - 1u) / span;
    let tabled = fill_mask_table(draws, first_map, last_map, params.c, lidx);
    workgroupBarrier();
    let o = first + lidx;
    if (o >= params.len) {
        return;
    }
    let best = window_max(o);
    let m = table_mask(draws, tabled, first_map, o / span, o % params.c, params.c);
    y[o] = bitcast<u32>(bitcast<f32>(best.x) * m);
    argmax[o] = best.y;
}

@compute @workgroup_size(256)
fn main_dropout_f16(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // Here `len` counts outputs; an invocation takes outputs 4q .. 4q + 3.
    let span = params.h_out * params.w_out * params.c;
    let first = first_output(wid, 4u);
    let draws = pool_mask_draws();
    let first_map = first / span;
    let last_map = min(first + 1023u, params.len - 1u) / span;
    let tabled = fill_mask_table(draws, first_map, last_map, params.c, lidx);
    workgroupBarrier();
    let o = first + 4u * lidx;
    if (o >= params.len) {
        return;
    }
    var v: vec4<f32>;
    for (var k = 0u; k < 4u; k++) {
        let best = window_max(o + k);
        let m = table_mask(draws, tabled, first_map, o / span, (o + k) % params.c, params.c);
        v[k] = bitcast<f32>(best.x) * m;
        argmax[o + k] = best.y;
    }
    let h = f16_bits4(bitcast<vec4<u32>>(v));
    y_f16[o / 4u] = vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
}
