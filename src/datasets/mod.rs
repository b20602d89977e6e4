//! Public datasets and the code of the examples that train on them, kept in
//! the library so that tests can reach it: loaders, argument parsing, host-side
//! augmentation and training plots.

pub mod augment;
pub mod cifar10;
pub mod plot;
