//! # aether
//!
//! Train convolutional networks on any GPU through wgpu and WGSL compute shaders
//! (Vulkan, Metal, DX12), with a pure-Rust CPU path that runs the same operations.
//!
//! Start with [`Device::best`], which honours `AETHER_DEVICE=cpu|gpu|auto` and
//! `AETHER_ADAPTER=<name substring>`, then build [`Tensor`]s on it.

pub mod conv;
pub mod data;
pub mod datasets;
pub mod device;
pub mod diagnostics;
pub mod error;
pub mod gpu;
pub mod io;
pub mod model;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod tensor;
pub mod threads;
pub mod zoo;

pub use device::Device;
pub use error::{AetherError, Result};
pub use model::{Checkpoint, History, Loss, Metric, Model, TrainOptions};
pub use tensor::{DType, Shape, Tensor, TensorBuffer};
