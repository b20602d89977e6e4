// normalize's output stored as f16, for a consumer that rounds its input to
// f16 anyway (a conv with f16 kernels): four lanes (batchnorm_lanes4.wgsl) in
// 8 bytes, element 2i in the low half of word i, rounded bit-exactly as
// half::f16::from_f32 (f16_bits.wgsl), so the consumer sees the values it
// would have rounded to.

alias ActBits = vec2<u32>;

fn act_bits(v: Lanes) -> ActBits {
    let h = f16_bits4(clip_f16_range4(bitcast<vec4<u32>>(v)));
    return vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
}

