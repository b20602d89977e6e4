//! Elementwise ops on every device, checked against a reference written here.

mod common;

use aether::{Device, Tensor};
use common::Rng;

test_device!(relu_matches_reference_on_odd_length, |device: &Device| {
    let mut rng = Rng::fresh();
    // Odd length: the last workgroup is partly empty.
    let len = 3 * 257 * 5 + 7;
    let mut data = rng.vec(len);
    data[1] = f32::NAN;
    let x = Tensor::from_f32(vec![len], data.clone(), device).unwrap();
    let y = aether::ops::relu(&x).unwrap().to_vec_f32().unwrap();
    assert_eq!(y.len(), len);
    for (i, (&got, &input)) in y.iter().zip(&data).enumerate() {
        if input.is_nan() {
            assert!(
                got.is_nan(),
                "NaN must pass through at {i} (seed {})",
                rng.seed
            );
        } else {
            let want = if input < 0.0 { 0.0 } else { input };
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "at {i}: x={input} (seed {})",
                rng.seed
            );
        }
    }
    assert!(data.iter().any(|&v| v < 0.0) && data.iter().any(|&v| v > 0.0));
});

test_device!(wrong_length_is_a_typed_error, |device: &Device| {
    let err = Tensor::from_f32(vec![2, 3, 4, 5], vec![1.0; 119], device).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("[2, 3, 4, 5]") && text.contains("120") && text.contains("119"),
        "{text}"
    );
    assert!(Tensor::from_f32(vec![2, 0, 4], vec![], device).is_err());
});

test_device!(round_trip_through_the_other_device, |device: &Device| {
    let mut rng = Rng::fresh();
    let data = rng.vec(6 * 5 * 3 * 2);
    let x = Tensor::from_f32(vec![6, 5, 3, 2], data.clone(), device).unwrap();
    let host = x.to(&Device::Cpu).unwrap();
    assert_eq!(host.to_vec_f32().unwrap(), data);
    let back = host.to(device).unwrap();
    assert_eq!(back.to_vec_f32().unwrap(), data);
    let halves: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
    let h = Tensor::from_f16(vec![6, 5, 3, 2], halves.clone(), device).unwrap();
    assert_eq!(h.to_vec_f16().unwrap(), halves);
    assert!(x.to_vec_f16().is_err(), "an f32 tensor has no f16 view");
});
