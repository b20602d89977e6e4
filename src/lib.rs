//! # aether
//!
//! Train convolutional networks on any GPU through wgpu and WGSL compute shaders
//! (Vulkan, Metal, DX12), with a pure-Rust CPU path that runs the same operations.
//!
//! Pick a [`Device`] ([`Device::best`] honours `AETHER_DEVICE=cpu|gpu|auto` and
//! `AETHER_ADAPTER=<name substring>`), build a [`Model`] from the layers in
//! [`nn`], then `finalize`, `train`, `predict`, `save`:
//!
//! ```
//! use aether::{Device, TrainOptions};
//!
//! let device = Device::Cpu; // or Device::best()?
//! let mut model = aether::zoo::cifar10_v1(42); // configured: loss and AdamW
//! model.to(&device)?;
//! model.finalize(&[16, 16, 3])?; // one sample: height, width, channels
//! let (x, y) = aether::data::synthetic_images(8, 16, 16, 1)?;
//! let options = TrainOptions { epochs: 1, batch_size: 4, progress: false, ..Default::default() };
//! let history = model.train(&x, &y, &options)?;
//! assert_eq!(history.epochs[0].steps, 2);
//! let probabilities = model.predict(&x[..16 * 16 * 3], 1, false)?;
//! assert_eq!(probabilities.len(), 10);
//! # Ok::<(), aether::AetherError>(())
//! ```
//!
//! [`wgpu`] is re-exported, so an app uses the version aether was built with.

pub mod conv;
pub mod data;
pub mod datasets;
pub mod device;
#[doc(hidden)]
pub mod diagnostics;
pub mod error;
pub mod gpu;
pub mod graph;
pub mod import;
#[doc(hidden)]
pub mod io;
pub mod model;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod progress;
pub mod tensor;
pub mod threads;
pub mod tta;
pub mod zoo;

pub use conv::Padding;
pub use device::Device;
pub use error::{AetherError, Result};
pub use graph::{Graph, NodeId};
pub use model::{
    BatchContext, BatchHook, Checkpoint, EpochHook, EpochStats, Gradients, History, Loss, Metric,
    Model, TrainOptions,
};
pub use serde_json;
pub use tensor::{DType, Shape, Tensor, TensorBuffer};
pub use tta::Tta;
pub use wgpu;

/// README.md's Rust examples, run by `cargo test --doc` so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
