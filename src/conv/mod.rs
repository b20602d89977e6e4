//! The convolution package, a folder per direction as the kernels run:
//!
//! - `shape`: geometry ([`Padding`], [`ConvParams`], [`ConvShapeMeta`]);
//! - `plan`: the variants an adapter offers and the plan chosen per shape;
//! - `gemm`: the GEMM cores (cooperative-matrix `gemm::coop`, portable) and
//!   how a kernel's shader is put together around them;
//! - `forward`, `dweight`, `dinput`: each direction's kernels, with the halo
//!   kernel for stride-1 convs in `halo.rs` beside them;
//! - `prepare`: every conv's plans made at once, on all cores, before a
//!   network's first step; `tune`: plans chosen by timing their candidates,
//!   where the options ask;
//! - `cast`: the fp16 casts; `cpu`: the CPU path's im2col; `operands`: checks
//!   of the tensors the kernels take.
//!
//! WGSL sources mirror this layout under `shaders/conv/`. A model needs none
//! of this but [`Padding`] (also at the crate root); the kernel functions are
//! for benchmarks and for ops outside a `Model`.

pub mod cast;
mod cpu;
pub mod dinput;
#[doc(hidden)]
pub mod direct;
pub mod dweight;
pub mod forward;
// Block geometry and the coop core: public for the tests and benches.
#[doc(hidden)]
pub mod gemm;
mod operands;
#[doc(hidden)]
pub mod plan;
mod prepare;
#[doc(hidden)]
pub mod shape;
pub mod tune;
pub mod tuning;

pub use cast::{cast_f16, clip_f16_range, conv_backward_cast_fp16};
pub(crate) use cast::{cast_f16_flagging, cast_f16_kept};
pub use dinput::{conv2d_dinput, conv2d_dinput_flipped, dinput_flipped_filter};
pub use dweight::conv2d_dweight;
pub use forward::conv2d_forward;
#[doc(hidden)]
pub use forward::halo::HaloBlock;
#[doc(hidden)]
pub use gemm::coop::CoopBlock;
pub use plan::{ConvDirection, ConvLaunchPlan, ConvPlans, ConvVariant, PlannedLaunch};
pub use prepare::{ConvWork, prepare_convs};
pub use shape::{ConvParams, ConvShapeMeta, Padding};
pub use tuning::ConvTuning;
