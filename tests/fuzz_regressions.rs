//! Every input the fuzz targets of `fuzz/` crashed on, as a plain test that
//! needs neither the fuzz crate nor a nightly compiler, plus the inputs the
//! fixes were shaped by.

use aether::AetherError;
use aether::conv::{ConvParams, ConvShapeMeta, Padding};

fn refused(input: [usize; 4], params: &ConvParams) -> String {
    match ConvShapeMeta::new(input, params) {
        Err(AetherError::InvalidShape { op, reason, .. }) => {
            assert_eq!(op, "conv2d");
            reason
        }
        other => panic!("expected InvalidShape for {input:?} {params:?}, got {other:?}"),
    }
}

/// `conv_shape` crash-bfb190a8c1f4015db2ab7957fef19d1dec3b8922: sizes near
/// 2^64 overflowed `dil_h * (r - 1)` (a panic in debug builds, wrapped
/// geometry in release).
#[test]
fn conv_shape_with_sizes_near_2_pow_64_is_refused() {
    let big = 15697817505862638041usize;
    let params = ConvParams {
        c_out: big,
        filter: (15697816846155700697, big),
        stride: (big, 15708555500268280281),
        padding: Padding::Explicit {
            top: 0,
            bottom: 0,
            left: 0,
            right: 0,
        },
        dilation: (big, big),
    };
    let reason = refused([15697817505862637834, big, big, big], &params);
    assert!(reason.contains("32-bit index range"), "{reason}");
}

/// Shaped by the same crash: a stride, padding or dilation past `i32::MAX`
/// with a small output used to pass the element-count check and reach the
/// kernels truncated to 32 bits.
#[test]
fn conv_geometry_past_i32_is_refused_even_when_the_output_is_small() {
    let past = i32::MAX as usize + 1;
    let base = ConvParams::new(1, 1, Padding::Valid);
    for params in [
        ConvParams {
            stride: (past, 1),
            ..base
        },
        ConvParams {
            dilation: (1, past),
            ..base
        },
        ConvParams {
            padding: Padding::Explicit {
                top: past,
                bottom: 0,
                left: 0,
                right: 0,
            },
            ..base
        },
    ] {
        let reason = refused([1, 1, 1, 1], &params);
        assert!(
            reason.contains("exceeds the kernels' 32-bit index range"),
            "{reason}"
        );
    }
    // A span (dilation x filter) past the range, each factor within it.
    let params = ConvParams {
        filter: (3, 1),
        dilation: (1 << 30, 1),
        ..base
    };
    let padding = Padding::Explicit {
        top: i32::MAX as usize,
        bottom: i32::MAX as usize,
        left: 0,
        right: 0,
    };
    let reason = refused([1, 1, 1, 1], &ConvParams { padding, ..params });
    assert!(reason.contains("2^31 element range"), "{reason}");
    // Just inside the range is still accepted.
    let edge = ConvParams {
        stride: (i32::MAX as usize, 1),
        ..base
    };
    let meta = ConvShapeMeta::new([1, 1, 1, 1], &edge).unwrap();
    assert_eq!(meta.output_dims(), [1, 1, 1, 1]);
}
