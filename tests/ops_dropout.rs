//! Dropout: masks follow the documented Philox contract bit for bit on every
//! device, keep the right fraction, and the backward pass multiplies by them.

mod common;

use aether::ops::dropout::{
    dropout, dropout_backward, philox4x32_10, spatial_dropout, spatial_dropout_as,
};
use aether::{AetherError, DType, Device, Tensor};
use common::Rng;
use half::f16;

/// Philox4x32-10 written from Salmon et al., "Parallel random numbers: as easy
/// as 1, 2, 3" (SC'11): ten rounds of two 32x32->64 multiplies, a Weyl key bump
/// between rounds.
fn reference_philox(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter.map(u64::from);
    let mut k = key.map(u64::from);
    let mask32 = 0xffff_ffffu64;
    for round in 0..10 {
        if round != 0 {
            k[0] = (k[0] + 0x9E37_79B9) & mask32;
            k[1] = (k[1] + 0xBB67_AE85) & mask32;
        }
        let product0 = 0xD251_1F53 * c[0];
        let product1 = 0xCD9E_8D57 * c[2];
        c = [
            (product1 >> 32) ^ c[1] ^ k[0],
            product1 & mask32,
            (product0 >> 32) ^ c[3] ^ k[1],
            product0 & mask32,
        ];
    }
    c.map(|v| v as u32)
}

/// The mask value the contract prescribes for one draw.
fn reference_mask_value(rate: f32, seed: u64, step: u32, stream: u32, draw: u32) -> f32 {
    let threshold = (rate as f64 * 2f64.powi(32)).round() as u64;
    let key = [(seed & 0xffff_ffff) as u32, (seed >> 32) as u32];
    let bits = reference_philox([draw, step, stream, 0], key)[0];
    if u64::from(bits) < threshold {
        0.0
    } else {
        1.0 / (1.0 - rate)
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Asserts `count` successes of `trials` Bernoulli(`p`) trials lie within 4 sigma.
fn assert_within_4_sigma(what: &str, count: usize, trials: usize, p: f64, seed: u64) {
    let n = trials as f64;
    let sigma = (n * p * (1.0 - p)).sqrt();
    let deviation = (count as f64 - n * p).abs();
    assert!(
        deviation <= 4.0 * sigma,
        "{what}: {count} of {trials}, expected {:.1} +- 4 * {sigma:.1} (seed {seed})",
        n * p
    );
}

#[test]
fn philox_matches_random123_known_answers() {
    // Known-answer vectors of Random123's kat_vectors for philox4x32 (10 rounds).
    let vectors = [
        (
            [0; 4],
            [0; 2],
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
        ),
        (
            [u32::MAX; 4],
            [u32::MAX; 2],
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
        ),
        (
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
        ),
    ];
    for (counter, key, want) in vectors {
        assert_eq!(reference_philox(counter, key), want, "test reference");
        assert_eq!(philox4x32_10(counter, key), want, "aether");
    }
}

test_device!(
    dropout_masks_follow_the_contract_on_every_device,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let seed = rng.next_u64();
        let step = rng.next_u64() as u32;
        let rate = 0.1 + 0.8 * (rng.uniform() + 1.0) / 2.0;
        // ~100k elements; odd, so the last workgroup is partly empty.
        let dims = vec![7, 11, 13, 101];
        let len: usize = dims.iter().product();
        let data = rng.vec(len);
        let x = Tensor::from_f32(dims.clone(), data.clone(), device).unwrap();
        let (y, mask) = dropout(&x, rate, seed, step).unwrap();
        let (y, mask) = (y.to_vec_f32().unwrap(), mask.to_vec_f32().unwrap());
        let context = format!(
            "rate {rate}, dropout seed {seed}, step {step}, rng seed {}",
            rng.seed
        );

        let want: Vec<f32> = (0..len as u32)
            .map(|i| reference_mask_value(rate, seed, step, 0, i))
            .collect();
        assert_eq!(bits(&mask), bits(&want), "mask vs contract ({context})");
        let scale = 1.0 / (1.0 - rate);
        assert!(mask.iter().all(|&m| m == 0.0 || m == scale), "{context}");
        let product: Vec<f32> = data.iter().zip(&mask).map(|(&v, &m)| v * m).collect();
        assert_eq!(bits(&y), bits(&product), "y == x * mask ({context})");

        let kept = mask.iter().filter(|&&m| m != 0.0).count();
        assert_within_4_sigma("kept elements", kept, len, 1.0 - f64::from(rate), rng.seed);

        // Reproducible on this device and bit-identical to the CPU path.
        let (_, again) = dropout(&x, rate, seed, step).unwrap();
        assert_eq!(bits(&again.to_vec_f32().unwrap()), bits(&mask), "{context}");
        let host_x = Tensor::from_f32(dims, data, &Device::Cpu).unwrap();
        let (_, host_mask) = dropout(&host_x, rate, seed, step).unwrap();
        assert_eq!(
            bits(&host_mask.to_vec_f32().unwrap()),
            bits(&mask),
            "CPU vs {} ({context})",
            device.name()
        );
    }
);

test_device!(
    masks_are_independent_across_steps_and_seeds,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let seed = rng.next_u64();
        let step = rng.next_u64() as u32;
        let rate = 0.5;
        let len = 30_011;
        let x = Tensor::from_f32(vec![len], rng.vec(len), device).unwrap();
        let kept = |seed: u64, step: u32| -> Vec<bool> {
            let (_, mask) = dropout(&x, rate, seed, step).unwrap();
            mask.to_vec_f32()
                .unwrap()
                .iter()
                .map(|&m| m != 0.0)
                .collect()
        };
        let base = kept(seed, step);
        // Independent masks agree with probability p^2 + (1 - p)^2 per element.
        let p = 1.0 - f64::from(rate);
        let agree_p = p * p + (1.0 - p) * (1.0 - p);
        for (what, other) in [
            ("next step", kept(seed, step.wrapping_add(1))),
            ("low seed bit", kept(seed ^ 1, step)),
            ("high seed bit", kept(seed ^ (1 << 40), step)),
        ] {
            let agree = base.iter().zip(&other).filter(|(a, b)| a == b).count();
            assert_within_4_sigma(what, agree, len, agree_p, rng.seed);
        }
    }
);

test_device!(
    spatial_dropout_drops_whole_feature_maps,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let seed = rng.next_u64();
        let step = rng.next_u64() as u32;
        let rate = 0.3 + 0.4 * (rng.uniform() + 1.0) / 2.0;
        let [n, h, w, c] = [3, 5, 7, 13];
        let len = n * h * w * c;
        let data = rng.vec(len);
        let x = Tensor::from_f32(vec![n, h, w, c], data.clone(), device).unwrap();
        let (y, mask) = spatial_dropout(&x, rate, seed, step).unwrap();
        let (y, mask) = (y.to_vec_f32().unwrap(), mask.to_vec_f32().unwrap());
        let context = format!(
            "rate {rate}, dropout seed {seed}, step {step}, rng seed {}",
            rng.seed
        );
        assert_eq!(mask.len(), len);
        let mut map_kept = Vec::new();
        for ni in 0..n {
            for ci in 0..c {
                let want = reference_mask_value(rate, seed, step, 1, (ni * c + ci) as u32);
                for hw in 0..h * w {
                    let got = mask[(ni * h * w + hw) * c + ci];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "n {ni} c {ci} hw {hw} ({context})"
                    );
                }
                map_kept.push(want != 0.0);
            }
        }
        assert!(
            map_kept.contains(&true) && map_kept.contains(&false),
            "maps must vary over (n, c) ({context})"
        );
        let product: Vec<f32> = data.iter().zip(&mask).map(|(&v, &m)| v * m).collect();
        assert_eq!(bits(&y), bits(&product), "y == x * mask ({context})");
        let host_x = Tensor::from_f32(vec![n, h, w, c], data, &Device::Cpu).unwrap();
        let (_, host_mask) = spatial_dropout(&host_x, rate, seed, step).unwrap();
        assert_eq!(
            bits(&host_mask.to_vec_f32().unwrap()),
            bits(&mask),
            "{context}"
        );
    }
);

test_device!(
    spatial_dropout_stores_f16_as_the_f32_product_rounded,
    |device: &Device| {
        // Values spread over f16's range and beyond it (inf), some below its
        // smallest normal. Shapes: maps of 7 pixels (the last lane of 4
        // pixels ends early); 900 lanes of 9-pixel maps (workgroups whose
        // lanes straddle maps, sharing a table of their maps' draws); 36 and
        // 2048 channels of one pixel (a workgroup's maps need more than the
        // table's 1024 draws, so each lane draws its own).
        let mut rng = Rng::fresh();
        let seed = rng.next_u64();
        let step = rng.next_u64() as u32;
        let context = format!("dropout seed {seed}, step {step}, rng seed {}", rng.seed);
        let scales = [1.0, 3e4, 1e-5, 1e5];
        for dims in [
            [3, 7, 1, 12],
            [100, 3, 3, 12],
            [64, 1, 1, 36],
            [2, 1, 1, 2048],
        ] {
            let len = dims.iter().product();
            let data: Vec<f32> = rng
                .vec(len)
                .iter()
                .enumerate()
                .map(|(i, v)| v * scales[i % 4])
                .collect();
            let x = Tensor::from_f32(dims.to_vec(), data, device).unwrap();
            for rate in [0.0, 0.45] {
                let (want_y, want_mask) = spatial_dropout(&x, rate, seed, step).unwrap();
                let (y, mask) = spatial_dropout_as(&x, rate, seed, step, DType::F16).unwrap();
                assert_eq!((y.dtype(), mask.dtype()), (DType::F16, DType::F32));
                let want: Vec<u16> = want_y
                    .to_vec_f32()
                    .unwrap()
                    .iter()
                    .map(|&v| f16::from_f32(aether::conv::clip_f16_range(v)).to_bits())
                    .collect();
                let got: Vec<u16> = y
                    .to_vec_f16()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(got, want, "y of {dims:?} at rate {rate} ({context})");
                assert_eq!(
                    bits(&mask.to_vec_f32().unwrap()),
                    bits(&want_mask.to_vec_f32().unwrap()),
                    "mask of {dims:?} at rate {rate} ({context})"
                );
                if rate > 0.0 {
                    // Dropped maps (+-0) and saturation at +-65504 (issue 37:
                    // never inf) were both checked.
                    let has = |magnitude: u16| got.iter().any(|b| b & 0x7fff == magnitude);
                    assert!(
                        has(0) && has(0x7bff) && !has(0x7c00),
                        "{dims:?} ({context})"
                    );
                }
            }
        }
        let x6 = Tensor::from_f32(vec![2, 3, 1, 6], rng.vec(36), device).unwrap();
        match spatial_dropout_as(&x6, 0.5, 1, 2, DType::F16) {
            Err(AetherError::InvalidShape { reason, .. }) => {
                assert!(reason.contains("divide by 4"), "{reason}")
            }
            other => panic!("6 channels as F16: expected InvalidShape, got {other:?}"),
        }
    }
);

test_device!(rate_zero_keeps_the_input, |device: &Device| {
    let mut rng = Rng::fresh();
    let data = rng.vec(3 * 257 + 5);
    let x = Tensor::from_f32(vec![data.len()], data.clone(), device).unwrap();
    let (y, mask) = dropout(&x, 0.0, rng.next_u64(), 7).unwrap();
    assert_eq!(
        bits(&y.to_vec_f32().unwrap()),
        bits(&data),
        "seed {}",
        rng.seed
    );
    assert!(mask.to_vec_f32().unwrap().iter().all(|&m| m == 1.0));
    let x4 = Tensor::from_f32(vec![1, 3, 257, 1], rng.vec(771), device).unwrap();
    let (_, mask) = spatial_dropout(&x4, 0.0, rng.next_u64(), 7).unwrap();
    assert!(mask.to_vec_f32().unwrap().iter().all(|&m| m == 1.0));
});

test_device!(
    dropout_backward_multiplies_by_the_mask,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let dims = vec![5, 3, 257];
        let len = 5 * 3 * 257;
        let x = Tensor::from_f32(dims.clone(), rng.vec(len), device).unwrap();
        let (_, mask) = dropout(&x, 0.4, rng.next_u64(), 3).unwrap();
        let dy_data = rng.vec(len);
        let dy = Tensor::from_f32(dims, dy_data.clone(), device).unwrap();
        let dx = dropout_backward(&dy, &mask).unwrap().to_vec_f32().unwrap();
        let mask = mask.to_vec_f32().unwrap();
        let want: Vec<f32> = dy_data.iter().zip(&mask).map(|(&d, &m)| d * m).collect();
        assert_eq!(bits(&dx), bits(&want), "seed {}", rng.seed);
        assert!(mask.contains(&0.0) && mask.iter().any(|&m| m != 0.0));
    }
);

test_device!(invalid_arguments_are_typed_errors, |device: &Device| {
    let mut rng = Rng::fresh();
    let x = Tensor::from_f32(vec![2, 3, 5, 7], rng.vec(210), device).unwrap();
    for rate in [1.0, 1.5, -0.1, f32::NAN] {
        for result in [dropout(&x, rate, 1, 2), spatial_dropout(&x, rate, 1, 2)] {
            match result {
                Err(AetherError::InvalidShape { reason, .. }) => {
                    assert!(reason.contains("rate"), "{reason}")
                }
                other => panic!("rate {rate}: expected InvalidShape, got {other:?}"),
            }
        }
    }
    let flat = Tensor::from_f32(vec![6, 35], rng.vec(210), device).unwrap();
    assert!(matches!(
        spatial_dropout(&flat, 0.5, 1, 2),
        Err(AetherError::InvalidShape {
            op: "spatial_dropout",
            ..
        })
    ));
    let labels = Tensor::from_u32(vec![210], vec![1; 210], device).unwrap();
    assert!(matches!(
        dropout(&labels, 0.5, 1, 2),
        Err(AetherError::InvalidShape { .. })
    ));
    let (_, mask) = dropout(&x, 0.5, 1, 2).unwrap();
    assert!(matches!(
        dropout_backward(&flat, &mask),
        Err(AetherError::ShapeMismatch {
            op: "dropout_backward",
            ..
        })
    ));
    assert!(matches!(
        dropout_backward(&labels, &mask),
        Err(AetherError::InvalidShape { .. })
    ));
    if device.gpu_context().is_some() {
        let host_dy = Tensor::from_f32(vec![2, 3, 5, 7], rng.vec(210), &Device::Cpu).unwrap();
        assert!(matches!(
            dropout_backward(&host_dy, &mask),
            Err(AetherError::DeviceMismatch { .. })
        ));
    }
});
