//! The headless test harness: one test body runs on the CPU path and on whatever
//! GPU adapter is present (lavapipe in CI), in the manner of candle's `test_device!`.
//!
//! With no adapter the GPU case prints a visible `SKIP` line; with
//! `AETHER_REQUIRE_GPU=1` (set by CI) a missing adapter fails the test instead,
//! and with `AETHER_REQUIRE_COOP=1` so does an adapter without cooperative matrices.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod conv_cases;
pub mod conv_reference;
pub mod drawn;
pub mod noop;

use std::io::Write;
use std::sync::OnceLock;

use aether::conv::{ConvDirection, ConvPlans};
use aether::gpu::{DevicePreference, GpuOptions};
use aether::model::{Loss, Metric};
use aether::optim::Adam;
use aether::{Device, Model, Tensor};

/// `model` ready to train: plain softmax cross-entropy and Adam (lr 1e-3), on
/// `device`, finalized for the per-sample `input` shape.
pub fn ready_model(mut model: Model, device: &Device, input: &[usize]) -> Model {
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    model.to(device).unwrap();
    model.finalize(input).unwrap();
    model
}

/// Writes straight to stderr, bypassing libtest's capture, so skips and adapter
/// reports show in a plain `cargo test` run.
pub fn report(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{message}");
}

fn test_name() -> String {
    std::thread::current().name().unwrap_or("?").to_owned()
}

/// Options for test contexts: the environment's, with a throwaway cache directory
/// unless `AETHER_CACHE_DIR` is set.
pub fn test_gpu_options() -> GpuOptions {
    let mut options = GpuOptions::from_env().expect("valid AETHER_* environment");
    if std::env::var_os("AETHER_CACHE_DIR").is_none() {
        options.cache_dir = Some(std::env::temp_dir().join("aether-test-cache"));
    }
    options
}

/// The shared GPU device for this test binary, or `None` (after a visible skip
/// line) when there is no adapter.
pub fn gpu() -> Option<Device> {
    static GPU: OnceLock<Option<Device>> = OnceLock::new();
    let device = GPU.get_or_init(|| {
        match Device::with_preference(DevicePreference::Gpu, &test_gpu_options()) {
            Ok(device) => {
                let caps = device.gpu_context().expect("gpu").caps();
                report(&format!(
                    "[aether-test] GPU tests run on {}",
                    caps.describe()
                ));
                let coop = caps.coop_f16_f32_tile().is_some() && !caps.coop_disabled;
                assert!(
                    coop || std::env::var("AETHER_REQUIRE_COOP").as_deref() != Ok("1"),
                    "AETHER_REQUIRE_COOP=1 but the adapter runs no coop kernels: {}",
                    caps.describe()
                );
                Some(device)
            }
            Err(e) => {
                assert!(
                    std::env::var("AETHER_REQUIRE_GPU").as_deref() != Ok("1"),
                    "AETHER_REQUIRE_GPU=1 but no GPU adapter: {e}"
                );
                None
            }
        }
    });
    if device.is_none() {
        skip("no GPU adapter");
    }
    device.clone()
}

/// Prints a visible skip line for the current test.
pub fn skip(reason: &str) {
    report(&format!("[aether-test] SKIP {}: {reason}", test_name()));
}

/// Runs one test body on the CPU path (`name::cpu`) and on the GPU (`name::gpu`).
#[macro_export]
macro_rules! test_device {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn cpu() {
                ($body)(&aether::Device::Cpu);
            }

            #[test]
            fn gpu() {
                if let Some(device) = $crate::common::gpu() {
                    ($body)(&device);
                }
            }
        }
    };
}

/// A small, fast PRNG (SplitMix64) so test data is fresh each run yet
/// reproducible: each one prints its seed into the test's captured output,
/// which libtest shows with every failure.
pub struct Rng {
    state: u64,
    pub seed: u64,
}

impl Rng {
    /// Seeded from `AETHER_TEST_SEED` (a malformed value fails the test), else
    /// from the clock.
    pub fn fresh() -> Self {
        let seed = match std::env::var("AETHER_TEST_SEED") {
            Ok(text) => text
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("AETHER_TEST_SEED={text:?} is not a u64 seed")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5eed),
        };
        // Captured by libtest: shown only where the test fails.
        eprintln!(
            "[aether-test] random data from seed {seed} (AETHER_TEST_SEED={seed} replays it)"
        );
        Self { state: seed, seed }
    }

    /// Seeded from `seed`, for a draw that a seed names (not reported).
    pub fn seeded(seed: u64) -> Self {
        Self { state: seed, seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.uniform()).collect()
    }
}

/// `t`'s f32 values as their bits, for comparisons that must be bit-exact
/// (NaN payloads and signed zeros included).
pub fn f32_bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// A fresh, empty folder under the system temp dir, named for this process
/// and `name`, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("aether-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The split of dweight's reduction that `plans` chose (its first dweight
/// plan); a panic where none was planned.
pub fn dweight_split(plans: &ConvPlans) -> u32 {
    plans
        .summary()
        .into_iter()
        .find(|(d, _, _)| *d == ConvDirection::DWeight)
        .map(|(_, _, p)| p.split_k)
        .expect("a dweight plan")
}
