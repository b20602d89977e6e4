//! `[aether]` warnings: printed once per distinct key, and counted so tests can
//! prove a fallback was announced rather than hidden.

use std::collections::HashSet;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

fn registry() -> &'static Mutex<(HashSet<String>, Vec<String>)> {
    static REGISTRY: OnceLock<Mutex<(HashSet<String>, Vec<String>)>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Prints `[aether] {message}` to stderr the first time `key` is seen; later
/// calls with the same key are silent. Returns whether it printed.
pub fn warn_once(key: &str, message: &str) -> bool {
    let mut guard = registry().lock().unwrap_or_else(|e| e.into_inner());
    if !guard.0.insert(key.to_owned()) {
        return false;
    }
    let line = format!("[aether] {message}");
    guard.1.push(line.clone());
    drop(guard);
    // Written straight to stderr (not `eprintln!`) so test harness capture never hides it.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    true
}

/// Every warning printed so far in this process, in order, `[aether]` prefix included.
pub fn warnings() -> Vec<String> {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .1
        .clone()
}
