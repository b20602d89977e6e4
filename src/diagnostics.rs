//! `[aether]` warnings: printed once per distinct key, and counted so tests can
//! prove a fallback was announced rather than hidden.

use std::cell::Cell;
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
    if QUIET.with(Cell::get) {
        return false;
    }
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

thread_local! {
    /// Set while this thread runs [`quietly`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's warnings dropped (not printed, and not
/// remembered, so the same event later still prints): for trial work whose
/// declines and failures are expected, such as the candidates of a measured
/// conv plan.
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> T {
    let before = QUIET.with(|q| q.replace(true));
    let result = f();
    QUIET.with(|q| q.set(before));
    result
}

/// Every warning printed so far in this process, in order, `[aether]` prefix included.
pub fn warnings() -> Vec<String> {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .1
        .clone()
}
