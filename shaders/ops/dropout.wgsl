// Inverted dropout with a Philox4x32-10 mask, bit-identical to the CPU path in
// src/ops/dropout.rs (which documents the contract), and its backward pass.
//
// `main`: mask[i] = 0 when the draw falls below drop_threshold, else scale;
// y[i] = x[i] * mask[i]. Element i uses draw (i / map_span) * channels +
// i % channels: i itself for elementwise dropout (map_span = channels = 1),
// n * C + c for spatial dropout (map_span = H * W * C, channels = C).
// An invocation takes one draw to up to PIXELS_PER_DRAW elements of it, one per
// pixel, so spatial dropout runs Philox's ten rounds once per 8 pixels, not
// per element: lane (map, pixel block, channel), adjacent lanes adjacent
// channels, so the loads stay contiguous.
// `main_f16`: `main` with y stored as f16 (f16_bits.wgsl, bit-exact with
// half::f16::from_f32 of the f32 product), for a conv that rounds its input
// to f16 anyway. An invocation takes four adjacent channels (C % 4 == 0, the
// host checks) of PIXELS_PER_LANE_F16 pixels, so it moves whole 16-byte words
// of x and the mask and 8-byte words of y, and enough invocations run to hide
// their loads' latency; its workgroup draws the masks once (spatial_mask.wgsl).
// `backward`: dx[i] = dy[i] * mask[i].
//
// The entry points bind input at 0, the mask at 1 (written by `main` and
// `main_f16`, read by `backward`) and output at 2, and share one uniform block.

@group(0) @binding(0) var<storage, read> input: array<f32>;
@group(0) @binding(0) var<storage, read> input4: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> mask_out: array<f32>;
@group(0) @binding(1) var<storage, read_write> mask_out4: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> mask_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> output: array<f32>;
// Four f16s of y a word pair, element 4i + 2j in the low half of word j.
@group(0) @binding(2) var<storage, read_write> output_f16: array<vec2<u32>>;

struct Params {
    len: u32,
    row_stride: u32,
    drop_threshold: u32,
    scale: f32,
    key0: u32,
    key1: u32,
    step: u32,
    stream: u32,
    channels: u32,
    map_span: u32,
    // Invocations per map: ceil(pixels / PIXELS_PER_DRAW) * channels
    // (ceil(pixels / PIXELS_PER_LANE_F16) * channels / 4 for `main_f16`).
    map_lanes: u32,
}
@group(0) @binding(3) var<uniform> params: Params;


const PIXELS_PER_DRAW: u32 = 8u;
const PIXELS_PER_LANE_F16: u32 = 4u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let lane = gid.x + gid.y * params.row_stride;
    // Here `len` counts invocations: maps * map_lanes.
    if (lane >= params.len) {
        return;
    }
    let map = lane / params.map_lanes;
    let c = lane % params.channels;
    let first_pixel = (lane % params.map_lanes) / params.channels * PIXELS_PER_DRAW;
    let pixels = params.map_span / params.channels;
    var m = params.scale;
    if (params.drop_threshold != 0u) {
        let bits = philox_lane0(
            vec4<u32>(map * params.channels + c, params.step, params.stream, 0u),
            vec2<u32>(params.key0, params.key1),
        );
        m = select(params.scale, 0.0, bits < params.drop_threshold);
    }
    let end = min(first_pixel + PIXELS_PER_DRAW, pixels);
    for (var p = first_pixel; p < end; p++) {
        let i = map * params.map_span + p * params.channels + c;
        mask_out[i] = m;
        output[i] = input[i] * m;
    }
}

@compute @workgroup_size(256)
fn main_f16(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let first_lane = first_invocation(wid, params.row_stride);
    let lane = first_lane + lidx;
    let draws = MaskDraws(
        params.drop_threshold,
        params.scale,
        vec2(params.key0, params.key1),
        params.step,
        params.stream,
    );
    let first_map = first_lane / params.map_lanes;
    let last_map = min(first_lane + 255u, params.len - 1u) / params.map_lanes;
    let tabled = fill_mask_table(draws, first_map, last_map, params.channels, lidx);
    workgroupBarrier();
    if (lane >= params.len) {
        return;
    }
    let quads = params.channels / 4u;
    let map = lane / params.map_lanes;
    let c = lane % quads * 4u;
    let first_pixel = (lane % params.map_lanes) / quads * PIXELS_PER_LANE_F16;
    let pixels = params.map_span / params.channels;
    var m: vec4<f32>;
    for (var k = 0u; k < 4u; k++) {
        m[k] = table_mask(draws, tabled, first_map, map, c + k, params.channels);
    }
    let end = min(first_pixel + PIXELS_PER_LANE_F16, pixels);
    for (var p = first_pixel; p < end; p++) {
        let i4 = (map * params.map_span + p * params.channels + c) / 4u;
        mask_out4[i4] = m;
        let h = f16_bits4(clip_f16_range4(bitcast<vec4<u32>>(input4[i4] * m)));
        output_f16[i4] = vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
    }
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i < params.len) {
        output[i] = input[i] * mask_in[i];
    }
}
