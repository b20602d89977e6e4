// The implicit im2col matrix of the NHWC input `x`: row m is an output position
// (n, oh, ow), column k a filter tap (r, s, c_in). Padding reads as 0.

// Offset in `x` of element (m, k), or -1 where it falls in the padding.
fn im2col_offset(m: u32, k: u32) -> i32 {
    let ow = m % W_OUT;
    let oh = (m / W_OUT) % H_OUT;
    let n = m / (W_OUT * H_OUT);
    let c = k % C_IN;
    let s = (k / C_IN) % S;
    let r = k / (C_IN * S);
    let ih = i32(oh * STRIDE_H + r * DIL_H) - i32(PAD_TOP);
    let iw = i32(ow * STRIDE_W + s * DIL_W) - i32(PAD_LEFT);
    if (ih < 0 || ih >= i32(H) || iw < 0 || iw >= i32(W)) {
        return -1;
    }
    return i32(((n * H + u32(ih)) * W + u32(iw)) * C_IN + c);
}

fn im2col(m: u32, k: u32) -> f32 {
    let offset = im2col_offset(m, k);
    if (offset < 0) {
        return 0.0;
    }
    return x_at(u32(offset));
}

// Runs for the coop core: 8 consecutive input channels of one tap. Needs
// C_IN % 8 == 0 and k % 8 == 0, so a run never crosses a tap and starts at a
// multiple of 8. dweight reads one as `x_run(im2col_offset(m, k))`; the
// forward as `im2col_run_at(im2col_position(m), k)`, the offset split into
// the output position's part and the tap's (docs/lab/perf-notes.md, entry 41).

// What row m fixes: the offset in `x` of (n, oh * STRIDE_H - PAD_TOP,
// ow * STRIDE_W - PAD_LEFT), maybe outside the image, and those two
// coordinates.
fn im2col_position(m: u32) -> vec3<i32> {
    let ow = m % W_OUT;
    let oh = (m / W_OUT) % H_OUT;
    let n = m / (W_OUT * H_OUT);
    let ih = i32(oh * STRIDE_H) - i32(PAD_TOP);
    let iw = i32(ow * STRIDE_W) - i32(PAD_LEFT);
    return vec3<i32>(((i32(n * H) + ih) * i32(W) + iw) * i32(C_IN), ih, iw);
}

// The run of 8 channels from c of input pixel (n, ih, iw), zeros where the
// pixel falls in the padding: what the halo kernels stage (forward_halo.wgsl,
// dweight_halo.wgsl). Needs C_IN % 8 == 0 and c % 8 == 0.
fn x_pixel_run(n: u32, ih: i32, iw: i32, c: u32) -> Run {
    if (ih < 0 || ih >= i32(H) || iw < 0 || iw >= i32(W)) {
        return Run();
    }
    return x_run(i32(((n * H + u32(ih)) * W + u32(iw)) * C_IN + c));
}

// The run at `position` and column k, zeros where the tap falls in the padding.
fn im2col_run_at(position: vec3<i32>, k: u32) -> Run {
    let c = k % C_IN;
    let s = (k / C_IN) % S;
    let r = k / (C_IN * S);
    let ih = position.y + i32(r * DIL_H);
    let iw = position.z + i32(s * DIL_W);
    if (ih < 0 || ih >= i32(H) || iw < 0 || iw >= i32(W)) {
        return Run();
    }
    return x_run(position.x + i32((r * DIL_H * W + s * DIL_W) * C_IN + c));
}
