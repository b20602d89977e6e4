//! The CPU path's building blocks: im2col / col2im for one image and a GEMM.
//! Images are processed independently (and in parallel by the callers), so the
//! column buffer never holds more than one image.

use crate::conv::shape::ConvShapeMeta;

/// Rows of the im2col matrix per image: one per output position.
pub(crate) fn rows_per_image(meta: &ConvShapeMeta) -> usize {
    meta.h_out * meta.w_out
}

/// Calls `f(row, k_base, ih, iw)` for every in-bounds tap `(r, s)` of every output
/// position of one image, where `k_base = (r * S + s) * C_in`.
fn for_each_tap(meta: &ConvShapeMeta, mut f: impl FnMut(usize, usize, usize, usize)) {
    for oh in 0..meta.h_out {
        for ow in 0..meta.w_out {
            let row = oh * meta.w_out + ow;
            for r in 0..meta.r {
                let ih = (oh * meta.stride_h + r * meta.dil_h) as isize - meta.pad_top as isize;
                if ih < 0 || ih >= meta.h as isize {
                    continue;
                }
                for s in 0..meta.s {
                    let iw =
                        (ow * meta.stride_w + s * meta.dil_w) as isize - meta.pad_left as isize;
                    if iw < 0 || iw >= meta.w as isize {
                        continue;
                    }
                    f(row, (r * meta.s + s) * meta.c_in, ih as usize, iw as usize);
                }
            }
        }
    }
}

/// Fills `col[rows_per_image, K]` from one NHWC image `x[H, W, C_in]`; padding is 0.
pub(crate) fn im2col_image(meta: &ConvShapeMeta, x: &[f32], col: &mut [f32]) {
    col.fill(0.0);
    let (k, c) = (meta.k, meta.c_in);
    for_each_tap(meta, |row, k_base, ih, iw| {
        let src = (ih * meta.w + iw) * c;
        let dst = row * k + k_base;
        col[dst..dst + c].copy_from_slice(&x[src..src + c]);
    });
}

/// Adds `col[rows_per_image, K]` back into one image `dx[H, W, C_in]` (the adjoint of im2col).
pub(crate) fn col2im_add_image(meta: &ConvShapeMeta, col: &[f32], dx: &mut [f32]) {
    let (k, c) = (meta.k, meta.c_in);
    for_each_tap(meta, |row, k_base, ih, iw| {
        let dst = (ih * meta.w + iw) * c;
        let src = row * k + k_base;
        for (d, s) in dx[dst..dst + c].iter_mut().zip(&col[src..src + c]) {
            *d += s;
        }
    });
}

/// A row-major matrix view for [`gemm`]: `rows x cols`, optionally transposed.
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub transposed: bool,
}

impl<'a> Mat<'a> {
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            transposed: false,
        }
    }

    /// The transpose of a row-major `cols x rows` matrix stored in `data`.
    pub fn t(data: &'a [f32], stored_rows: usize, stored_cols: usize) -> Self {
        Self {
            data,
            rows: stored_cols,
            cols: stored_rows,
            transposed: true,
        }
    }

    fn strides(&self) -> (isize, isize) {
        if self.transposed {
            (1, self.rows as isize)
        } else {
            (self.cols as isize, 1)
        }
    }
}

/// `c[a.rows, b.cols] = a * b (+ c when accumulate)`, single-threaded (callers
/// parallelise over images).
pub(crate) fn gemm(a: &Mat, b: &Mat, c: &mut [f32], accumulate: bool) {
    assert_eq!(a.cols, b.rows, "gemm inner dimensions");
    assert!(a.data.len() >= a.rows * a.cols && b.data.len() >= b.rows * b.cols);
    assert!(c.len() >= a.rows * b.cols);
    let (rsa, csa) = a.strides();
    let (rsb, csb) = b.strides();
    let beta = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: the asserts above keep every index the strides reach inside the slices.
    unsafe {
        matrixmultiply::sgemm(
            a.rows,
            a.cols,
            b.cols,
            1.0,
            a.data.as_ptr(),
            rsa,
            csa,
            b.data.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            b.cols as isize,
            1,
        );
    }
}
