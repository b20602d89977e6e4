//! Brute-force direct convolution in f64: the ground truth for every conv variant.
//! Written from the definition, sharing no code with the crate.

use aether::conv::ConvShapeMeta;

/// Calls `f(n, oh, ow, r, s, ih, iw)` for every in-bounds tap.
fn taps(m: &ConvShapeMeta, mut f: impl FnMut(usize, usize, usize, usize, usize, usize, usize)) {
    for n in 0..m.n {
        for oh in 0..m.h_out {
            for ow in 0..m.w_out {
                for r in 0..m.r {
                    for s in 0..m.s {
                        let ih = (oh * m.stride_h + r * m.dil_h) as isize - m.pad_top as isize;
                        let iw = (ow * m.stride_w + s * m.dil_w) as isize - m.pad_left as isize;
                        if ih >= 0 && iw >= 0 && (ih as usize) < m.h && (iw as usize) < m.w {
                            f(n, oh, ow, r, s, ih as usize, iw as usize);
                        }
                    }
                }
            }
        }
    }
}

fn xi(m: &ConvShapeMeta, n: usize, h: usize, w: usize, c: usize) -> usize {
    ((n * m.h + h) * m.w + w) * m.c_in + c
}
fn yi(m: &ConvShapeMeta, n: usize, h: usize, w: usize, c: usize) -> usize {
    ((n * m.h_out + h) * m.w_out + w) * m.c_out + c
}
fn wi(m: &ConvShapeMeta, r: usize, s: usize, ci: usize, co: usize) -> usize {
    ((r * m.s + s) * m.c_in + ci) * m.c_out + co
}

pub fn forward(m: &ConvShapeMeta, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
    let mut y = vec![0.0f64; m.n * m.h_out * m.w_out * m.c_out];
    for n in 0..m.n {
        for oh in 0..m.h_out {
            for ow in 0..m.w_out {
                for co in 0..m.c_out {
                    y[yi(m, n, oh, ow, co)] = f64::from(b[co]);
                }
            }
        }
    }
    taps(m, |n, oh, ow, r, s, ih, iw| {
        for ci in 0..m.c_in {
            for co in 0..m.c_out {
                y[yi(m, n, oh, ow, co)] +=
                    f64::from(x[xi(m, n, ih, iw, ci)]) * f64::from(w[wi(m, r, s, ci, co)]);
            }
        }
    });
    y
}

pub fn dweight(m: &ConvShapeMeta, x: &[f32], dy: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut dw = vec![0.0f64; m.r * m.s * m.c_in * m.c_out];
    taps(m, |n, oh, ow, r, s, ih, iw| {
        for ci in 0..m.c_in {
            for co in 0..m.c_out {
                dw[wi(m, r, s, ci, co)] +=
                    f64::from(x[xi(m, n, ih, iw, ci)]) * f64::from(dy[yi(m, n, oh, ow, co)]);
            }
        }
    });
    let mut db = vec![0.0f64; m.c_out];
    for (i, v) in dy.iter().enumerate() {
        db[i % m.c_out] += f64::from(*v);
    }
    (dw, db)
}

pub fn dinput(m: &ConvShapeMeta, dy: &[f32], w: &[f32]) -> Vec<f64> {
    let mut dx = vec![0.0f64; m.n * m.h * m.w * m.c_in];
    taps(m, |n, oh, ow, r, s, ih, iw| {
        for ci in 0..m.c_in {
            for co in 0..m.c_out {
                dx[xi(m, n, ih, iw, ci)] +=
                    f64::from(dy[yi(m, n, oh, ow, co)]) * f64::from(w[wi(m, r, s, ci, co)]);
            }
        }
    });
    dx
}

/// `||got - want|| / ||want||`.
pub fn norm_rel_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "result length");
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (f64::from(g) - w).powi(2);
        norm += w * w;
    }
    assert!(
        norm > 0.0,
        "reference is all zeros: the test would prove nothing"
    );
    (diff / norm).sqrt()
}
