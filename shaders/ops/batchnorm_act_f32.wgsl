// normalize's output stored as f32: a `Lanes` of values per element of an
// `array<ActBits>`.

alias ActBits = LaneBits;

fn act_bits(v: Lanes) -> ActBits {
    return bitcast<ActBits>(v);
}

