//! File helpers shared by everything that writes user-visible files.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{AetherError, Result};

/// Writes `bytes` to `path` through a temporary file in the same directory and a
/// rename, so a crash never leaves a half-written file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |action, source| AetherError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io("create directory for", e))?;
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    tmp_name.push(format!(".tmp-{}-{serial}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("write", e));
    }
    Ok(())
}

/// Checks, before long work whose result goes to `path`, that
/// [`write_atomic`] will be able to write it: `path` is not a directory and a
/// file can be created next to it (the directory is created as
/// `write_atomic` would). The probe file is removed again.
pub fn check_writable(path: &Path) -> Result<()> {
    let io = |action, source| AetherError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    if path.is_dir() || path.file_name().is_none() {
        return Err(io(
            "write",
            std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "is a directory, not a file",
            ),
        ));
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|e| io("create directory for", e))?;
    }
    let mut probe_name = path.file_name().unwrap_or_default().to_owned();
    probe_name.push(format!(".probe-{}", std::process::id()));
    let probe = path.with_file_name(probe_name);
    std::fs::File::create(&probe).map_err(|e| io("write", e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The most bytes aether reads from a model file: 16 GiB, four billion f32
/// values, past what one model's tensors may hold on a GPU.
pub const MAX_MODEL_FILE_BYTES: u64 = 16 << 30;
/// The most bytes aether reads from a pipeline-cache file (wgpu's are a few MiB).
pub const MAX_PIPELINE_CACHE_BYTES: u64 = 256 << 20;

/// The contents of `path`, a regular file (a link to one is followed) of at
/// most `max` bytes. Anything else is refused before it is opened or read,
/// with an error of kind `InvalidInput` (not a regular file: a FIFO would
/// block the open, a device such as `/dev/zero` never ends) or `FileTooLarge`
/// (over `max`, checked again while reading in case the file grows), so no
/// file makes aether hang or take more memory than `max`. Every file aether
/// reads goes through here. A file swapped for a FIFO between the check and
/// the open could still block the open; the handle is checked again once open.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let (file, len) = open_regular(path, max)?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64, max));
    }
    Ok(bytes)
}

/// `path` opened for reading and its length, with the checks of
/// [`read_regular`]; for a caller that reads it in pieces, no more than `max`
/// bytes.
pub fn open_regular(path: &Path, max: u64) -> std::io::Result<(std::fs::File, u64)> {
    use std::io::{Error, ErrorKind};
    let check = |meta: &std::fs::Metadata| {
        if !meta.is_file() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("not a regular file (a {})", file_kind(meta)),
            ));
        }
        if meta.len() > max {
            return Err(too_large(meta.len(), max));
        }
        Ok(())
    };
    check(&std::fs::metadata(path)?)?;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    check(&meta)?;
    Ok((file, meta.len()))
}

fn too_large(bytes: u64, max: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::FileTooLarge,
        format!("{bytes} bytes or more, past the limit of {max} bytes"),
    )
}

/// What a file that is not a regular one is, for error messages.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_char_device() {
            return "character device";
        }
        if t.is_block_device() {
            return "block device";
        }
        if t.is_socket() {
            return "socket";
        }
    }
    if meta.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// The first key that appears twice in one object of a safetensors file's
/// JSON header `bytes` (its top level, the tensors' entries, the metadata):
/// the parsers keep the last and lose the rest, so a model file with one is
/// refused rather than read one way here and another way elsewhere. `None`
/// where every key is unique, or the header is not readable (the safetensors
/// parser reports that).
pub(crate) fn duplicate_header_key(bytes: &[u8]) -> Option<String> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header = bytes.get(8..8usize.checked_add(usize::try_from(len).ok()?)?)?;
    let mut de = serde_json::Deserializer::from_slice(header);
    serde::de::DeserializeSeed::deserialize(UniqueKeys { depth: 0 }, &mut de)
        .ok()
        .flatten()
}

/// Walks a JSON value, returning the first key repeated within one object
/// at depth 0 or 1 (deeper values are skipped).
struct UniqueKeys {
    depth: u8,
}

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys {
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = std::collections::HashSet::new();
        let mut duplicate = None;
        while let Some(key) = map.next_key::<String>()? {
            let inner = if self.depth == 0 {
                map.next_value_seed(UniqueKeys { depth: 1 })?
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
                None
            };
            if duplicate.is_none() {
                duplicate = if seen.insert(key.clone()) {
                    inner
                } else {
                    Some(key)
                };
            }
        }
        Ok(duplicate)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}
