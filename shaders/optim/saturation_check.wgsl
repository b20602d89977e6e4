// Raises the loss scaler's overflow flag (word 2) where an output gradient, as
// the conv after it will round it to f16, reaches f16's largest value 65504 or
// beyond (inf, NaN). Every f32 -> f16 conversion of aether saturates at
// +-65504, so a scaled gradient that overflows f16 would otherwise come out of
// the backward finite, and wrong. Judged from the bits: f32 values above
// 65488 round to 65504 or more; f16 bits 0x7bff and up are 65504, inf, NaN.
// Two f16 values share a word; the last word of an odd count holds one.
// Each invocation checks WORDS_PER_INVOCATION words, `invocations` apart, so
// the loads of each round are consecutive across invocations.

const WORDS_PER_INVOCATION: u32 = 4u;

@group(0) @binding(0) var<storage, read> values: array<u32>;
@group(0) @binding(1) var<storage, read_write> scaler: array<atomic<u32>>;

struct Check {
    // Elements of the gradient (f16 or f32).
    len: u32,
    row_stride: u32,
    // 1 where the gradient is f16.
    half: u32,
    // Invocations that check words: ceil(words / WORDS_PER_INVOCATION).
    invocations: u32,
}
@group(0) @binding(2) var<uniform> check: Check;

/// Whether word `w` holds a value at f16's limit or beyond.
fn saturated(w: u32) -> bool {
    if (check.half == 1u) {
        if (2u * w >= check.len) {
            return false;
        }
        let word = values[w];
        let low = (word & 0x7fffu) >= 0x7bffu;
        let high = 2u * w + 1u < check.len && ((word >> 16u) & 0x7fffu) >= 0x7bffu;
        return low || high;
    }
    return w < check.len && (values[w] & 0x7fffffffu) > 0x477fd000u;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * check.row_stride;
    if (t >= check.invocations) {
        return;
    }
    var bad = false;
    for (var k = 0u; k < WORDS_PER_INVOCATION; k++) {
        bad = bad || saturated(t + k * check.invocations);
    }
    if (bad) {
        atomicOr(&scaler[2], 1u);
    }
}
