//! Elementwise operations shared by the layers.

pub mod activation;
pub mod augment;
pub mod batchnorm;
pub mod dropout;
pub mod loss;
pub mod pool;
mod relu;

pub use relu::relu;
