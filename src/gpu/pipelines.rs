//! The pipeline cache: each (kernel, variant, shape constants) is compiled once.
//!
//! Compilation errors are caught with error scopes around both the shader module
//! and the pipeline, announced once with an `[aether]` warning, remembered (no retry
//! storm) and reported as `None` so the caller takes its next variant. Where the
//! backend supports it, wgpu's `PipelineCache` data is persisted to disk: after
//! the next wait for the GPU once pipelines were compiled, and on drop.
//!
//! Threads may ask for different pipelines at once: each key has a cell of its
//! own, filled outside the map's lock, so distinct keys compile in parallel
//! (wgpu's error scopes are per thread) while a second request for the same
//! key waits for the first.

use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::caps::GpuCapabilities;
use crate::diagnostics::warn_once;
use crate::error::{AetherError, Result};

/// Identifies one compiled pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// The kernel's name, e.g. `"conv_forward"`.
    pub kernel: &'static str,
    /// The variant, e.g. `"coop16"` or `"portable_f16"`.
    pub variant: &'static str,
    /// WGSL `override` constants baked into this pipeline.
    pub constants: Vec<(&'static str, u32)>,
    /// Constants written into the WGSL source itself (they size arrays or pick
    /// generated code, so they cannot be overrides).
    pub source_constants: Vec<(&'static str, u32)>,
}

impl PipelineKey {
    pub fn new(kernel: &'static str, variant: &'static str) -> Self {
        Self {
            kernel,
            variant,
            constants: Vec::new(),
            source_constants: Vec::new(),
        }
    }

    pub fn with(mut self, name: &'static str, value: u32) -> Self {
        self.constants.push((name, value));
        self
    }
}

/// Compiled pipelines, and the keys that failed to compile.
pub struct PipelineCache {
    device: wgpu::Device,
    adapter_name: String,
    entries: Mutex<HashMap<PipelineKey, Arc<PipelineCell>>>,
    disk: Option<DiskCache>,
    break_kernels: Vec<String>,
    params_in_immediates: bool,
    checks: wgpu::ShaderRuntimeChecks,
    /// Every module built, where [`GpuOptions::record_shaders`](super::GpuOptions::record_shaders) asks.
    recorded: Option<Mutex<Vec<BuiltShader>>>,
}

/// A key's pipeline once compiled; `None` inside where it failed to compile.
type PipelineCell = OnceLock<Option<Arc<wgpu::ComputePipeline>>>;

/// One WGSL module as aether handed it to the device: what naga translates
/// for the backend (see [`PipelineCache::built_shaders`]).
#[derive(Clone, Debug)]
pub struct BuiltShader {
    pub key: PipelineKey,
    pub entry_point: String,
    /// The full WGSL, parameters already moved to immediates where they are.
    pub source: String,
}

/// wgpu's driver-level pipeline cache and the file it is persisted to.
struct DiskCache {
    path: PathBuf,
    cache: wgpu::PipelineCache,
    /// Pipelines were compiled since the file was last written.
    dirty: AtomicBool,
}

impl Drop for PipelineCache {
    fn drop(&mut self) {
        self.save_if_changed();
    }
}

impl PipelineCache {
    pub(crate) fn new(
        device: &wgpu::Device,
        info: &wgpu::AdapterInfo,
        caps: &GpuCapabilities,
        cache_dir: Option<&Path>,
        break_kernels: &[String],
        keep_index_checks: bool,
        record_shaders: bool,
    ) -> Self {
        let disk = match (
            caps.pipeline_cache,
            cache_dir,
            wgpu::util::pipeline_cache_key(info),
        ) {
            (true, Some(dir), Some(file)) => Some(DiskCache::open(device, dir.join(file))),
            _ => None,
        };
        Self {
            device: device.clone(),
            adapter_name: info.name.clone(),
            entries: Mutex::default(),
            disk,
            break_kernels: break_kernels.to_vec(),
            params_in_immediates: caps.params_in_immediates(),
            checks: runtime_checks(info.backend, keep_index_checks),
            recorded: record_shaders.then(Mutex::default),
        }
    }

    /// The pipeline for `key`, compiling `source()` on first use. `None` when it
    /// failed to compile, now or on an earlier call.
    pub fn get_or_create<'s>(
        &self,
        key: &PipelineKey,
        entry_point: &str,
        source: impl FnOnce() -> Cow<'s, str>,
    ) -> Option<Arc<wgpu::ComputePipeline>> {
        let cell = Arc::clone(
            self.entries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.clone())
                .or_default(),
        );
        cell.get_or_init(|| self.build(key, entry_point, source))
            .clone()
    }

    /// Compiles `source()` for `key`, announcing a failure once; `None` then.
    fn build<'s>(
        &self,
        key: &PipelineKey,
        entry_point: &str,
        source: impl FnOnce() -> Cow<'s, str>,
    ) -> Option<Arc<wgpu::ComputePipeline>> {
        let full_name = format!("{}:{}", key.kernel, key.variant);
        let broken = self
            .break_kernels
            .iter()
            .any(|b| *b == key.kernel || *b == full_name);
        let source = if broken {
            "this is deliberately not WGSL (GpuOptions::break_kernels)".into()
        } else {
            source()
        };
        let source = if self.params_in_immediates {
            Cow::Owned(params_as_immediates(&source))
        } else {
            source
        };
        if let Some(recorded) = &self.recorded {
            recorded
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(BuiltShader {
                    key: key.clone(),
                    entry_point: entry_point.to_owned(),
                    source: source.clone().into_owned(),
                });
        }
        let compiled = match self.compile(key, entry_point, &source) {
            Ok(pipeline) => Some(Arc::new(pipeline)),
            Err(message) => {
                warn_once(
                    &format!("compile:{}:{}", key.kernel, key.variant),
                    &format!(
                        "kernel {} variant {} failed to compile on {:?}; using the next variant. {}",
                        key.kernel,
                        key.variant,
                        self.adapter_name,
                        message.lines().take(6).collect::<Vec<_>>().join(" | ")
                    ),
                );
                None
            }
        };
        if compiled.is_some()
            && let Some(disk) = &self.disk
        {
            disk.dirty.store(true, Ordering::Relaxed);
        }
        compiled
    }

    /// Writes the driver cache to its file if pipelines were compiled since
    /// it was last written. Called once the host has waited for the GPU (and
    /// on drop), not per pipeline: each write serializes the whole cache, and
    /// a first training step compiles dozens of pipelines.
    pub fn save_if_changed(&self) {
        if let Some(disk) = &self.disk
            && disk.dirty.swap(false, Ordering::Relaxed)
        {
            disk.save();
        }
    }

    /// The pipeline of a kernel that has no other variant to fall back to: a
    /// compile failure (already announced) becomes `AetherError::NoKernelVariant`.
    pub fn require<'s>(
        &self,
        key: &PipelineKey,
        entry_point: &str,
        source: impl FnOnce() -> Cow<'s, str>,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        self.get_or_create(key, entry_point, source)
            .ok_or_else(|| AetherError::NoKernelVariant {
                kernel: key.kernel,
                adapter: self.adapter_name.clone(),
                reasons: format!("variant {} failed to compile", key.variant),
            })
    }

    /// Every module built so far, in order, when the context was made with
    /// [`GpuOptions::record_shaders`](super::GpuOptions::record_shaders);
    /// empty otherwise.
    pub fn built_shaders(&self) -> Vec<BuiltShader> {
        self.recorded.as_ref().map_or_else(Vec::new, |recorded| {
            recorded.lock().unwrap_or_else(|e| e.into_inner()).clone()
        })
    }

    /// Number of pipelines compiled successfully so far.
    pub fn compiled_count(&self) -> usize {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .values()
            .filter(|cell| cell.get().is_some_and(Option::is_some))
            .count()
    }

    /// Path of the persisted driver cache, when the backend has one.
    pub fn disk_path(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.path.as_path())
    }

    fn compile(
        &self,
        key: &PipelineKey,
        entry_point: &str,
        source: &str,
    ) -> Result<wgpu::ComputePipeline, String> {
        let device = &self.device;
        let label = format!("{}:{}", key.kernel, key.variant);
        let constants: Vec<(&str, f64)> = key
            .constants
            .iter()
            .map(|&(name, value)| (name, f64::from(value)))
            .collect();
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
        // Experimental shader paths in naga's backends have been known to panic
        // rather than report; a panic here must become a fallback, not a crash.
        let built = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let descriptor = wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(source)),
            };
            // SAFETY: the checks left out are those `runtime_checks` names,
            // for the reasons it gives.
            let module = unsafe { device.create_shader_module_trusted(descriptor, self.checks) };
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some(entry_point),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: self.disk.as_ref().map(|d| &d.cache),
            })
        }));
        let internal = pollster::block_on(internal.pop());
        let validation = pollster::block_on(validation.pop());
        match (built, validation, internal) {
            (Err(panic), _, _) => Err(format!("panicked: {}", panic_message(&panic))),
            (Ok(_), Some(e), _) | (Ok(_), None, Some(e)) => Err(e.to_string()),
            (Ok(pipeline), None, None) => Ok(pipeline),
        }
    }
}

/// The runtime checks naga builds into aether's shaders on `backend`:
///
/// - Never loop bounding, which guards against infinite loops: every loop in
///   aether's WGSL is bounded by constants, uniforms or buffer sizes. The
///   counter naga would add to each loop keeps the driver from unrolling
///   fixed-count loops, which sends register arrays to memory
///   (docs/lab/perf-notes.md, entry 4).
/// - On Vulkan, unless `keep_index_checks`, no index clamping either (a few
///   percent of every conv pass, entry 83). Reads and writes of buffers
///   stay bounded there by the driver's robust buffer access, a feature every
///   Vulkan driver has and wgpu enables. Workgroup and private arrays are
///   indexed within their sizes by construction: their indices are made of
///   the invocation's index and the constants that size them, and the test
///   suites run the rules' blocks and the pinned ones against the CPU
///   reference at both coop tile sizes. Other backends keep the clamping,
///   since their drivers promise no bounds on buffer access.
fn runtime_checks(backend: wgpu::Backend, keep_index_checks: bool) -> wgpu::ShaderRuntimeChecks {
    if backend == wgpu::Backend::Vulkan && !keep_index_checks {
        return wgpu::ShaderRuntimeChecks::unchecked();
    }
    wgpu::ShaderRuntimeChecks {
        force_loop_bounding: false,
        ..wgpu::ShaderRuntimeChecks::checked()
    }
}

/// Moves a kernel's parameter block from a uniform buffer to immediate data:
/// `@group(0) @binding(n) var<uniform> p: T;` becomes `var<immediate> p: T;`.
/// Every aether kernel declares at most one uniform, as its last binding (see
/// `gpu::batch`), so the remaining bindings keep their numbers.
fn params_as_immediates(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let declaration = !line.trim_start().starts_with("//");
        match line.find("var<uniform>").filter(|_| declaration) {
            Some(at) => out.push_str(&line[at..].replacen("var<uniform>", "var<immediate>", 1)),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic".to_owned())
}

impl DiskCache {
    /// Loads the cache file if it is there; an unreadable or corrupt file is
    /// ignored with a warning and replaced on the next save.
    fn open(device: &wgpu::Device, path: PathBuf) -> Self {
        let data = match crate::io::read_regular(&path, crate::io::MAX_PIPELINE_CACHE_BYTES) {
            Ok(data) => Some(data),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                warn_once(
                    &format!("cache-read:{}", path.display()),
                    &format!("ignoring unreadable pipeline cache {}: {e}", path.display()),
                );
                None
            }
        };
        if let Some(data) = &data {
            let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
            // SAFETY: the data is validated by wgpu (header, adapter key, checksum)
            // because `fallback` is false; a mismatch is reported as an error.
            let cache = unsafe {
                device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some("aether pipeline cache"),
                    data: Some(data),
                    fallback: false,
                })
            };
            match pollster::block_on(scope.pop()) {
                None => {
                    return Self {
                        path,
                        cache,
                        dirty: AtomicBool::new(false),
                    };
                }
                Some(e) => {
                    warn_once(
                        &format!("cache-corrupt:{}", path.display()),
                        &format!("ignoring corrupt pipeline cache {}: {e}", path.display()),
                    );
                }
            }
        }
        // SAFETY: no initial data is given.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("aether pipeline cache"),
                data: None,
                fallback: true,
            })
        };
        Self {
            path,
            cache,
            dirty: AtomicBool::new(false),
        }
    }

    /// Writes the cache atomically (temp file + rename); failure only warns.
    fn save(&self) {
        let Some(data) = self.cache.get_data() else {
            return;
        };
        if let Err(e) = crate::io::write_atomic(&self.path, &data) {
            warn_once(
                &format!("cache-write:{}", self.path.display()),
                &format!("could not save pipeline cache: {e}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::runtime_checks;

    #[test]
    fn index_checks_are_left_out_only_on_vulkan_unless_kept() {
        let vulkan = runtime_checks(wgpu::Backend::Vulkan, false);
        assert!(!vulkan.bounds_checks && !vulkan.force_loop_bounding);
        for (backend, keep) in [
            (wgpu::Backend::Vulkan, true),
            (wgpu::Backend::Metal, false),
            (wgpu::Backend::Dx12, false),
        ] {
            let checks = runtime_checks(backend, keep);
            assert!(checks.bounds_checks, "{backend:?}, kept {keep}");
            assert!(!checks.force_loop_bounding, "{backend:?}");
        }
    }
}
