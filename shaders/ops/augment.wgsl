// Random crop of the zero-padded image and random horizontal flip, per image of
// an NHWC batch (the CIFAR recipe), drawn from Philox so the CPU path gives the
// same crops. One u32 per image: dy = r % (2 pad + 1), dx = (r >> 8) % (2 pad + 1),
// flip = r >> 31; the output pixel (y, x) reads (y + dy - pad, x' + dx - pad)
// with x' = W - 1 - x when flipped, and 0 outside the image. `Elem` (f32 or
// f16) is aliased before this file.

@group(0) @binding(0) var<storage, read> input: array<Elem>;
@group(0) @binding(1) var<storage, read_write> output: array<Elem>;

struct Params {
    len: u32,
    row_stride: u32,
    height: u32,
    width: u32,
    channels: u32,
    pad: u32,
    key_lo: u32,
    key_hi: u32,
    step: u32,
    stream: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row_stride;
    if (i >= params.len) {
        return;
    }
    let c = i % params.channels;
    let x = (i / params.channels) % params.width;
    let y = (i / (params.channels * params.width)) % params.height;
    let n = i / (params.channels * params.width * params.height);
    let r = philox_lane0(vec4<u32>(n, params.step, params.stream, 0u), vec2<u32>(params.key_lo, params.key_hi));
    let span = 2u * params.pad + 1u;
    let dy = r % span;
    let dx = (r >> 8u) % span;
    let cx = select(x, params.width - 1u - x, (r >> 31u) == 1u);
    let sy = i32(y + dy) - i32(params.pad);
    let sx = i32(cx + dx) - i32(params.pad);
    var value = Elem(0.0);
    if (sy >= 0 && sy < i32(params.height) && sx >= 0 && sx < i32(params.width)) {
        value = input[((n * params.height + u32(sy)) * params.width + u32(sx)) * params.channels + c];
    }
    output[i] = value;
}
