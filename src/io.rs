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
