// A spatial dropout folded into a max pool (spatial_mask.wgsl's table, on the
// pool's outputs): its draws come in the pool's Params, and a map is an image's
// h_out x w_out x C outputs. Prepended after pool_common.wgsl and
// spatial_mask.wgsl.

fn pool_mask_draws() -> MaskDraws {
    return MaskDraws(
        params.mask_threshold,
        params.mask_scale,
        vec2(params.mask_key0, params.mask_key1),
        params.mask_step,
        params.mask_stream,
    );
}

// Draws the masks of the images that outputs first .. first + count - 1 lie
// in (see fill_mask_table: every invocation calls it, a barrier follows).
fn fill_pool_masks(first: u32, count: u32, lane: u32) -> bool {
    let span = params.h_out * params.w_out * params.c;
    let last = min(first + count - 1u, params.len - 1u);
    return fill_mask_table(pool_mask_draws(), first / span, last / span, params.c, lane);
}

// An invocation of a folded kernel: its workgroup's first output and whether
// the masks are tabled (pool_mask's arguments), its own first output `o`, and
// whether it has any.
struct PoolLane {
    first: u32,
    tabled: bool,
    o: u32,
    live: bool,
}

// Lane `lidx` of a workgroup of 256 invocations, each taking `per_lane`
// consecutive outputs, after drawing the workgroup's masks: every invocation
// calls it from uniform control flow, and a barrier follows before the masks
// are read.
fn pool_lane(wid: vec3<u32>, lidx: u32, per_lane: u32) -> PoolLane {
    let first = first_invocation(wid, params.row_stride) * per_lane;
    let tabled = fill_pool_masks(first, 256u * per_lane, lidx);
    let o = first + per_lane * lidx;
    return PoolLane(first, tabled, o, o < params.len);
}

// The mask of output `o` of a workgroup whose first output is `first`.
fn pool_mask(tabled: bool, first: u32, o: u32) -> f32 {
    let span = params.h_out * params.w_out * params.c;
    return table_mask(pool_mask_draws(), tabled, first / span, o / span, o % params.c, params.c);
}

// The masks of outputs o .. o + 3 (four channels of one pixel).
fn pool_masks4(tabled: bool, first: u32, o: u32) -> vec4<f32> {
    var m: vec4<f32>;
    for (var k = 0u; k < 4u; k++) {
        m[k] = pool_mask(tabled, first, o + k);
    }
    return m;
}

// Whether the dropout keeps every value unscaled (rate 0): the max is then y
// itself, as the separate dropout returns its input at rate 0. A product by
// 1.0 would give the same values but not always the same NaN bits (NVIDIA
// returns its own NaN for NaN * 1.0).
fn mask_is_identity() -> bool {
    return params.mask_threshold == 0u && params.mask_scale == 1.0;
}
