// Four values per invocation of the arith kernels (add.wgsl, add_relu.wgsl,
// add_relu_backward.wgsl), where the length divides by 4: one 16-byte load per
// operand. ReLU's decisions stay per value, on the bits (relu_bits.wgsl).
// arith_lanes1.wgsl is the one-value version.

alias Value = vec4<f32>;
alias Bits = vec4<u32>;

fn positive(b: Bits) -> vec4<bool> {
    return vec4(is_positive(b.x), is_positive(b.y), is_positive(b.z), is_positive(b.w));
}

fn negative(b: Bits) -> vec4<bool> {
    return vec4(is_negative(b.x), is_negative(b.y), is_negative(b.z), is_negative(b.w));
}
