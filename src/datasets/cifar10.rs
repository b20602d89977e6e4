//! CIFAR-10's binary version: [`load_cifar10`] reads the five training files
//! and the test file into NHWC f32 arrays, refusing a broken file with an
//! [`AetherError::Dataset`] naming it. `examples/cifar10/` trains on it.
//!
//! Images come out NHWC f32 in [0, 1] (byte / 255) with no per-channel
//! standardisation: the reference model has BatchNorm after every convolution,
//! which absorbs the input's offset and scale, and in [0, 1] zero padding is
//! plain black.

use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::{AetherError, Result};

/// Height and width of a CIFAR-10 image.
pub const IMAGE_SIDE: usize = 32;
/// Values of one image: 32 x 32 pixels x 3 channels.
pub const IMAGE_VALUES: usize = IMAGE_SIDE * IMAGE_SIDE * 3;
/// One record of the binary version: a label byte, then 1024 red, 1024 green
/// and 1024 blue bytes, each plane row-major.
pub const RECORD_BYTES: usize = 1 + IMAGE_VALUES;
/// The training files, in the order their images are used.
pub const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
pub const TEST_FILE: &str = "test_batch.bin";
/// Optional: one class name a line.
pub const META_FILE: &str = "batches.meta.txt";
/// The folder the binary version unpacks to; `load_cifar10` also looks inside it.
pub const ARCHIVE_DIR: &str = "cifar-10-batches-bin";
/// The class names used when there is no `batches.meta.txt`.
pub const CLASS_NAMES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// A loaded CIFAR-10: NHWC f32 images in [0, 1] (`IMAGE_VALUES` each) and labels 0..9.
#[derive(Clone, Debug)]
pub struct Cifar10 {
    pub train_x: Vec<f32>,
    pub train_y: Vec<u32>,
    pub test_x: Vec<f32>,
    pub test_y: Vec<u32>,
    pub class_names: Vec<String>,
}

fn dataset_err(path: &Path, record: Option<usize>, reason: impl Into<String>) -> AetherError {
    AetherError::Dataset {
        path: path.to_owned(),
        record,
        reason: reason.into(),
    }
}

/// Loads the binary version from `dir` (or from `dir/cifar-10-batches-bin`):
/// the training images of `data_batch_1.bin`..`data_batch_5.bin` in order, at
/// most `limit` of them, and all of `test_batch.bin`. Every file is checked
/// (present, non-empty, whole records) before any is read; training files past
/// the limit are not read. Any problem is an [`AetherError::Dataset`] naming
/// the file and, where one is at fault, the record (counting from 0).
pub fn load_cifar10(dir: &Path, limit: Option<usize>) -> Result<Cifar10> {
    let dir = locate(dir);
    if limit == Some(0) {
        return Err(dataset_err(
            &dir,
            None,
            "a limit of 0 training images loads nothing",
        ));
    }
    let train_paths: Vec<PathBuf> = TRAIN_FILES.iter().map(|f| dir.join(f)).collect();
    let test_path = dir.join(TEST_FILE);
    let mut counts = Vec::with_capacity(TRAIN_FILES.len());
    for path in &train_paths {
        counts.push(record_count(path)?);
    }
    let test_count = record_count(&test_path)?;
    let class_names = read_class_names(&dir.join(META_FILE))?;

    let mut wanted = limit.unwrap_or(usize::MAX);
    let takes: Vec<usize> = counts
        .iter()
        .map(|&count| {
            let take = count.min(wanted);
            wanted -= take;
            take
        })
        .collect();
    // Sized once: the images take 4 bytes per pixel byte read, and nothing
    // else grows with the files (see `read_records`).
    let train_total: usize = takes.iter().sum();
    let mut train_x = Vec::with_capacity(train_total * IMAGE_VALUES);
    let mut train_y = Vec::with_capacity(train_total);
    for (path, take) in train_paths.iter().zip(takes) {
        if take > 0 {
            read_records(path, take, &mut train_x, &mut train_y)?;
        }
    }
    let mut test_x = Vec::with_capacity(test_count * IMAGE_VALUES);
    let mut test_y = Vec::with_capacity(test_count);
    read_records(&test_path, test_count, &mut test_x, &mut test_y)?;
    Ok(Cifar10 {
        train_x,
        train_y,
        test_x,
        test_y,
        class_names,
    })
}

/// `dir`, or its `cifar-10-batches-bin` subfolder when the files are there.
fn locate(dir: &Path) -> PathBuf {
    let nested = dir.join(ARCHIVE_DIR);
    if !dir.join(TRAIN_FILES[0]).exists() && nested.join(TRAIN_FILES[0]).is_file() {
        nested
    } else {
        dir.to_owned()
    }
}

/// The number of records in `path`, from its size.
fn record_count(path: &Path) -> Result<usize> {
    let meta = std::fs::metadata(path).map_err(|e| {
        dataset_err(
            path,
            None,
            format!(
                "cannot open ({e}); expected the CIFAR-10 binary version ({} and {TEST_FILE})",
                TRAIN_FILES.join(", ")
            ),
        )
    })?;
    if !meta.is_file() {
        return Err(dataset_err(path, None, "not a regular file"));
    }
    if meta.len() > MAX_DATA_FILE_BYTES {
        return Err(dataset_err(
            path,
            None,
            format!(
                "{} bytes, past the limit of {MAX_DATA_FILE_BYTES} bytes for one data file",
                meta.len()
            ),
        ));
    }
    let bytes = usize::try_from(meta.len())
        .map_err(|_| dataset_err(path, None, "too large for this machine"))?;
    check_length(path, bytes)
}

/// Records in a file of `bytes` bytes, or why the length is not one of the format's.
fn check_length(path: &Path, bytes: usize) -> Result<usize> {
    if bytes == 0 {
        return Err(dataset_err(path, None, "empty file: no records"));
    }
    let whole = bytes / RECORD_BYTES;
    let rest = bytes % RECORD_BYTES;
    if rest != 0 {
        return Err(dataset_err(
            path,
            Some(whole),
            format!(
                "truncated: the file has {bytes} bytes, not a whole number of {RECORD_BYTES}-byte \
                 records (label + 3072 pixels); this record has only {rest} bytes"
            ),
        ));
    }
    Ok(whole)
}

/// Records read and decoded at a time: a 3 MB buffer, whatever the file's size.
const RECORDS_PER_READ: usize = 1024;

/// The most bytes of one data file: 2^32, 1.4 million records, whose images
/// take 16 GiB as f32.
const MAX_DATA_FILE_BYTES: u64 = 1 << 32;

/// Appends the first `count` records of `path` to `images` (NHWC, in [0, 1])
/// and `labels`, reading [`RECORDS_PER_READ`] records at a time: memory grows
/// by the f32 images alone (4 bytes per pixel byte), never by a copy of the
/// file.
fn read_records(
    path: &Path,
    count: usize,
    images: &mut Vec<f32>,
    labels: &mut Vec<u32>,
) -> Result<()> {
    let (mut file, _) = crate::io::open_regular(path, MAX_DATA_FILE_BYTES)
        .map_err(|e| dataset_err(path, None, format!("cannot read ({e})")))?;
    let mut buffer = vec![0u8; RECORDS_PER_READ * RECORD_BYTES];
    let mut done = 0;
    while done < count {
        let records = (count - done).min(RECORDS_PER_READ);
        let chunk = &mut buffer[..records * RECORD_BYTES];
        let mut filled = 0;
        while filled < chunk.len() {
            match file.read(&mut chunk[filled..]) {
                Ok(0) => {
                    // The file shrank since its size was checked.
                    return Err(dataset_err(
                        path,
                        Some(done + filled / RECORD_BYTES),
                        "the file ended early while it was read",
                    ));
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(dataset_err(path, None, format!("cannot read ({e})"))),
            }
        }
        decode_into(path, chunk, done, images, labels)?;
        done += records;
    }
    Ok(())
}

/// Every record of one batch file's contents `bytes` (read from `path`, which
/// only names the file in errors), as NHWC images in [0, 1] and labels. The
/// same checks as [`load_cifar10`]: whole records, at least one, labels 0..9.
pub fn decode_batch(path: &Path, bytes: &[u8]) -> Result<(Vec<f32>, Vec<u32>)> {
    let count = check_length(path, bytes.len())?;
    let mut images = Vec::with_capacity(count * IMAGE_VALUES);
    let mut labels = Vec::with_capacity(count);
    decode_into(path, bytes, 0, &mut images, &mut labels)?;
    Ok((images, labels))
}

/// Appends the whole records `bytes`, the first of which is record `first`
/// of `path` (named in errors), to `images` and `labels`; a bad label is an
/// error and appends nothing.
fn decode_into(
    path: &Path,
    bytes: &[u8],
    first: usize,
    images: &mut Vec<f32>,
    labels: &mut Vec<u32>,
) -> Result<()> {
    let count = bytes.len() / RECORD_BYTES;
    if let Some(record) = bytes.chunks_exact(RECORD_BYTES).position(|r| r[0] > 9) {
        return Err(dataset_err(
            path,
            Some(first + record),
            format!("label {} is outside 0..9", bytes[record * RECORD_BYTES]),
        ));
    }
    labels.extend(bytes.chunks_exact(RECORD_BYTES).map(|r| u32::from(r[0])));
    let plane = IMAGE_SIDE * IMAGE_SIDE;
    let start = images.len();
    images.resize(start + count * IMAGE_VALUES, 0.0);
    images[start..]
        .par_chunks_exact_mut(IMAGE_VALUES)
        .zip(bytes.par_chunks_exact(RECORD_BYTES))
        .for_each(|(image, record)| {
            let planes = &record[1..];
            for (pixel, rgb) in image.chunks_exact_mut(3).enumerate() {
                for (c, value) in rgb.iter_mut().enumerate() {
                    *value = f32::from(planes[c * plane + pixel]) / 255.0;
                }
            }
        });
    Ok(())
}

/// The most bytes of `batches.meta.txt`, ten short names.
const MAX_META_BYTES: u64 = 64 << 10;

/// The ten names of `batches.meta.txt`, or the standard names when the file
/// is absent.
fn read_class_names(path: &Path) -> Result<Vec<String>> {
    match crate::io::read_regular(path, MAX_META_BYTES) {
        Ok(bytes) => parse_class_names(path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(CLASS_NAMES.iter().map(|s| s.to_string()).collect())
        }
        Err(e) => Err(dataset_err(path, None, format!("cannot read ({e})"))),
    }
}

/// The class names in the contents `bytes` of `batches.meta.txt` (read from
/// `path`, named in errors): UTF-8, one a line, blank lines ignored, exactly ten.
pub fn parse_class_names(path: &Path, bytes: &[u8]) -> Result<Vec<String>> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| dataset_err(path, None, "class names are not UTF-8 text"))?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if names.len() != CLASS_NAMES.len() {
        return Err(dataset_err(
            path,
            None,
            format!("{} class names, expected 10 (one a line)", names.len()),
        ));
    }
    Ok(names)
}
