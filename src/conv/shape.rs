//! Convolution geometry: padding, parameters and the one place a conv's
//! output size, GEMM sizes and shader constants are computed.
//!
//! Layout conventions: activations are NHWC; weights are `[R, S, C_in, C_out]`,
//! i.e. the GEMM operand `W[K, C_out]` with K ordered `(r, s, c_in)`.

use crate::error::{AetherError, Result};

/// How the input is padded before the filter slides over it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Padding {
    /// `(f - 1) / 2` on each side of each spatial dimension (Aether-ML's "same").
    Same,
    /// No padding.
    Valid,
    /// Explicit `top, bottom, left, right`.
    Explicit {
        top: usize,
        bottom: usize,
        left: usize,
        right: usize,
    },
}

/// Everything about a convolution except the data: filter, stride, padding, dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ConvParams {
    pub c_out: usize,
    /// Filter `(R, S)`: height and width.
    pub filter: (usize, usize),
    pub stride: (usize, usize),
    pub padding: Padding,
    pub dilation: (usize, usize),
}

impl ConvParams {
    /// A square `filter x filter` convolution with stride 1, no dilation.
    pub fn new(c_out: usize, filter: usize, padding: Padding) -> Self {
        Self {
            c_out,
            filter: (filter, filter),
            stride: (1, 1),
            padding,
            dilation: (1, 1),
        }
    }
}

/// The single place where convolution geometry is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvShapeMeta {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub r: usize,
    pub s: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub pad_top: usize,
    pub pad_left: usize,
    pub dil_h: usize,
    pub dil_w: usize,
    pub h_out: usize,
    pub w_out: usize,
    /// GEMM rows: `N * H_out * W_out`.
    pub m: usize,
    /// GEMM reduction length of the forward pass: `R * S * C_in`.
    pub k: usize,
}

/// A [`ConvShapeMeta`] without the batch size: what pipelines are keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvShapeKey {
    pub h: usize,
    pub w: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub r: usize,
    pub s: usize,
    pub stride: (usize, usize),
    pub pad: (usize, usize),
    pub dilation: (usize, usize),
}

impl ConvShapeMeta {
    /// Geometry of `params` applied to an NHWC `input` shape; a typed error for
    /// zero sizes or an empty output.
    pub fn new(input: [usize; 4], params: &ConvParams) -> Result<Self> {
        let [n, h, w, c_in] = input;
        let (r, s) = params.filter;
        let (stride_h, stride_w) = params.stride;
        let (dil_h, dil_w) = params.dilation;
        let invalid = |reason: String| AetherError::InvalidShape {
            op: "conv2d",
            shape: input.to_vec(),
            reason,
        };
        if [
            n,
            h,
            w,
            c_in,
            params.c_out,
            r,
            s,
            stride_h,
            stride_w,
            dil_h,
            dil_w,
        ]
        .contains(&0)
        {
            return Err(invalid(format!(
                "sizes, channels, filter {:?}, stride {:?} and dilation {:?} must all be >= 1 \
                 (c_out {})",
                params.filter, params.stride, params.dilation, params.c_out
            )));
        }
        let (pad_top, pad_bottom, pad_left, pad_right) = match params.padding {
            Padding::Same => ((r - 1) / 2, (r - 1) / 2, (s - 1) / 2, (s - 1) / 2),
            Padding::Valid => (0, 0, 0, 0),
            Padding::Explicit {
                top,
                bottom,
                left,
                right,
            } => (top, bottom, left, right),
        };
        // Every size reaches the kernels as a 32-bit index, so anything past
        // i32::MAX is refused up front; below it the arithmetic here cannot
        // overflow a 64-bit usize, and the products are checked.
        let index_limit = i32::MAX as usize;
        let geometry = [
            ("height", h),
            ("width", w),
            ("input channels", c_in),
            ("output channels", params.c_out),
            ("filter height", r),
            ("filter width", s),
            ("stride height", stride_h),
            ("stride width", stride_w),
            ("dilation height", dil_h),
            ("dilation width", dil_w),
            ("padding top", pad_top),
            ("padding bottom", pad_bottom),
            ("padding left", pad_left),
            ("padding right", pad_right),
        ];
        if let Some((name, value)) = geometry.iter().find(|(_, v)| *v > index_limit) {
            return Err(invalid(format!(
                "{name} {value} exceeds the kernels' 32-bit index range ({index_limit})"
            )));
        }
        let span_h = dil_h * (r - 1) + 1;
        let span_w = dil_w * (s - 1) + 1;
        let padded_h = h + pad_top + pad_bottom;
        let padded_w = w + pad_left + pad_right;
        if padded_h < span_h || padded_w < span_w {
            return Err(invalid(format!(
                "filter {:?} (dilation {:?}) is larger than the padded input {padded_h}x{padded_w}: \
                 the output would be empty",
                params.filter, params.dilation
            )));
        }
        let h_out = (padded_h - span_h) / stride_h + 1;
        let w_out = (padded_w - span_w) / stride_w + 1;
        let product = |values: &[usize]| {
            values
                .iter()
                .try_fold(1usize, |acc, &v| acc.checked_mul(v))
                .filter(|&p| p <= index_limit)
        };
        let fits = [
            &[span_h][..],
            &[span_w],
            &[n, h_out, w_out, params.c_out],
            &[r, s, c_in, params.c_out],
            &[n, h, w, c_in],
        ]
        .iter()
        .all(|values| product(values).is_some());
        if !fits {
            return Err(invalid(
                "exceeds the 2^31 element range of the kernels' indices".into(),
            ));
        }
        Ok(Self {
            n,
            h,
            w,
            c_in,
            c_out: params.c_out,
            r,
            s,
            stride_h,
            stride_w,
            pad_top,
            pad_left,
            dil_h,
            dil_w,
            h_out,
            w_out,
            m: n * h_out * w_out,
            k: r * s * c_in,
        })
    }

    pub fn key(&self) -> ConvShapeKey {
        ConvShapeKey {
            h: self.h,
            w: self.w,
            c_in: self.c_in,
            c_out: self.c_out,
            r: self.r,
            s: self.s,
            stride: (self.stride_h, self.stride_w),
            pad: (self.pad_top, self.pad_left),
            dilation: (self.dil_h, self.dil_w),
        }
    }

    pub fn input_dims(&self) -> [usize; 4] {
        [self.n, self.h, self.w, self.c_in]
    }

    pub fn output_dims(&self) -> [usize; 4] {
        [self.n, self.h_out, self.w_out, self.c_out]
    }

    pub fn weight_dims(&self) -> [usize; 4] {
        [self.r, self.s, self.c_in, self.c_out]
    }

    /// The WGSL `override` constants every conv kernel reads its geometry from
    /// (declared in [`SHADER_PRELUDE`](crate::conv::gemm::SHADER_PRELUDE)); the batch size is a runtime parameter.
    pub fn shape_constants(&self) -> [(&'static str, u32); 14] {
        let c = |v: usize| v as u32;
        [
            ("H", c(self.h)),
            ("W", c(self.w)),
            ("C_IN", c(self.c_in)),
            ("C_OUT", c(self.c_out)),
            ("R", c(self.r)),
            ("S", c(self.s)),
            ("STRIDE_H", c(self.stride_h)),
            ("STRIDE_W", c(self.stride_w)),
            ("PAD_TOP", c(self.pad_top)),
            ("PAD_LEFT", c(self.pad_left)),
            ("DIL_H", c(self.dil_h)),
            ("DIL_W", c(self.dil_w)),
            ("H_OUT", c(self.h_out)),
            ("W_OUT", c(self.w_out)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_padding_keeps_size_for_odd_filters_and_stride_divides() {
        let m = ConvShapeMeta::new([2, 9, 7, 3], &ConvParams::new(8, 3, Padding::Same)).unwrap();
        assert_eq!((m.h_out, m.w_out, m.m, m.k), (9, 7, 2 * 9 * 7, 27));
        let p = ConvParams {
            stride: (2, 1),
            filter: (5, 3),
            ..ConvParams::new(4, 1, Padding::Valid)
        };
        let m = ConvShapeMeta::new([1, 11, 6, 2], &p).unwrap();
        assert_eq!((m.h_out, m.w_out), (4, 4));
    }

    #[test]
    fn empty_output_and_zero_sizes_are_errors() {
        let e =
            ConvShapeMeta::new([1, 2, 2, 3], &ConvParams::new(4, 5, Padding::Valid)).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        assert!(ConvShapeMeta::new([1, 4, 4, 0], &ConvParams::new(4, 3, Padding::Same)).is_err());
        assert!(ConvShapeMeta::new([1, 4, 4, 2], &ConvParams::new(0, 3, Padding::Same)).is_err());
    }

    #[test]
    fn key_leaves_batch_out() {
        let p = ConvParams::new(8, 3, Padding::Same);
        let a = ConvShapeMeta::new([1, 8, 8, 3], &p).unwrap();
        let b = ConvShapeMeta::new([7, 8, 8, 3], &p).unwrap();
        assert_eq!(a.key(), b.key());
        assert_ne!(a, b);
    }
}
