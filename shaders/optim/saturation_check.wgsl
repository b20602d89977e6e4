// Raises the loss scaler's overflow flag (word 2) where an output gradient, as
// the conv after it will round it to f16, reaches f16's largest value 65504 or
// beyond (inf, NaN). Every f32 -> f16 conversion of aether saturates at
// +-65504, so a scaled gradient that overflows f16 would otherwise come out of
// the backward finite, and wrong. Judged from the bits: f32 values above
// 65488 round to 65504 or more; f16 bits 0x7bff and up are 65504, inf, NaN.
// Two f16 values share a word; the last word of an odd count holds one.

@group(0) @binding(0) var<storage, read> values: array<u32>;
@group(0) @binding(1) var<storage, read_write> scaler: array<atomic<u32>>;

struct Check {
    // Elements of the gradient (f16 or f32).
    len: u32,
    row_stride: u32,
    // 1 where the gradient is f16.
    half: u32,
}
@group(0) @binding(2) var<uniform> check: Check;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = gid.x + gid.y * check.row_stride;
    var bad = false;
    if (check.half == 1u) {
        if (2u * w < check.len) {
            let word = values[w];
            bad = (word & 0x7fffu) >= 0x7bffu;
            if (2u * w + 1u < check.len) {
                bad = bad || ((word >> 16u) & 0x7fffu) >= 0x7bffu;
            }
        }
    } else if (w < check.len) {
        bad = (values[w] & 0x7fffffffu) > 0x477fd000u;
    }
    if (bad) {
        atomicOr(&scaler[2], 1u);
    }
}
