// Element (m, k) of the implicit im2col matrix of the NHWC input `x`: m is an
// output position (n, oh, ow), k a filter tap (r, s, c_in). Padding reads as 0.
fn im2col(m: u32, k: u32) -> f32 {
    let ow = m % W_OUT;
    let oh = (m / W_OUT) % H_OUT;
    let n = m / (W_OUT * H_OUT);
    let c = k % C_IN;
    let s = (k / C_IN) % S;
    let r = k / (C_IN * S);
    let ih = i32(oh * STRIDE_H + r * DIL_H) - i32(PAD_TOP);
    let iw = i32(ow * STRIDE_W + s * DIL_W) - i32(PAD_LEFT);
    if (ih < 0 || ih >= i32(H) || iw < 0 || iw >= i32(W)) {
        return 0.0;
    }
    return f32(x[((n * H + u32(ih)) * W + u32(iw)) * C_IN + c]);
}
