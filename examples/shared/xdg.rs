//! Quiets `error: XDG_RUNTIME_DIR is invalid or not set`, which the system's
//! Vulkan WSI layer prints for every wgpu instance where the variable is unset
//! (a headless server, a container, a CI job): it reads like a failure and is
//! none, since aether draws no window.

/// Points `XDG_RUNTIME_DIR` at a private folder under the temp dir when it is
/// unset. Call it first thing in `main`, before any thread starts.
pub fn quiet_missing_runtime_dir() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join("aether-xdg-runtime");
    if std::fs::create_dir_all(&dir).is_err() {
        return; // the message shows, and means no more than before
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    }
    // SAFETY: called at the start of `main`, before the program starts any
    // thread, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
}
