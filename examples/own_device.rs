//! `cargo run --release --example own_device`: an app that owns its wgpu
//! device (a renderer, an egui or Bevy app) hands it to aether, trains a small
//! CNN on it, predicts one image, and reads a tensor's buffer with its own
//! commands, as it would bind it to draw. One device, one queue, shared.

use std::process::ExitCode;

use aether::conv::Padding;
use aether::data::synthetic_images;
use aether::gpu::with_required_limits;
use aether::model::{Loss, Metric};
use aether::nn::{BatchNorm, Conv2d, Dense, GlobalAvgPool, MaxPool2d, ReLU};
use aether::optim::Adam;
use aether::{Device, Model, Tensor, TrainOptions};

const SIDE: usize = 16;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // The app's side: its instance, adapter and device, as it makes them to
    // render. It asks for f16 where the adapter has it (aether's faster
    // kernels) and for aether's limits on top of WebGPU's defaults.
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .map_err(|e| format!("no GPU adapter ({e}); install a Vulkan driver or lavapipe"))?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("app"),
        required_features: adapter.features() & wgpu::Features::SHADER_F16,
        required_limits: with_required_limits(wgpu::Limits::default()),
        ..Default::default()
    }))?;

    // aether on that device: it reads the device's features and limits.
    let gpu = Device::from_wgpu(&adapter, &device, &queue)?;
    println!(
        "aether on the app's device: {}",
        gpu.gpu_context().expect("a GPU device").caps().describe()
    );

    let (x, y) = synthetic_images(512, SIDE, SIDE, 7)?;
    let mut model = Model::new().seed(1);
    model
        .add(Conv2d::new(16, (3, 3), Padding::Same))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(ReLU::default())
        .add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid))
        .add(Conv2d::new(32, (3, 3), Padding::Same))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(ReLU::default())
        .add(GlobalAvgPool::default())
        .add(Dense::new(10));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(3e-3),
        Metric::CategoricalAccuracy,
    );
    model.to(&gpu)?;
    model.finalize(&[SIDE, SIDE, 3])?;
    let history = model.train(
        &x,
        &y,
        &TrainOptions {
            epochs: 3,
            batch_size: 64,
            progress: false,
            ..Default::default()
        },
    )?;
    for (epoch, stats) in history.epochs.iter().enumerate() {
        println!("epoch {}: loss {:.4}", epoch + 1, stats.loss);
    }

    // Inference as a frame loop would do it: one image, the output reused.
    let image = &x[..SIDE * SIDE * 3];
    let mut probabilities = Vec::new();
    model.predict_into(image, 1, false, &mut probabilities)?;
    let (class, p) =
        probabilities.iter().enumerate().fold(
            (0, 0.0f32),
            |best, (i, &p)| if p > best.1 { (i, p) } else { best },
        );
    println!(
        "image 0 (label {}): class {class} with probability {p:.3}",
        y[0]
    );

    // The app reads a tensor's buffer with its own commands, as a renderer
    // binds it: row-major NHWC f32 from `offset`.
    let tensor = Tensor::from_f32(vec![1, SIDE, SIDE, 3], image.to_vec(), &gpu)?;
    let view = tensor.gpu_buffer().expect("a GPU tensor");
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("app staging"),
        size: view.bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(view.buffer, view.offset, &staging, 0, view.bytes);
    queue.submit([encoder.finish()]);
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device.poll(wgpu::PollType::wait_indefinitely())?;
    let first: Vec<f32> =
        bytemuck::pod_collect_to_vec(&staging.slice(..).get_mapped_range()?[..12]);
    println!(
        "the app read the image's first pixels from aether's buffer: {first:?} (host: {:?})",
        &image[..3]
    );
    Ok(())
}
