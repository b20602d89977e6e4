// f32 -> f16 on raw u32 bits, four at a time and without a branch, bit-exact with
// half::f16::from_f32: round to nearest even, subnormals, overflow to inf, NaN
// sign and payload kept (quiet bit set). No float comparison touches the
// values, so no driver can canonicalise a NaN (see shared/gpu/README.md:
// comparisons lose NaN). Checked against half for all 2^32 patterns.

const F16_MAX_BITS: u32 = 0x477fe000u; // 65504.0
// |x| below 2^-14 becomes an f16 subnormal (or zero).
const F16_NORMAL_MIN_BITS: u32 = 0x38800000u;
// |x| from 65536 up becomes inf (65520 up to it rounds to inf on its own).
const F16_OVERFLOW_BITS: u32 = 0x47800000u;

// Each lane is a select of three candidates:
// - normal: rebias the exponent (127 -> 15) and round at bit 13, to even;
// - subnormal: adding 0.5 puts |x| in [0.5, 1), whose f32 step is 2^-24, f16's
//   subnormal step, so the f32 adder does the round-to-nearest-even (an f32
//   denormal input flushed to zero still gives 0, as it should);
// - inf, or NaN with the top 10 payload bits and the quiet bit.
fn f16_bits4(b: vec4<u32>) -> vec4<u32> {
    let sign = (b >> vec4(16u)) & vec4(0x8000u);
    let a = b & vec4(0x7fffffffu);
    let normal = (a - vec4(0x38000000u) + vec4(0x0fffu) + ((a >> vec4(13u)) & vec4(1u))) >> vec4(13u);
    let subnormal = bitcast<vec4<u32>>(bitcast<vec4<f32>>(a) + vec4(0.5)) - vec4(0x3f000000u);
    let nan = vec4(0x7e00u) | ((a >> vec4(13u)) & vec4(0x3ffu));
    var h = select(normal, subnormal, a < vec4(F16_NORMAL_MIN_BITS));
    h = select(h, vec4(0x7c00u), a >= vec4(F16_OVERFLOW_BITS));
    h = select(h, nan, a > vec4(0x7f800000u));
    return sign | h;
}

// Clamp to +-65504 like xp.clip, in bits: NaN passes through, +-inf clamps.
fn clip_f16_range4(b: vec4<u32>) -> vec4<u32> {
    let magnitude = b & vec4(0x7fffffffu);
    let keep = magnitude > vec4(0x7f800000u) | magnitude <= vec4(F16_MAX_BITS);
    return select((b & vec4(0x80000000u)) | vec4(F16_MAX_BITS), b, keep);
}

// Whether any of the four f16s in the low halves of `halves` is 65504 or
// beyond (inf, NaN): bits 0x7bff and up. The test that raises the loss
// scaler's saturation flag where a pass writes an f16 gradient.
fn f16_at_limit4(halves: vec4<u32>) -> bool {
    return any((halves & vec4(0x7fffu)) >= vec4(0x7bffu));
}

// Elements first .. first + 7 of a tensor of `len` f32s (raw bits, as two
// vec4s) as eight f16s packed in four words, element 2i in the low half of
// word i. Elements from `len` on (the tail of the last group, read from the
// pooled buffer's padding) are written as 0, so each invocation owns whole
// 16-byte words of the output and no two write the same memory.
fn cast_group(lo: vec4<u32>, hi: vec4<u32>, first: u32, len: u32, clip: bool) -> vec4<u32> {
    let lanes = vec4(0u, 1u, 2u, 3u);
    var a = f16_bits4(select(lo, clip_f16_range4(lo), clip));
    var b = f16_bits4(select(hi, clip_f16_range4(hi), clip));
    a = select(vec4(0u), a, vec4(first) + lanes < vec4(len));
    b = select(vec4(0u), b, vec4(first + 4u) + lanes < vec4(len));
    return vec4(a.x | (a.y << 16u), a.z | (a.w << 16u), b.x | (b.y << 16u), b.z | (b.w << 16u));
}
