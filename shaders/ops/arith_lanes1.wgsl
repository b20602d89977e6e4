// One value per invocation of the arith kernels (the length does not divide
// by 4). See arith_lanes4.wgsl.

alias Value = f32;
alias Bits = u32;

fn positive(b: Bits) -> bool {
    return is_positive(b);
}

fn negative(b: Bits) -> bool {
    return is_negative(b);
}
