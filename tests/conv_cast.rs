//! The fp16 casts, bit for bit against `half::f16::from_f32` of the same clip,
//! on special values and on a sweep across the f32 bit patterns.

mod common;

use aether::conv::{cast_f16, clip_f16_range, conv_backward_cast_fp16};
use aether::{Device, Tensor};
use common::Rng;
use half::f16;

fn specials() -> Vec<f32> {
    let mut v = vec![
        f32::INFINITY,
        f32::NEG_INFINITY,
        70000.0,
        -70000.0,
        65504.0,
        -65504.0,
        65519.0,
        65520.0,
        -65520.0,
        65536.0,
        0.1,
        -0.1,
        0.0,
        -0.0,
        1.0,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        6.0e-8,    // near the smallest f16 subnormal
        2.98e-8,   // rounds to zero or the smallest subnormal
        -3.0e-5,   // f16 subnormal range
        6.1e-5,    // around the smallest f16 normal
        1.0e-40,   // f32 subnormal
        -1.0e-45,  // smallest f32 subnormal
        1.0009766, // exactly halfway between two f16: ties to even
        1.0029297,
    ];
    // NaNs: both signs, quiet and signalling, payloads in high and low mantissa bits.
    for bits in [
        0x7fc0_0000u32,
        0xffc0_0000,
        0x7f80_0001,
        0xff80_0001,
        0x7fa0_1234,
        0xffbf_ffff,
        0x7f80_2000,
        0x7fff_ffff,
    ] {
        v.push(f32::from_bits(bits));
    }
    v
}

fn bits_f16(t: &Tensor) -> Vec<u16> {
    t.to_vec_f16()
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect()
}

fn expected(values: &[f32], clip: bool) -> Vec<u16> {
    values
        .iter()
        .map(|&v| f16::from_f32(if clip { clip_f16_range(v) } else { v }).to_bits())
        .collect()
}

fn assert_bits(what: &str, got: &[u16], values: &[f32], clip: bool, seed: u64) {
    let want = expected(values, clip);
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<String> = (0..got.len())
        .filter(|&i| got[i] != want[i])
        .take(8)
        .map(|i| {
            format!(
                "#{i} x={:#010x} got {:#06x} want {:#06x}",
                values[i].to_bits(),
                got[i],
                want[i]
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{what} (seed {seed}): {} mismatches, first: {bad:?}",
        bad.len()
    );
}

test_device!(special_values_cast_bit_exactly, |device: &Device| {
    let values = specials();
    // Odd lengths on both sides, so the dvalues/inputs boundary falls inside a word.
    let dvalues = values.clone();
    let mut inputs = values.clone();
    inputs.reverse();
    inputs.push(12.5);
    let dv = Tensor::from_f32(vec![dvalues.len()], dvalues.clone(), device).unwrap();
    let xs = Tensor::from_f32(vec![inputs.len()], inputs.clone(), device).unwrap();
    let (dv16, xs16) = conv_backward_cast_fp16(&dv, &xs).unwrap();
    assert_bits("dvalues", &bits_f16(&dv16), &dvalues, true, 0);
    assert_bits("inputs", &bits_f16(&xs16), &inputs, true, 0);
    // The clip is real in both operands (issue 37: an input overflowing to inf
    // came out of the conv as NaN): 70000 -> 65504.
    let i = dvalues.iter().position(|&v| v == 70000.0).unwrap();
    assert_eq!(dv16.to_vec_f16().unwrap()[i], f16::MAX);
    let j = inputs.iter().position(|&v| v == 70000.0).unwrap();
    assert_eq!(xs16.to_vec_f16().unwrap()[j], f16::MAX);
    // NaN stays NaN in the clipped operands.
    assert!(dv16.to_vec_f16().unwrap()[dvalues.len() - 1].is_nan());
    let nan = inputs.iter().position(|v| v.is_nan()).unwrap();
    assert!(xs16.to_vec_f16().unwrap()[nan].is_nan());
});

test_device!(bit_pattern_sweep_matches_half, |device: &Device| {
    let mut rng = Rng::fresh();
    // A stride through all 2^32 patterns with a random offset, plus random patterns.
    let offset = rng.next_u64() as u32;
    let mut values: Vec<f32> = (0..(1u64 << 32) / 8191)
        .map(|i| f32::from_bits((i as u32).wrapping_mul(8191).wrapping_add(offset)))
        .collect();
    values.extend((0..50_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    // Lengths that end mid-workgroup (256 words = 512 values a workgroup) and mid-word.
    let split = 512 * 301 + 77;
    let (dvalues, inputs) = values.split_at(split);
    let dv = Tensor::from_f32(vec![dvalues.len()], dvalues.to_vec(), device).unwrap();
    let xs = Tensor::from_f32(vec![inputs.len()], inputs.to_vec(), device).unwrap();
    let (dv16, xs16) = conv_backward_cast_fp16(&dv, &xs).unwrap();
    assert_bits("dvalues", &bits_f16(&dv16), dvalues, true, rng.seed);
    assert_bits("inputs", &bits_f16(&xs16), inputs, true, rng.seed);
    // The single-tensor cast, both modes, on an odd length.
    let odd = Tensor::from_f32(
        vec![inputs.len() - 2],
        inputs[..inputs.len() - 2].to_vec(),
        device,
    )
    .unwrap();
    assert_bits(
        "cast",
        &bits_f16(&cast_f16(&odd, false).unwrap()),
        &inputs[..inputs.len() - 2],
        false,
        rng.seed,
    );
    assert_bits(
        "cast clip",
        &bits_f16(&cast_f16(&odd, true).unwrap()),
        &inputs[..inputs.len() - 2],
        true,
        rng.seed,
    );
});

test_device!(non_f32_operands_are_rejected, |device: &Device| {
    let h = Tensor::from_f16(vec![2], vec![f16::ONE, f16::ONE], device).unwrap();
    let f = Tensor::from_f32(vec![2], vec![1.0, 2.0], device).unwrap();
    assert!(conv_backward_cast_fp16(&h, &f).is_err());
    assert!(cast_f16(&h, false).is_err());
});
