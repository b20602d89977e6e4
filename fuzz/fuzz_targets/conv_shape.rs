//! `ConvShapeMeta::new` on arbitrary sizes: a typed error, or geometry that is
//! consistent and fits the kernels' 32-bit indices.
#![no_main]

use aether::conv::{ConvParams, ConvShapeMeta, Padding};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Geometry {
    input: [u64; 4],
    c_out: u64,
    filter: (u64, u64),
    stride: (u64, u64),
    dilation: (u64, u64),
    padding: Option<Option<[u64; 4]>>,
}

fuzz_target!(|g: Geometry| {
    let size = |v: u64| v as usize;
    let padding = match g.padding {
        None => Padding::Same,
        Some(None) => Padding::Valid,
        Some(Some([top, bottom, left, right])) => Padding::Explicit {
            top: size(top),
            bottom: size(bottom),
            left: size(left),
            right: size(right),
        },
    };
    let params = ConvParams {
        c_out: size(g.c_out),
        filter: (size(g.filter.0), size(g.filter.1)),
        stride: (size(g.stride.0), size(g.stride.1)),
        padding,
        dilation: (size(g.dilation.0), size(g.dilation.1)),
    };
    let input = g.input.map(size);
    let Ok(meta) = ConvShapeMeta::new(input, &params) else {
        return;
    };
    assert_eq!(meta.input_dims(), input);
    let [n, h_out, w_out, c_out] = meta.output_dims();
    assert!(h_out >= 1 && w_out >= 1);
    assert_eq!(c_out, params.c_out);
    assert_eq!(meta.m, n * h_out * w_out);
    assert_eq!(meta.k, meta.r * meta.s * meta.c_in);
    // A 'same' convolution with stride 1 keeps the spatial size.
    if matches!(params.padding, Padding::Same)
        && meta.stride_h == 1
        && meta.dil_h == 1
        && meta.r % 2 == 1
    {
        assert_eq!(h_out, meta.h);
    }
    for (name, value) in meta.shape_constants() {
        assert!(
            value <= i32::MAX as u32,
            "{name} = {value} overflows the kernels' i32"
        );
    }
});
