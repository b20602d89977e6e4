// Translate by a random shift of up to `max_shift` pixels each way, reading
// the image reflect-padded (PyTorch's `F.pad(.., mode='reflect')`: the edge
// pixel is not repeated), then mirror left-right the images whose flag is set:
// airbench's `batch_crop` of reflect-padded images and its alternating flip,
// in one pass over an NHWC batch. `Elem` (f32 or f16) is aliased before this
// file. One Philox draw per image: dy = (r & 0xffff) % span - max_shift,
// dx = (r >> 16) % span - max_shift, span = 2 max_shift + 1; output pixel
// (y, x) reads (reflect(y + dy), reflect(x' + dx)), x' = W - 1 - x where
// flipped. The CPU path (`ops::augment`) computes the same index.

@group(0) @binding(0) var<storage, read> input: array<Elem>;
@group(0) @binding(1) var<storage, read> flips: array<u32>;
@group(0) @binding(2) var<storage, read_write> output: array<Elem>;

struct Params {
    len: u32,
    row_stride: u32,
    height: u32,
    width: u32,
    channels: u32,
    max_shift: u32,
    key_lo: u32,
    key_hi: u32,
    step: u32,
    stream: u32,
    // 1 where `flips` holds one flag per image; 0 flips nothing (the binding
    // is then any buffer, never read).
    use_flips: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

// `i` in [-(size - 1), 2 (size - 1)] mirrored into [0, size): the shift is
// below the size, so one reflection suffices.
fn reflect_index(i: i32, size: i32) -> u32 {
    var j = i;
    if (j < 0) {
        j = -j;
    }
    if (j >= size) {
        j = 2 * (size - 1) - j;
    }
    return u32(j);
}

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
    var dy = 0;
    var dx = 0;
    if (params.max_shift > 0u) {
        let r = philox_lane0(vec4<u32>(n, params.step, params.stream, 0u), vec2<u32>(params.key_lo, params.key_hi));
        let span = 2u * params.max_shift + 1u;
        dy = i32((r & 0xFFFFu) % span) - i32(params.max_shift);
        dx = i32((r >> 16u) % span) - i32(params.max_shift);
    }
    var cx = x;
    if (params.use_flips != 0u && flips[n] != 0u) {
        cx = params.width - 1u - x;
    }
    let sy = reflect_index(i32(y) + dy, i32(params.height));
    let sx = reflect_index(i32(cx) + dx, i32(params.width));
    output[i] = input[((n * params.height + sy) * params.width + sx) * params.channels + c];
}
