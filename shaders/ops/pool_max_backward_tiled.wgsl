// Max pool backward where the windows partition the input (stride = filter, no
// padding, as the usual 2x2/2 pool): one invocation per output element writes
// the whole window, dy at its argmax and 0 elsewhere. Rows and columns no
// window reaches (an odd input under a 2x2/2 pool: fewer than a stride of
// them, at the far edges) go to the last window of their row or column, as
// zeros. Every dx element is written exactly once, and the window's index math
// is done once instead of once per input element. The result is bit-identical to the
// gather (pool_max_backward.wgsl): there each element sums 0.0 + dy, so -0.0
// becomes +0.0 here too, on the bits (drivers need not keep signed zeros).
// The `_f16` entry points store dx as f16 for a conv before that rounds its
// output gradient to f16 anyway: clipped to +-65504 and rounded as the conv's
// cast would (f16_bits.wgsl), four channels of one pixel in 8 bytes, and the
// loss scaler's flag raised where a value saturates (pool_grad_flag.wgsl; or
// pool_grad_unflagged.wgsl, which binds only the parameters).

@group(0) @binding(0) var<storage, read> dy: array<f32>;
@group(0) @binding(1) var<storage, read> argmax: array<u32>;
@group(0) @binding(2) var<storage, read_write> dx: array<f32>;
// The four-channel entry points' views: four channels of one pixel at a time.
@group(0) @binding(0) var<storage, read> dy4: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> argmax4: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dx4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dx16: array<vec2<u32>>;

// The input rows (x) and columns (y) output position `at`'s window writes:
// its filter, and for the last window of an axis the leftover past it too.
fn owned_extent(at: NhwcPosition) -> vec2<u32> {
    let rows = select(params.filter_h, params.h - at.row * params.stride_h, at.row + 1u == params.h_out);
    let cols = select(params.filter_w, params.w - at.col * params.stride_w, at.col + 1u == params.w_out);
    return vec2<u32>(rows, cols);
}

// Writes output `o`'s window of dx: gradient `g` at `winner` (the window's
// argmax), 0 elsewhere.
fn scatter_window(o: u32, g: f32, winner: u32) {
    let at = nhwc_position(o, params.h_out, params.w_out);
    let grad = select(g, 0.0, bitcast<u32>(g) == 0x80000000u);
    let extent = owned_extent(at);
    for (var r = 0u; r < extent.x; r++) {
        for (var s = 0u; s < extent.y; s++) {
            let i = input_index(at.n, at.row * params.stride_h + r, at.col * params.stride_w + s, at.ch);
            dx[i] = select(0.0, grad, i == winner);
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x + gid.y * params.row_stride;
    if (o < params.len) {
        scatter_window(o, dy[o], argmax[o]);
    }
}

// `main` after a folded spatial dropout (pool_max_forward_dropout.wgsl): dy
// times the (image, channel) mask first, as the dropout's backward would have
// given it, the masks drawn once per workgroup (pool_mask.wgsl).
@compute @workgroup_size(256)
fn main_dropout(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let lane = pool_lane(wid, lidx, 1u);
    // Before the barrier: dy and the argmax load while the table's draws run
    // (docs/lab/perf-notes.md, entry 69).
    var g = 0.0;
    var winner = 0u;
    if (lane.live) {
        g = dy[lane.o];
        winner = argmax[lane.o];
    }
    workgroupBarrier();
    if (lane.live) {
        scatter_window(lane.o, g * pool_mask(lane.tabled, lane.first, lane.o), winner);
    }
}

// `main_dropout` for four channels of one pixel an invocation (C % 4 == 0,
// the host checks): 16-byte loads and stores, the same bits per channel.
@compute @workgroup_size(256)
fn main_dropout4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // Here `len` counts outputs; an invocation takes outputs o .. o + 3.
    let lane = pool_lane(wid, lidx, 4u);
    let o = lane.o;
    var g = vec4(0.0);
    var winner = vec4(0u);
    if (lane.live) {
        g = dy4[o / 4u];
        winner = argmax4[o / 4u];
    }
    workgroupBarrier();
    if (!lane.live) {
        return;
    }
    let masked = g * pool_masks4(lane.tabled, lane.first, o);
    let grad = select(masked, vec4(0.0), bitcast<vec4<u32>>(masked) == vec4(0x80000000u));
    let at = nhwc_position(o, params.h_out, params.w_out);
    let lanes = vec4(0u, 1u, 2u, 3u);
    let extent = owned_extent(at);
    for (var r = 0u; r < extent.x; r++) {
        for (var s = 0u; s < extent.y; s++) {
            let i = input_index(at.n, at.row * params.stride_h + r, at.col * params.stride_w + s, at.ch);
            dx4[i / 4u] = select(vec4(0.0), grad, vec4(i) + lanes == winner);
        }
    }
}

// Writes outputs o .. o + 3's windows of dx as f16: gradient `g` at `winner`,
// +0 elsewhere, flagging the loss scaler where `g` saturates.
fn scatter_windows4_f16(o: u32, g: vec4<f32>, winner: vec4<u32>) {
    let bits = bitcast<vec4<u32>>(g);
    let grad = select(bits, vec4(0u), bits == vec4(0x80000000u));
    let halves = f16_bits4(clip_f16_range4(grad));
    flag_saturation(halves);
    let at = nhwc_position(o, params.h_out, params.w_out);
    let lanes = vec4(0u, 1u, 2u, 3u);
    let extent = owned_extent(at);
    for (var r = 0u; r < extent.x; r++) {
        for (var s = 0u; s < extent.y; s++) {
            let i = input_index(at.n, at.row * params.stride_h + r, at.col * params.stride_w + s, at.ch);
            let h = select(vec4(0u), halves, vec4(i) + lanes == winner);
            dx16[i / 4u] = vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
        }
    }
}

// `main` four channels of one pixel an invocation (C % 4 == 0, the host
// checks; `len` counts outputs), dx as f16.
@compute @workgroup_size(256)
fn main4_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = 4u * (gid.x + gid.y * params.row_stride);
    if (o < params.len) {
        scatter_windows4_f16(o, dy4[o / 4u], argmax4[o / 4u]);
    }
}

// `main_dropout4`, dx as f16.
@compute @workgroup_size(256)
fn main_dropout4_f16(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let lane = pool_lane(wid, lidx, 4u);
    var g = vec4(0.0);
    var winner = vec4(0u);
    if (lane.live) {
        g = dy4[lane.o / 4u];
        winner = argmax4[lane.o / 4u];
    }
    workgroupBarrier();
    if (lane.live) {
        scatter_windows4_f16(lane.o, g * pool_masks4(lane.tabled, lane.first, lane.o), winner);
    }
}
