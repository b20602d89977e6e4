//! The convolution package: geometry and planning (`common`), the three GEMM
//! directions (`forward`, `dweight`, `dinput`), the coop GEMM's block geometry (`coop`),
//! the halo kernels for stride-1 convs (`halo` for the forward, `dweight_halo`, `dinput_halo`)
//! and the fp16 casts (`cast`).
//! WGSL sources live in `shaders/conv/`. A model needs none of this but
//! [`Padding`] (also at the crate root); the kernel functions are for
//! benchmarks and for ops outside a `Model`.

pub mod cast;
#[doc(hidden)]
pub mod common;
// Block geometry and tuning variables: public for the tests and benches.
#[doc(hidden)]
pub mod coop;
pub mod dinput;
mod dinput_halo;
pub mod dweight;
#[doc(hidden)]
pub mod dweight_halo;
pub mod forward;
#[doc(hidden)]
pub mod halo;
mod im2col;

pub use cast::{cast_f16, clip_f16_range, conv_backward_cast_fp16};
pub(crate) use cast::cast_f16_kept;
pub use common::{
    ConvDirection, ConvLaunchPlan, ConvParams, ConvPlans, ConvShapeMeta, ConvVariant, Padding,
    PlannedLaunch,
};
#[doc(hidden)]
pub use coop::CoopBlock;
pub use dinput::{conv2d_dinput, conv2d_dinput_flipped, dinput_flipped_filter};
pub use dweight::conv2d_dweight;
pub use forward::conv2d_forward;
#[doc(hidden)]
pub use halo::HaloBlock;
