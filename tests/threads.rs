//! Two models training at once on one device, each on its own thread, end
//! bit-identical to the same models trained one after the other: they share
//! the device's command batch, pipeline cache and buffer pool, but every
//! kernel's arithmetic depends only on its own model's data (reductions run
//! in a fixed order), so sharing changes nothing.

mod common;

use aether::conv::Padding;
use aether::data::synthetic_images;
use aether::nn::{BatchNorm, Conv2d, Dense, GlobalAvgPool, ReLU, SpatialDropout};
use aether::optim::Adam;
use aether::{Device, Loss, Metric, Model, TrainOptions};

const SIDE: usize = 8;
const SAMPLES: usize = 64;

fn model(device: &Device, seed: u64) -> Model {
    let mut model = Model::new().seed(seed);
    model
        .add(Conv2d::new(8, (3, 3), Padding::Same))
        .add(BatchNorm::new(0.9, 1e-5))
        .add(ReLU::default())
        .add(SpatialDropout::new(0.1))
        .add(GlobalAvgPool::default())
        .add(Dense::new(10));
    model.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.05,
        },
        Adam::adamw(3e-3, 0.01),
        Metric::CategoricalAccuracy,
    );
    model.to(device).unwrap();
    model.finalize(&[SIDE, SIDE, 3]).unwrap();
    model
}

/// Trains the model of `seed` on its own data set; returns its per-epoch
/// losses and its predictions on that set, as bits.
fn train(device: &Device, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let (x, y) = synthetic_images(SAMPLES, SIDE, SIDE, seed).expect("synthetic images");
    let mut model = model(device, seed);
    let history = model
        .train(
            &x,
            &y,
            &TrainOptions {
                epochs: 2,
                batch_size: 16,
                log_every: 1,
                progress: false,
                ..TrainOptions::default()
            },
        )
        .unwrap();
    let losses = history.epochs.iter().map(|e| e.loss.to_bits()).collect();
    let predictions = model.predict(&x, 32, true).unwrap();
    (losses, predictions.iter().map(|v| v.to_bits()).collect())
}

test_device!(
    two_models_training_at_once_match_each_alone,
    |device: &Device| {
        let alone = [train(device, 11), train(device, 12)];
        let together = std::thread::scope(|scope| {
            let a = scope.spawn(|| train(device, 11));
            let b = scope.spawn(|| train(device, 12));
            [a.join().unwrap(), b.join().unwrap()]
        });
        for (i, (alone, together)) in alone.iter().zip(&together).enumerate() {
            assert_eq!(alone.0, together.0, "model {i}: losses differ");
            assert_eq!(alone.1, together.1, "model {i}: predictions differ");
        }
    }
);
