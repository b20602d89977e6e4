// The input gradient (backward dx) stored as f16, for a layer before that
// rounds its output gradient to f16 anyway (a conv with f16 kernels): four
// lanes (batchnorm_lanes4.wgsl) in 8 bytes, element 2i in the low half of word
// i, clipped to +-65504 (NaN kept, +-inf clamped) and rounded as
// half::f16::from_f32, as the conv's own gradient cast does (f16_bits.wgsl).

alias GradBits = vec2<u32>;

fn grad_bits(v: Lanes) -> GradBits {
    let h = f16_bits4(clip_f16_range4(bitcast<vec4<u32>>(v)));
    return vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
}
