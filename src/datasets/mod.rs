//! Public datasets and the code of the examples that train on them, kept in
//! the library so that tests can reach it: loaders, argument parsing and
//! training plots.

pub mod cifar10;
pub mod image_folder;
pub mod plot;
