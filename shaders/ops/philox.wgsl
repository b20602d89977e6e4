// Philox4x32-10 (Salmon et al., Random123) in 32-bit integer arithmetic, the
// same function as `aether::ops::dropout::philox4x32_10` on the CPU, so masks
// and augmentations drawn on either device agree bit for bit. Prepended to the
// kernels that draw random numbers.

const PHILOX_M0: u32 = 0xD2511F53u;
const PHILOX_M1: u32 = 0xCD9E8D57u;
const PHILOX_W0: u32 = 0x9E3779B9u;
const PHILOX_W1: u32 = 0xBB67AE85u;

// High 32 bits of the 64-bit product a * b, from 16-bit halves (exact: every
// partial sum stays below 2^32).
fn mul_hi(a: u32, b: u32) -> u32 {
    let a_lo = a & 0xFFFFu;
    let a_hi = a >> 16u;
    let b_lo = b & 0xFFFFu;
    let b_hi = b >> 16u;
    let lo_lo = a_lo * b_lo;
    let lo_hi = a_lo * b_hi;
    let hi_lo = a_hi * b_lo;
    let mid = (lo_lo >> 16u) + (lo_hi & 0xFFFFu) + (hi_lo & 0xFFFFu);
    return a_hi * b_hi + (lo_hi >> 16u) + (hi_lo >> 16u) + (mid >> 16u);
}

// Lane 0 of Philox4x32-10 for `counter` under `key`.
fn philox_lane0(counter: vec4<u32>, key: vec2<u32>) -> u32 {
    var c = counter;
    var k = key;
    for (var round = 0u; round < 10u; round++) {
        if (round > 0u) {
            k += vec2<u32>(PHILOX_W0, PHILOX_W1);
        }
        let hi0 = mul_hi(PHILOX_M0, c.x);
        let lo0 = PHILOX_M0 * c.x;
        let hi1 = mul_hi(PHILOX_M1, c.z);
        let lo1 = PHILOX_M1 * c.z;
        c = vec4<u32>(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c.x;
}
