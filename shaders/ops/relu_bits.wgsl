// ReLU's two decisions on the raw bits of an f32, prepended to every kernel that
// makes them: float comparisons lose NaN on some drivers (NVIDIA, see
// shared/gpu/README.md), and a NaN must take the CPU path's branch.

// x > 0: sign clear, not zero, not NaN (where ReLU's gradient passes).
fn is_positive(b: u32) -> bool {
    return b != 0u && b <= 0x7f800000u;
}

// A negative non-zero number, not NaN and not -0.0 (what ReLU turns into +0).
fn is_negative(b: u32) -> bool {
    return b > 0x80000000u && b <= 0xff800000u;
}
