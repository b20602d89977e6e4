//! The convolution package: geometry and planning (`common`), the three GEMM
//! directions (`forward`, `dweight`, `dinput`), the coop GEMM's block geometry (`coop`),
//! the halo kernels for stride-1 convs (`halo` for the forward, `dweight_halo`, `dinput_halo`)
//! and the fp16 casts (`cast`).
//! WGSL sources live in `shaders/conv/`.

pub mod cast;
pub mod common;
pub mod coop;
pub mod dinput;
mod dinput_halo;
pub mod dweight;
pub mod dweight_halo;
pub mod forward;
pub mod halo;
mod im2col;

pub use cast::{cast_f16, clip_f16_range, conv_backward_cast_fp16};
pub use common::{
    ConvDirection, ConvLaunchPlan, ConvParams, ConvPlans, ConvShapeMeta, ConvVariant, Padding,
    PlannedLaunch,
};
pub use coop::CoopBlock;
pub use dinput::{conv2d_dinput, conv2d_dinput_flipped, dinput_flipped_filter};
pub use dweight::conv2d_dweight;
pub use forward::conv2d_forward;
pub use halo::HaloBlock;
