//! `cargo run --release --example predict_latency -- [calls]`: the latency of
//! predicting one 32x32 image with the reference CIFAR-10 CNN
//! (`aether::zoo::cifar10_v1`) through `Model::predict_into`, as an app's
//! frame loop calls it, on the device `AETHER_DEVICE` / `AETHER_ADAPTER`
//! choose. Prints the first call (pipelines compiled, buffers made), the
//! median, 90th percentile and fastest of the next `calls` (default 50), and
//! what those calls created: GPU buffers, bind groups and pipelines (all 0
//! once warm) and host allocations. See docs/inference.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use aether::{Device, data::synthetic_images, zoo::cifar10_v1};

/// Counts host allocations, to show what a warm call still allocates.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged, counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// What a context has created so far: (buffers, bind groups, pipelines).
fn created(device: &Device) -> Option<(usize, usize, usize)> {
    device.gpu_context().map(|c| {
        (
            c.pool().stats().created,
            c.bind_groups_created(),
            c.pipelines().compiled_count(),
        )
    })
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let calls: usize = match std::env::args().nth(1) {
        Some(text) => text
            .parse()
            .map_err(|_| format!("calls must be a positive count, got {text:?}"))?,
        None => 50,
    };
    if calls == 0 {
        return Err("calls must be at least 1".into());
    }
    let device = Device::best()?;
    match device.gpu_context() {
        Some(ctx) => println!("device: {}", ctx.caps().describe()),
        None => println!("device: the CPU path"),
    }
    let mut model = cifar10_v1(1);
    model.to(&device)?;
    model.finalize(&[32, 32, 3])?;
    let (images, _) = synthetic_images(calls + 1, 32, 32, 3)?;
    let image = |i: usize| &images[i * 32 * 32 * 3..(i + 1) * 32 * 32 * 3];
    let mut out = Vec::new();
    let start = Instant::now();
    model.predict_into(image(0), 1, false, &mut out)?;
    let first = start.elapsed().as_secs_f64() * 1e3;
    let before = created(&device);
    let mut times = Vec::with_capacity(calls);
    let mut allocations = 0;
    for i in 1..=calls {
        let (start, count) = (Instant::now(), ALLOCATIONS.load(Ordering::Relaxed));
        model.predict_into(image(i), 1, false, &mut out)?;
        allocations += ALLOCATIONS.load(Ordering::Relaxed) - count;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let after = created(&device);
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!("first call: {first:.2} ms (compiles pipelines, makes buffers)");
    println!(
        "next {calls} calls: median {:.3} ms, p90 {:.3} ms, fastest {:.3} ms",
        at(0.5),
        at(0.9),
        times[0]
    );
    if let (Some(b), Some(a)) = (before, after) {
        println!(
            "made by those calls: {} GPU buffers, {} bind groups, {} pipelines",
            a.0 - b.0,
            a.1 - b.1,
            a.2 - b.2
        );
    }
    println!(
        "host allocations per call: {:.1} (tensor handles and shapes; the output reuses its memory)",
        allocations as f64 / calls as f64
    );
    Ok(())
}
