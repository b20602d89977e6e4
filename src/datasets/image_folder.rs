//! Labelled images from folders: `root/<class>/*.png|jpg|jpeg`, one folder a
//! class, as many image tools lay them out.
//!
//! Images come out as CIFAR-10's do ([`super::cifar10::Cifar10`]): NHWC f32
//! in [0, 1] (byte / 255, RGB) with `u32` labels, ready for `Model::train`.
//! What each kind of entry does:
//!
//! - Class folders are sorted by name; a label is the class's index in
//!   [`ImageFolder::class_names`]. Files in a class folder are read in name
//!   order, class after class.
//! - A class folder with no image keeps its name and index (so that a train
//!   and a test folder with the same classes label alike) and is announced
//!   with an `[aether]` warning.
//! - Entries that are not images by their extension (a `notes.txt`, a
//!   subfolder of a class folder, files beside the class folders) are
//!   skipped and announced with one `[aether]` warning naming one of them.
//!   Hidden entries (names starting with `.`) are skipped silently.
//! - An image that does not decode, or (with [`Sizing::Exact`]) has another
//!   size, is an [`AetherError::Dataset`] naming the file; nothing is loaded.
//! - Grey and 16-bit images are converted to 8-bit RGB; an alpha channel is
//!   dropped (not composited).

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};

/// The extensions read as images (any case).
pub const IMAGE_EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// How images of different sizes become one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// Every image must be `height x width`; another size is an error
    /// naming the file and both sizes.
    Exact { height: usize, width: usize },
    /// Every image is resized to `height x width` (a triangle filter, aspect
    /// ratio not kept).
    Resize { height: usize, width: usize },
}

impl Sizing {
    fn dims(self) -> (usize, usize) {
        match self {
            Self::Exact { height, width } | Self::Resize { height, width } => (height, width),
        }
    }
}

/// A loaded image folder: NHWC f32 images in [0, 1] and their labels.
#[derive(Clone, Debug)]
pub struct ImageFolder {
    /// `files.len() x height x width x 3` values.
    pub images: Vec<f32>,
    /// Per image, its class's index in `class_names`.
    pub labels: Vec<u32>,
    /// The class folders' names, sorted.
    pub class_names: Vec<String>,
    /// Per image, the file it came from.
    pub files: Vec<PathBuf>,
    pub height: usize,
    pub width: usize,
}

fn dataset_err(path: &Path, reason: impl Into<String>) -> AetherError {
    AetherError::Dataset {
        path: path.to_owned(),
        record: None,
        reason: reason.into(),
    }
}

/// Loads `root/<class>/*.png|jpg|jpeg` at the size `sizing` sets (see the
/// module documentation for what each kind of entry does). A root that
/// cannot be read, holds no class folder or no image at all, or a zero size,
/// is an [`AetherError::Dataset`] naming the path.
pub fn load_image_folder(root: &Path, sizing: Sizing) -> Result<ImageFolder> {
    let (height, width) = sizing.dims();
    if height == 0 || width == 0 {
        return Err(dataset_err(
            root,
            format!("{height}x{width} images hold nothing"),
        ));
    }
    let mut skipped = Vec::new();
    let mut classes = Vec::new();
    for (name, path) in entries(root)? {
        if path.is_dir() {
            classes.push((name, path));
        } else {
            skipped.push(path);
        }
    }
    if classes.is_empty() {
        return Err(dataset_err(
            root,
            "no class folders (expected root/<class>/*.png|jpg)",
        ));
    }
    let mut class_names = Vec::with_capacity(classes.len());
    let mut files = Vec::new();
    let mut labels = Vec::new();
    for (label, (name, dir)) in classes.into_iter().enumerate() {
        let before = files.len();
        for (_, path) in entries(&dir)? {
            if path.is_file() && is_image(&path) {
                files.push(path);
                labels.push(label as u32);
            } else {
                skipped.push(path);
            }
        }
        if files.len() == before {
            warn_once(
                &format!("empty-class:{}", dir.display()),
                &format!(
                    "class folder {} holds no image: class {label} ({name:?}) has no samples",
                    dir.display()
                ),
            );
        }
        class_names.push(name);
    }
    if let Some(first) = skipped.first() {
        warn_once(
            &format!("skipped:{}", root.display()),
            &format!(
                "{} entries under {} are not images ({}) and were skipped, such as {}",
                skipped.len(),
                root.display(),
                IMAGE_EXTENSIONS.join(", "),
                first.display()
            ),
        );
    }
    if files.is_empty() {
        return Err(dataset_err(root, "no images in any class folder"));
    }
    let values = [files.len(), height, width, 3]
        .into_iter()
        .try_fold(1usize, usize::checked_mul)
        .filter(|_| u32::try_from(height.max(width)).is_ok())
        .ok_or_else(|| {
            dataset_err(
                root,
                format!(
                    "{} images of {height}x{width} are too many values",
                    files.len()
                ),
            )
        })?;
    let decoded: Vec<Result<Vec<f32>>> =
        files.par_iter().map(|path| decode(path, sizing)).collect();
    let mut images = Vec::with_capacity(values);
    for image in decoded {
        images.extend(image?);
    }
    Ok(ImageFolder {
        images,
        labels,
        class_names,
        files,
        height,
        width,
    })
}

/// The visible entries of `dir` as (UTF-8 name, path), sorted by name.
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let read =
        std::fs::read_dir(dir).map_err(|e| dataset_err(dir, format!("cannot read ({e})")))?;
    let mut out = Vec::new();
    for entry in read {
        let path = entry
            .map_err(|e| dataset_err(dir, format!("cannot read ({e})")))?
            .path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            return Err(dataset_err(&path, "the name is not UTF-8"));
        };
        if !name.starts_with('.') {
            out.push((name, path));
        }
    }
    out.sort();
    Ok(out)
}

fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// One image file as `height x width x 3` values in [0, 1].
fn decode(path: &Path, sizing: Sizing) -> Result<Vec<f32>> {
    let (height, width) = sizing.dims();
    let image = image::ImageReader::open(path)
        .map_err(|e| dataset_err(path, format!("cannot open ({e})")))?
        .with_guessed_format()
        .map_err(|e| dataset_err(path, format!("cannot read ({e})")))?
        .decode()
        .map_err(|e| dataset_err(path, format!("not a valid PNG or JPEG image ({e})")))?;
    let (w, h) = (image.width() as usize, image.height() as usize);
    let rgb = match sizing {
        _ if (h, w) == (height, width) => image.into_rgb8(),
        Sizing::Exact { .. } => {
            return Err(dataset_err(
                path,
                format!("the image is {h}x{w} (height x width), expected {height}x{width}"),
            ));
        }
        Sizing::Resize { .. } => image::imageops::resize(
            &image.into_rgb8(),
            width as u32,
            height as u32,
            image::imageops::FilterType::Triangle,
        ),
    };
    Ok(rgb.as_raw().iter().map(|&b| f32::from(b) / 255.0).collect())
}
