//! The model seed keys the dropout masks (issue 35's parity work found it
//! cancelled out: every seed drew the masks of seed 0), in the plain
//! SpatialDropout layer and in the one a MaxPool2d takes over.

use aether::conv::Padding;
use aether::nn::{Dense, Flatten, MaxPool2d, SpatialDropout};
use aether::optim::Adam;
use aether::{Loss, Metric, Model};

const SIDE: usize = 4;
const CHANNELS: usize = 16;
const BATCH: usize = 8;

/// Random images and labels from a SplitMix64 stream.
fn batch(seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let x = (0..BATCH * SIDE * SIDE * CHANNELS)
        .map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
        .collect();
    let y = (0..BATCH).map(|_| (next() % 3) as u32).collect();
    (x, y)
}

/// Dropout at 0.5 (after a 2x2 max-pool where `pooled`), flattened into a
/// dense head of 3, built with `seed`.
fn model(seed: u64, pooled: bool, fuse: bool) -> Model {
    let mut m = Model::new().seed(seed).fuse_dropout(fuse);
    if pooled {
        m.add(MaxPool2d::new((2, 2), (2, 2), Padding::Valid));
    }
    m.add(SpatialDropout::new(0.5));
    m.add(Flatten::default());
    m.add(Dense::new(3));
    m.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.0,
        },
        Adam::new(1e-3),
        Metric::CategoricalAccuracy,
    );
    m.finalize(&[SIDE, SIDE, CHANNELS]).unwrap();
    m
}

/// The loss of one training forward of a model seeded `seed` whose weights
/// are those of seed 1's: only the dropout masks can tell the seeds apart.
fn loss(seed: u64, pooled: bool, fuse: bool, weights: &std::path::Path) -> f32 {
    let (x, y) = batch(7);
    let mut m = model(seed, pooled, fuse);
    m.load_weights(weights).unwrap();
    m.gradients(&x, &y).unwrap().loss
}

#[test]
fn another_model_seed_draws_other_dropout_masks_fused_or_not() {
    let dir = std::env::temp_dir().join(format!("aether-dropout-seed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (pooled, fuse) in [(false, false), (true, false), (true, true)] {
        let weights = dir.join(format!("w-{pooled}-{fuse}.safetensors"));
        model(1, pooled, fuse).save(&weights).unwrap();
        let one = loss(1, pooled, fuse, &weights);
        assert_eq!(
            one,
            loss(1, pooled, fuse, &weights),
            "a seed replays its masks"
        );
        let others: Vec<f32> = (2..5).map(|s| loss(s, pooled, fuse, &weights)).collect();
        assert!(
            others.iter().all(|&l| l != one),
            "pooled {pooled}, fused {fuse}: seed 1 loss {one}, seeds 2..5 {others:?}"
        );
    }
    // The fused pool + dropout draws the masks the separate layer draws.
    let weights = dir.join("w-true-true.safetensors");
    assert_eq!(
        loss(3, true, true, &weights),
        loss(3, true, false, &weights)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
