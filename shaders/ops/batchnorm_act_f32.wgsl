// Activations (normalize's output, the fused ReLU's output the backward gates
// by) stored as f32: a `Lanes` of them per element of an `array<ActBits>`.

alias ActBits = LaneBits;

fn act_bits(v: Lanes) -> ActBits {
    return bitcast<ActBits>(v);
}

fn act_passes(b: ActBits) -> LaneMask {
    return passes_lanes(b);
}
