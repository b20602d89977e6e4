//! Elementwise operations shared by the layers.

mod relu;

pub use relu::relu;
