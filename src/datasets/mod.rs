//! Loaders of public datasets, in the `(inputs, labels)` layout [`Model::train`](crate::Model::train) takes.

pub mod cifar10;
pub mod image_folder;
