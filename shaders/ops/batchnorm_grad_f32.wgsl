// The input gradient (backward dx) stored as f32: a `Lanes` of it per element
// of an `array<GradBits>`.

alias GradBits = LaneBits;

fn grad_bits(v: Lanes) -> GradBits {
    return bitcast<GradBits>(v);
}
