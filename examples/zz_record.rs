// Throwaway (not committed): host time of recording v1 steps.
use aether::Device;
use aether::data::synthetic_images;
use aether::gpu::{DevicePreference, GpuOptions};
use std::time::Instant;
fn main() -> aether::Result<()> {
    let device = Device::with_preference(DevicePreference::Gpu, &GpuOptions::from_env()?)?;
    let steps: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(300);
    let f16 = std::env::args().nth(2).is_none();
    let (x, y) = synthetic_images(2, 32, 32, 1);
    let mut model = aether::zoo::cifar10_v1(1).f16_activations(f16);
    model.to(&device)?;
    model.finalize(&[32, 32, 3])?;
    let ctx = device.gpu_context().unwrap();
    for _ in 0..20 {
        model.train_batch(&x, &y)?;
        ctx.flush();
        ctx.wait_idle()?;
    }
    let mut rec = 0.0;
    for _ in 0..steps {
        ctx.wait_idle()?;
        let t = Instant::now();
        model.train_batch(&x, &y)?;
        ctx.flush();
        rec += t.elapsed().as_secs_f64();
    }
    println!("record+flush {:.3} ms/step", rec * 1e3 / steps as f64);
    Ok(())
}
