//! Image folders (`root/<class>/*.png|jpg`) built in a temporary directory
//! from asymmetric pixel data: classes sorted and labelled by index, PNG
//! values exact and JPEG close, NHWC order; and what a wrong size, a file
//! that is no image, an empty class folder, a non-image file, a hidden file
//! and grey or RGBA images do (see `aether::datasets::image_folder`).

mod common;

use std::path::{Path, PathBuf};

use aether::AetherError;
use aether::datasets::image_folder::{ImageFolder, Sizing, load_image_folder};
use aether::diagnostics;
use common::Rng;
use image::{GrayImage, Rgb, RgbImage, Rgba, RgbaImage};

/// A fresh, empty directory for one test, removed when dropped.
struct TempRoot(PathBuf);

impl std::ops::Deref for TempRoot {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_root(test: &str) -> TempRoot {
    let dir =
        std::env::temp_dir().join(format!("aether-image-folder-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempRoot(dir)
}

/// An image whose every value differs with row, column and channel (and
/// with `seed`), so a transposed or flipped load cannot pass.
fn asymmetric(height: u32, width: u32, rng: &mut Rng) -> RgbImage {
    let base = (rng.next_u64() % 64) as u32;
    RgbImage::from_fn(width, height, |x, y| {
        let v = |c: u32| ((base + 37 * y + 11 * x + 83 * c) % 256) as u8;
        Rgb([v(0), v(1), v(2)])
    })
}

/// A smooth image (JPEG keeps it close).
fn smooth(height: u32, width: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        Rgb([
            (40 + 8 * x) as u8,
            (200 - 6 * y) as u8,
            (90 + 2 * x + 3 * y) as u8,
        ])
    })
}

fn save(image: &RgbImage, path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image.save(path).unwrap();
}

fn values(image: &RgbImage) -> Vec<f32> {
    image
        .as_raw()
        .iter()
        .map(|&b| f32::from(b) / 255.0)
        .collect()
}

fn exact(height: usize, width: usize) -> Sizing {
    Sizing::Exact { height, width }
}

fn per_image(folder: &ImageFolder) -> Vec<&[f32]> {
    folder
        .images
        .chunks(folder.height * folder.width * 3)
        .collect()
}

#[test]
fn classes_are_sorted_labels_are_their_indices_and_pixels_come_out_nhwc() {
    let root = temp_root("layout");
    let mut rng = Rng::fresh();
    let (zebra, ant_b) = (asymmetric(3, 5, &mut rng), asymmetric(3, 5, &mut rng));
    save(&zebra, &root.join("zebra/a.png"));
    save(&ant_b, &root.join("ant/b.PNG"));
    save(&smooth(3, 5), &root.join("ant/c.jpg"));
    save(&smooth(3, 5), &root.join("mole/d.jpeg"));
    let folder = load_image_folder(&root, exact(3, 5)).unwrap();
    assert_eq!(folder.class_names, ["ant", "mole", "zebra"]);
    assert_eq!(folder.labels, [0, 0, 1, 2]);
    let names: Vec<String> = folder
        .files
        .iter()
        .map(|f| f.strip_prefix(&*root).unwrap().display().to_string())
        .collect();
    assert_eq!(
        names,
        ["ant/b.PNG", "ant/c.jpg", "mole/d.jpeg", "zebra/a.png"]
    );
    assert_eq!((folder.height, folder.width), (3, 5));
    let images = per_image(&folder);
    assert_eq!(images.len(), 4);
    assert_eq!(images[0], values(&ant_b), "PNG values are byte / 255, NHWC");
    assert_eq!(images[3], values(&zebra));
    let want = values(&smooth(3, 5));
    for jpeg in [images[1], images[2]] {
        let worst = jpeg
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 0.1, "JPEG differs by {worst}");
    }
}

#[test]
fn a_wrong_size_is_an_error_naming_the_file_or_resized_when_asked() {
    let root = temp_root("size");
    let mut rng = Rng::fresh();
    save(&asymmetric(4, 4, &mut rng), &root.join("a/one.png"));
    save(&asymmetric(6, 2, &mut rng), &root.join("b/wide.png"));
    let err = load_image_folder(&root, exact(4, 4)).unwrap_err();
    assert!(
        matches!(&err, AetherError::Dataset { path, .. } if path.ends_with("b/wide.png")),
        "{err}"
    );
    assert!(
        err.to_string().contains("6x2") && err.to_string().contains("4x4"),
        "{err}"
    );
    let resized = load_image_folder(
        &root,
        Sizing::Resize {
            height: 4,
            width: 4,
        },
    )
    .unwrap();
    assert_eq!(resized.images.len(), 2 * 4 * 4 * 3);
    assert_eq!((resized.height, resized.width), (4, 4));
    assert!(resized.images.iter().all(|v| (0.0..=1.0).contains(v)));
    // An image already at the size is not resampled.
    let first = values(&image::open(root.join("a/one.png")).unwrap().into_rgb8());
    assert_eq!(per_image(&resized)[0], first);
}

#[test]
fn a_file_that_is_no_image_is_an_error_naming_it() {
    let root = temp_root("bad");
    let mut rng = Rng::fresh();
    save(&asymmetric(2, 2, &mut rng), &root.join("cat/good.png"));
    std::fs::write(root.join("cat/broken.png"), b"\x89PNG but then nothing").unwrap();
    let err = load_image_folder(&root, exact(2, 2)).unwrap_err();
    assert!(
        matches!(&err, AetherError::Dataset { path, .. } if path.ends_with("cat/broken.png")),
        "{err}"
    );
    // A truncated JPEG, too.
    std::fs::remove_file(root.join("cat/broken.png")).unwrap();
    let mut jpeg = Vec::new();
    smooth(8, 8)
        .write_to(
            &mut std::io::Cursor::new(&mut jpeg),
            image::ImageFormat::Jpeg,
        )
        .unwrap();
    std::fs::write(root.join("cat/cut.jpg"), &jpeg[..jpeg.len() / 3]).unwrap();
    let err = load_image_folder(&root, exact(2, 2)).unwrap_err();
    assert!(err.to_string().contains("cut.jpg"), "{err}");
}

#[test]
fn an_empty_class_folder_keeps_its_label_and_is_announced() {
    let root = temp_root("empty");
    let mut rng = Rng::fresh();
    save(&asymmetric(2, 3, &mut rng), &root.join("a/x.png"));
    std::fs::create_dir_all(root.join("b")).unwrap();
    save(&asymmetric(2, 3, &mut rng), &root.join("c/y.png"));
    let folder = load_image_folder(&root, exact(2, 3)).unwrap();
    assert_eq!(folder.class_names, ["a", "b", "c"]);
    assert_eq!(folder.labels, [0, 2]);
    let announced = diagnostics::warnings()
        .iter()
        .any(|w| w.starts_with("[aether] ") && w.contains(&root.join("b").display().to_string()));
    assert!(announced, "{:?}", diagnostics::warnings());
}

#[test]
fn non_image_entries_are_skipped_and_announced_hidden_ones_silently() {
    let root = temp_root("skip");
    let mut rng = Rng::fresh();
    let kept = asymmetric(2, 2, &mut rng);
    save(&kept, &root.join("dog/1.png"));
    std::fs::write(root.join("dog/notes.txt"), "not an image").unwrap();
    std::fs::write(root.join("dog/.hidden.png"), "not even read").unwrap();
    std::fs::write(root.join("README.md"), "about the data").unwrap();
    let folder = load_image_folder(&root, exact(2, 2)).unwrap();
    assert_eq!(folder.class_names, ["dog"]);
    assert_eq!(folder.images, values(&kept));
    let line = diagnostics::warnings()
        .into_iter()
        .find(|w| w.contains(&root.display().to_string()) && w.contains("skipped"))
        .expect("the skipped entries are announced");
    assert!(
        line.contains("2 entries") && !line.contains(".hidden"),
        "{line}"
    );
}

#[test]
fn grey_and_rgba_images_become_rgb() {
    let root = temp_root("channels");
    let grey = GrayImage::from_fn(3, 2, |x, y| image::Luma([(50 * x + 90 * y) as u8]));
    let rgba = RgbaImage::from_fn(3, 2, |x, y| Rgba([x as u8 * 70, y as u8 * 100, 7, 3]));
    std::fs::create_dir_all(root.join("k")).unwrap();
    grey.save(root.join("k/grey.png")).unwrap();
    rgba.save(root.join("k/rgba.png")).unwrap();
    let folder = load_image_folder(&root, exact(2, 3)).unwrap();
    let images = per_image(&folder);
    let grey_want: Vec<f32> = grey
        .as_raw()
        .iter()
        .flat_map(|&v| [f32::from(v) / 255.0; 3])
        .collect();
    assert_eq!(images[0], grey_want);
    let rgba_want: Vec<f32> = rgba
        .pixels()
        .flat_map(|p| [p[0], p[1], p[2]].map(|v| f32::from(v) / 255.0))
        .collect();
    assert_eq!(images[1], rgba_want, "alpha dropped, colour kept");
}

#[test]
fn a_root_without_classes_or_images_is_an_error_naming_it() {
    let root = temp_root("nothing");
    let err = load_image_folder(&root, exact(2, 2)).unwrap_err();
    assert!(
        matches!(&err, AetherError::Dataset { path, .. } if path == &*root),
        "{err}"
    );
    std::fs::create_dir_all(root.join("a")).unwrap();
    let err = load_image_folder(&root, exact(2, 2)).unwrap_err();
    assert!(err.to_string().contains("no images"), "{err}");
    let missing = root.join("absent");
    let err = load_image_folder(&missing, exact(2, 2)).unwrap_err();
    assert!(
        matches!(&err, AetherError::Dataset { path, .. } if path == &missing),
        "{err}"
    );
    let err = load_image_folder(&root, exact(0, 2)).unwrap_err();
    assert!(err.to_string().contains("0x2"), "{err}");
}
