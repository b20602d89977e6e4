// f32 -> f16 in integer arithmetic, bit-exact with half::f16::from_f32: round to
// nearest even, subnormals, overflow to inf, NaN sign and payload kept (quiet bit
// set). Operands arrive as raw u32 bits: no float operation touches them, so no
// driver can canonicalise a NaN (see shared/gpu/README.md: comparisons lose NaN).

const F16_MAX_BITS: u32 = 0x477fe000u; // 65504.0

fn f16_bits(b: u32) -> u32 {
    let sign = (b >> 16u) & 0x8000u;
    let exp = b & 0x7f800000u;
    let man = b & 0x007fffffu;
    if (exp == 0x7f800000u) {
        let nan_bit = select(0u, 0x0200u, man != 0u);
        return sign | 0x7c00u | nan_bit | (man >> 13u);
    }
    let half_exp = i32(exp >> 23u) - 112;
    if (half_exp >= 31) {
        return sign | 0x7c00u;
    }
    if (half_exp <= 0) {
        if (half_exp < -10) {
            return sign;
        }
        let m = man | 0x00800000u;
        let shift = u32(14 - half_exp);
        let round_bit = 1u << (shift - 1u);
        let carry = select(0u, 1u, (m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u);
        return sign | ((m >> shift) + carry);
    }
    let base = sign | (u32(half_exp) << 10u) | (man >> 13u);
    let carry = select(0u, 1u, (man & 0x1000u) != 0u && (man & 0x2fffu) != 0u);
    return base + carry;
}

// Clamp to +-65504 like xp.clip, in bits: NaN passes through, +-inf clamps.
fn clip_f16_range(b: u32) -> u32 {
    let magnitude = b & 0x7fffffffu;
    if (magnitude > 0x7f800000u || magnitude <= F16_MAX_BITS) {
        return b;
    }
    return (b & 0x80000000u) | F16_MAX_BITS;
}

// Two f16 results packed into one word (element 2i in the low half), so each
// invocation owns whole words and no two write the same memory.
fn pack_f16_pair(lo: u32, hi: u32) -> u32 {
    return f16_bits(lo) | (f16_bits(hi) << 16u);
}
