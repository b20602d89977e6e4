//! The conv shapes the test suite runs: `tests/conv.rs` checks each against
//! the reference, and `tests/shader_portability.rs` translates the kernels
//! they build for every backend.

use aether::conv::{ConvParams, Padding};

pub struct Case {
    pub name: &'static str,
    pub input: [usize; 4],
    pub params: ConvParams,
}

/// The test cases; `turns_images` is the taking-turns case's batch (see
/// [`turns_images`]).
pub fn cases(turns_images: usize) -> Vec<Case> {
    let p = |c_out, filter: (usize, usize), stride, padding, dilation| ConvParams {
        c_out,
        filter,
        stride,
        padding,
        dilation,
    };
    // A 3x5 filter, 32 channels out, padded asymmetrically.
    let explicit_3x5 = p(
        32,
        (3, 5),
        (1, 1),
        Padding::Explicit {
            top: 2,
            bottom: 0,
            left: 1,
            right: 3,
        },
        (1, 1),
    );
    vec![
        Case {
            name: "1x1 same, batch 1",
            input: [1, 5, 7, 3],
            params: p(5, (1, 1), (1, 1), Padding::Same, (1, 1)),
        },
        Case {
            name: "3x3 same, batch 7",
            input: [7, 6, 5, 3],
            params: p(10, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        Case {
            name: "5x3 valid",
            input: [2, 9, 8, 4],
            params: p(6, (5, 3), (1, 1), Padding::Valid, (1, 1)),
        },
        Case {
            name: "3x3 stride 2 same",
            input: [3, 9, 9, 5],
            params: p(7, (3, 3), (2, 2), Padding::Same, (1, 1)),
        },
        Case {
            name: "3x3 stride (2,1) explicit",
            input: [2, 8, 7, 3],
            params: p(
                4,
                (3, 3),
                (2, 1),
                Padding::Explicit {
                    top: 1,
                    bottom: 0,
                    left: 2,
                    right: 1,
                },
                (1, 1),
            ),
        },
        Case {
            name: "3x3 dilation 2 stride 2",
            input: [1, 10, 9, 2],
            params: p(3, (3, 3), (2, 2), Padding::Same, (2, 2)),
        },
        Case {
            name: "2x2 stride 3 valid (taps miss rows)",
            input: [2, 7, 8, 3],
            params: p(4, (2, 2), (3, 3), Padding::Valid, (1, 1)),
        },
        Case {
            name: "3x3 same, tiles end mid-block",
            input: [1, 12, 11, 17],
            params: p(70, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // Blocks wholly inside C (256 rows, 32 channels out): the coop core
        // stores the forward's tiles straight into C from the bias, at tiles
        // 8 and 16; dX's too where it is at most 2 tiles wide (C_in 32 at
        // tile 16, C_in 16 at tile 8).
        Case {
            name: "3x3 same, whole blocks stored directly (tile 16)",
            input: [4, 8, 8, 32],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        Case {
            name: "3x3 same, whole blocks stored directly (tile 8)",
            input: [4, 8, 8, 16],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // A 1x1 conv (no halo kernel) 256 channels wide, 256 rows: the coop
        // core's forward block of 16 subgroups, which fits only storing
        // straight into C (256 x 128 at tile 16, 128 x 64 at tile 8).
        Case {
            name: "1x1, 256 channels, wide block stored directly",
            input: [4, 8, 8, 256],
            params: p(256, (1, 1), (1, 1), Padding::Same, (1, 1)),
        },
        // Stride 1, channels that tile and whole blocks of output rows: the
        // coop variants run the forward's halo kernel (at tile 16 blocks of
        // 4 x 32 positions, at tile 8 of 8 x 16; two blocks of output channels
        // at tile 8), once with a 3x5 filter and asymmetric padding.
        Case {
            name: "3x3 same, halo kernel",
            input: [2, 8, 32, 16],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // 32 channels in: dweight's halo kernel too (2 tiles of channels a
        // chunk at tile 16, two chunks at tile 8), and dinput's (the
        // transposed conv, 32 -> 32, in the forward's halo kernel).
        Case {
            name: "3x3 same, halo kernels (forward, dweight, dinput)",
            input: [1, 8, 32, 32],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // 64 channels in: the forward's halo kernel stages them 32 at a time;
        // dinput's writes them as 4 channel tiles (tile 16) in one block.
        Case {
            name: "3x3 same, 64 channels in, halo kernels (forward, dweight, dinput)",
            input: [1, 8, 16, 64],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // 16 x 16 outputs by 64 channels: the forward's first rule block, a
        // whole image by 4 channel tiles over 8 x 2 subgroups (4 position
        // tiles each at tile 8; 16 channels in keep it within lavapipe's 32
        // KiB).
        Case {
            name: "3x3 same, whole-image halo kernel",
            input: [1, 16, 16, 16],
            params: p(64, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // 20 wide, no multiple of the tile: blocks of whole rows whose last
        // tile overlaps the one before it (columns 12 and 4 at tiles 8 and 16).
        Case {
            name: "3x3 same, 20 wide, halo kernel with overlapping last tiles",
            input: [1, 8, 20, 16],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        Case {
            name: "3x5 explicit, halo kernel",
            input: [1, 8, 16, 16],
            params: explicit_3x5,
        },
        // dinput's halo kernel at tiles 8 and 16 on a 3x5 filter with
        // asymmetric padding (the transposed conv pads 0 / 2 / 3 / 1), and on
        // a width of 20, where its last tiles overlap too.
        Case {
            name: "3x5 explicit, 32 channels, halo kernels (forward, dinput)",
            input: [1, 8, 16, 32],
            params: explicit_3x5,
        },
        Case {
            name: "3x3 same, 20 wide, 32 channels, halo kernels (forward, dinput), overlapping",
            input: [1, 8, 20, 32],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // Images of 8 x 32, at least one block each: more blocks than the
        // workgroups the halo kernels launch, so each workgroup takes several.
        Case {
            name: "3x3 same, halo kernels (forward, dinput) taking turns over blocks",
            input: [turns_images, 8, 32, 32],
            params: p(32, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // Outputs narrower than a tile in whole stacks of a tile's images:
        // the forward's halo kernel stacks them (a position tile is one
        // position of each image; blocks of 2 rows at tile 8, 4 at 16), 4
        // channel chunks at tile 8 and 2 blocks of channels; dinput's
        // transposed conv (64 -> 32) stacks too, in blocks of 2 channel tiles
        // with all 9 taps a step.
        Case {
            name: "3x3 same, 4 wide, 16 images, stacked halo kernel",
            input: [16, 4, 4, 32],
            params: p(64, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // Shapes no halo block tiles exactly: 13 rows, prime, and 56 output
        // channels; 7 x 7 outputs narrower than a tile. The rule runs the
        // GEMM core on them; with `AETHER_HALO_RAGGED=1` the halo kernels
        // take ragged blocks (tests/conv_pinned_blocks.rs checks those).
        Case {
            name: "3x3 same, 13 x 16, 32 -> 56, no exact halo block",
            input: [2, 13, 16, 32],
            params: p(56, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        Case {
            name: "3x3 same, 7 x 7, 16 images, no exact halo block",
            input: [16, 7, 7, 32],
            params: p(64, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // Outputs narrower than a tile (4 wide: 2 rows a tile at tile 8, 4 at
        // 16) on 3 images, no whole stack: the halo kernels decline them to
        // the GEMM core.
        Case {
            name: "3x3 same, 4 wide, narrower than a tile",
            input: [3, 16, 4, 64],
            params: p(64, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        // 2 wide (4 and 8 rows a tile) with a 3x5 filter padded
        // asymmetrically.
        Case {
            name: "3x5 explicit, 2 wide, narrower than a tile",
            input: [1, 16, 2, 32],
            params: ConvParams {
                c_out: 64,
                ..explicit_3x5
            },
        },
        // Channel counts divisible by 8 switch the coop core to run loads.
        Case {
            name: "3x3 same, runs on every operand, M and K end mid-block",
            input: [2, 7, 9, 16],
            params: p(24, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        Case {
            name: "3x3 stride 2 explicit, runs on the input only",
            input: [3, 9, 8, 8],
            params: p(
                3,
                (3, 3),
                (2, 2),
                Padding::Explicit {
                    top: 2,
                    bottom: 0,
                    left: 1,
                    right: 1,
                },
                (1, 1),
            ),
        },
        // Strided dinput on run loads (C_out % 8 == 0): classes of unequal
        // sizes (odd extents), and a 1x1 projection whose other classes get
        // no tap at all.
        Case {
            name: "3x3 stride 2 same, 16 out, odd sizes, runs on dy",
            input: [2, 11, 9, 8],
            params: p(16, (3, 3), (2, 2), Padding::Same, (1, 1)),
        },
        Case {
            name: "1x1 stride 2 valid, runs on every operand",
            input: [3, 7, 10, 8],
            params: p(16, (1, 1), (2, 2), Padding::Valid, (1, 1)),
        },
        Case {
            name: "3x3 dilation 2, runs on the weights and dy only",
            input: [2, 6, 7, 3],
            params: p(16, (3, 3), (1, 1), Padding::Same, (2, 2)),
        },
        // The direct kernels (few input channels, at most 32 values a
        // position, fewer multiply-adds than the GEMM cores' padded ones): a
        // grayscale first conv, airbench's 2x2 whitening conv to 24, one
        // channel under a 5x5 filter at stride (1, 2), two under asymmetric
        // padding; positions ending mid-workgroup.
        Case {
            name: "3x3 same, 1 channel in, direct kernel",
            input: [5, 7, 9, 1],
            params: p(12, (3, 3), (1, 1), Padding::Same, (1, 1)),
        },
        Case {
            name: "2x2 valid, 3 channels in, 24 out, direct kernel",
            input: [3, 9, 9, 3],
            params: p(24, (2, 2), (1, 1), Padding::Valid, (1, 1)),
        },
        Case {
            name: "5x5 stride (1,2), 1 channel in, direct kernel",
            input: [3, 9, 10, 1],
            params: p(4, (5, 5), (1, 2), Padding::Same, (1, 1)),
        },
        Case {
            name: "3x3 explicit, 2 channels in, direct kernel",
            input: [2, 8, 7, 2],
            params: p(
                8,
                (3, 3),
                (2, 2),
                Padding::Explicit {
                    top: 2,
                    bottom: 0,
                    left: 0,
                    right: 1,
                },
                (1, 1),
            ),
        },
    ]
}
