//! Random crop + flip augmentation: every output image is a padded crop or a
//! mirrored padded crop of its input, the draws depend on (seed, step), and the
//! CPU and GPU give identical batches.

mod common;

use aether::ops::augment::random_crop_flip;
use aether::{Device, Tensor};
use common::Rng;

const DIMS: [usize; 4] = [9, 6, 5, 2];
const PAD: usize = 2;

/// The crop of `src` (one image) at offset `(dy, dx)` of the padded image, optionally mirrored.
fn crop(src: &[f32], dy: isize, dx: isize, flip: bool) -> Vec<f32> {
    let [_, h, w, c] = DIMS;
    let mut out = Vec::with_capacity(h * w * c);
    for y in 0..h as isize {
        for x in 0..w as isize {
            let cx = if flip { w as isize - 1 - x } else { x };
            let (sy, sx) = (y + dy - PAD as isize, cx + dx - PAD as isize);
            for ch in 0..c {
                out.push(
                    if sy < 0 || sx < 0 || sy >= h as isize || sx >= w as isize {
                        0.0
                    } else {
                        src[((sy as usize) * w + sx as usize) * c + ch]
                    },
                );
            }
        }
    }
    out
}

test_device!(each_image_is_a_padded_crop_or_flip, |device: &Device| {
    let mut rng = Rng::fresh();
    let per: usize = DIMS[1..].iter().product();
    // Values in [1, 2): a zero in the output can only come from padding.
    let data: Vec<f32> = (0..DIMS.iter().product::<usize>())
        .map(|_| 1.5 + rng.uniform() * 0.5)
        .collect();
    let x = Tensor::from_f32(DIMS.to_vec(), data.clone(), device).unwrap();
    let out = random_crop_flip(&x, PAD, rng.seed, 3)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let mut shifted = 0;
    for n in 0..DIMS[0] {
        let (src, got) = (&data[n * per..(n + 1) * per], &out[n * per..(n + 1) * per]);
        let found = (0..=2 * PAD as isize)
            .flat_map(|dy| {
                (0..=2 * PAD as isize).flat_map(move |dx| [(dy, dx, false), (dy, dx, true)])
            })
            .find(|&(dy, dx, flip)| crop(src, dy, dx, flip) == got);
        let (dy, dx, _flip) = found
            .unwrap_or_else(|| panic!("image {n} is no crop of its input (seed {})", rng.seed));
        shifted += usize::from(dy != PAD as isize || dx != PAD as isize);
    }
    assert!(shifted > 0, "some image should be shifted");
    let again = random_crop_flip(&x, PAD, rng.seed, 3)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_eq!(again, out, "the same seed and step give the same batch");
    let other = random_crop_flip(&x, PAD, rng.seed, 4)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_ne!(other, out, "another step gives other crops");
});

#[test]
fn cpu_and_gpu_give_identical_batches() {
    let Some(gpu) = common::gpu() else { return };
    let mut rng = Rng::fresh();
    let data = rng.vec(4 * 32 * 32 * 3);
    let dims = vec![4, 32, 32, 3];
    let on = |device: &Device| {
        random_crop_flip(
            &Tensor::from_f32(dims.clone(), data.clone(), device).unwrap(),
            4,
            99,
            7,
        )
        .unwrap()
        .to_vec_f32()
        .unwrap()
    };
    let (cpu, gpu_out) = (on(&Device::Cpu), on(&gpu));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&cpu), bits(&gpu_out));
    // F16, as a model whose first conv rounds to f16 uploads its batches.
    if !gpu.gpu_context().is_some_and(|c| c.caps().shader_f16) {
        return;
    }
    let halves: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
    let on_f16 = |device: &Device| {
        let x = Tensor::from_f16(dims.clone(), halves.clone(), device).unwrap();
        let out = random_crop_flip(&x, 4, 99, 7)
            .unwrap()
            .to_vec_f16()
            .unwrap();
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    let cpu_f16 = on_f16(&Device::Cpu);
    assert_eq!(cpu_f16, on_f16(&gpu));
    let rounded: Vec<u16> = cpu
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    assert_eq!(cpu_f16, rounded, "the f16 batch is the f32 one rounded");
}

test_device!(bad_inputs_are_typed_errors, |device: &Device| {
    let flat = Tensor::from_f32(vec![12], vec![0.5; 12], device).unwrap();
    assert!(random_crop_flip(&flat, 1, 0, 0).is_err());
    let labels = Tensor::from_u32(vec![1, 2, 2, 1], vec![1, 2, 3, 4], device).unwrap();
    assert!(random_crop_flip(&labels, 1, 0, 0).is_err());
});

// airbench's augmentations: reflect translate and the alternating flip.

use aether::AetherError;
use aether::ops::augment::{
    alternating_flip, alternating_flips, reflect_translate, reflect_translate_alternating_flip,
    translate_shift,
};

/// Odd, unequal sizes, so a swapped height and width or a transposed image fails.
const ODD: [usize; 4] = [5, 7, 9, 3];

/// Image `src` ([h, w, c]) reflect-padded by `m` on every side, built as
/// PyTorch's `F.pad(.., mode='reflect')` defines it: each row is the mirror
/// of its `m` pixels after the first, the row, and the mirror of its `m`
/// pixels before the last; then the same over rows.
fn reflect_pad(src: &[f32], h: usize, w: usize, c: usize, m: usize) -> Vec<Vec<Vec<f32>>> {
    let pixel = |y: usize, x: usize| src[(y * w + x) * c..(y * w + x + 1) * c].to_vec();
    let pad_row = |row: Vec<Vec<f32>>| {
        let mut out: Vec<Vec<f32>> = row[1..=m].iter().rev().cloned().collect();
        out.extend(row.iter().cloned());
        out.extend(row[w - 1 - m..w - 1].iter().rev().cloned());
        out
    };
    let rows: Vec<Vec<Vec<f32>>> = (0..h)
        .map(|y| pad_row((0..w).map(|x| pixel(y, x)).collect()))
        .collect();
    let mut out: Vec<Vec<Vec<f32>>> = rows[1..=m].iter().rev().cloned().collect();
    out.extend(rows.iter().cloned());
    out.extend(rows[h - 1 - m..h - 1].iter().rev().cloned());
    out
}

/// The expected batch: each image's `(dy, dx)` window of its reflect-padded
/// self (a translate by the shift), mirrored where `flips` says.
fn expected(
    data: &[f32],
    dims: [usize; 4],
    m: usize,
    shifts: &[(i32, i32)],
    flips: &[bool],
) -> Vec<f32> {
    let [n, h, w, c] = dims;
    let per = h * w * c;
    let mut out = Vec::with_capacity(data.len());
    for image in 0..n {
        let padded = reflect_pad(&data[image * per..(image + 1) * per], h, w, c, m);
        let (dy, dx) = shifts[image];
        for y in 0..h {
            for x in 0..w {
                let cx = if flips[image] { w - 1 - x } else { x };
                let py = (y as i32 + dy + m as i32) as usize;
                let px = (cx as i32 + dx + m as i32) as usize;
                out.extend_from_slice(&padded[py][px]);
            }
        }
    }
    out
}

fn distinct_values(rng: &mut Rng, len: usize) -> Vec<f32> {
    // Distinct by construction (a shuffled ramp): a wrong index cannot
    // read an equal value by chance.
    let mut v: Vec<f32> = (0..len).map(|i| i as f32 * 0.25 - 40.0).collect();
    for i in (1..len).rev() {
        v.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    v
}

test_device!(
    reflect_translate_is_a_window_of_the_reflect_padded_image,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let data = distinct_values(&mut rng, ODD.iter().product());
        let x = Tensor::from_f32(ODD.to_vec(), data.clone(), device).unwrap();
        // 2 is airbench's; 6 is the largest a 7-pixel height allows.
        for (m, step) in [(2usize, 3u32), (6, 11), (0, 5)] {
            let seed = rng.next_u64();
            let out = reflect_translate(&x, m, seed, step)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            let shifts: Vec<(i32, i32)> = (0..ODD[0] as u32)
                .map(|n| translate_shift(n, m as u32, seed, step))
                .collect();
            assert!(
                shifts
                    .iter()
                    .all(|&(dy, dx)| dy.abs() <= m as i32 && dx.abs() <= m as i32)
            );
            let want = expected(&data, ODD, m, &shifts, &[false; ODD[0]]);
            assert_eq!(
                out, want,
                "max shift {m}, seed {seed}, shifts {shifts:?} (test seed {})",
                rng.seed
            );
        }
    }
);

#[test]
fn translate_shifts_cover_every_offset_and_change_with_the_step() {
    let mut rng = Rng::fresh();
    let seed = rng.next_u64();
    let mut seen = std::collections::HashMap::new();
    for n in 0..2000 {
        *seen.entry(translate_shift(n, 2, seed, 7)).or_insert(0usize) += 1;
    }
    // 25 offsets, 80 draws each expected: each within 40..130.
    assert_eq!(seen.len(), 25, "{seen:?} (seed {seed})");
    assert!(
        seen.values().all(|&k| (40..130).contains(&k)),
        "{seen:?} (seed {seed})"
    );
    let moved = (0..64)
        .filter(|&n| translate_shift(n, 2, seed, 7) != translate_shift(n, 2, seed, 8))
        .count();
    assert!(
        moved > 40,
        "another step draws other shifts ({moved} of 64 differ)"
    );
}

#[test]
fn the_alternating_flip_mirrors_a_fixed_half_then_the_other_half() {
    let mut rng = Rng::fresh();
    let seed = rng.next_u64();
    let rows: Vec<usize> = (0..4000).collect();
    let even = alternating_flips(&rows, seed, 0);
    let flipped = even.iter().filter(|&&f| f).count();
    assert!(
        (1800..2200).contains(&flipped),
        "about half: {flipped} of 4000 (seed {seed})"
    );
    assert_eq!(
        alternating_flips(&rows, seed, 2),
        even,
        "the same half in every even epoch"
    );
    let odd = alternating_flips(&rows, seed, 1);
    assert!(
        even.iter().zip(&odd).all(|(a, b)| a != b),
        "odd epochs flip the other half"
    );
    assert_eq!(alternating_flips(&rows, seed, 5), odd);
    // Keyed by the dataset row, not the place in the batch.
    let shuffled = [3999, 17, 2, 2048];
    let flags = alternating_flips(&shuffled, seed, 0);
    for (k, &row) in shuffled.iter().enumerate() {
        assert_eq!(flags[k], even[row]);
    }
    assert_ne!(
        alternating_flips(&rows, seed ^ 1, 0),
        even,
        "another seed, another half"
    );
}

test_device!(
    alternating_flip_mirrors_exactly_the_flagged_images,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let dims = [6, 5, 7, 2];
        let data = distinct_values(&mut rng, dims.iter().product());
        let x = Tensor::from_f32(dims.to_vec(), data.clone(), device).unwrap();
        let rows = [40, 3, 17, 8, 1000, 23];
        let seed = rng.next_u64();
        for epoch in [0, 1, 4] {
            let flips = alternating_flips(&rows, seed, epoch);
            let out = alternating_flip(&x, &rows, seed, epoch)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert_eq!(
                out,
                expected(&data, dims, 0, &[(0, 0); 6], &flips),
                "epoch {epoch}"
            );
        }
    }
);

test_device!(
    the_fused_op_is_the_translate_then_the_flip,
    |device: &Device| {
        let mut rng = Rng::fresh();
        let data = distinct_values(&mut rng, ODD.iter().product());
        let x = Tensor::from_f32(ODD.to_vec(), data.clone(), device).unwrap();
        let rows = [9, 4, 123, 0, 77];
        let (seed, step, epoch) = (rng.next_u64(), 12, 3);
        let fused = reflect_translate_alternating_flip(&x, 2, &rows, seed, step, epoch)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let translated = reflect_translate(&x, 2, seed, step).unwrap();
        let two = alternating_flip(&translated, &rows, seed, epoch)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        assert_eq!(fused, two);
        let shifts: Vec<_> = (0..5).map(|n| translate_shift(n, 2, seed, step)).collect();
        let flips = alternating_flips(&rows, seed, epoch);
        assert_eq!(fused, expected(&data, ODD, 2, &shifts, &flips));
    }
);

#[test]
fn reflect_translate_and_flip_are_identical_on_cpu_and_gpu_in_f32_and_f16() {
    let Some(gpu) = common::gpu() else { return };
    let mut rng = Rng::fresh();
    let dims = vec![7, 9, 11, 3];
    let data = rng.vec(dims.iter().product());
    let rows: Vec<usize> = (0..7).map(|_| rng.next_u64() as usize % 50_000).collect();
    let seed = rng.next_u64();
    let f32_on = |device: &Device| {
        let x = Tensor::from_f32(dims.clone(), data.clone(), device).unwrap();
        common::f32_bits(&reflect_translate_alternating_flip(&x, 2, &rows, seed, 9, 1).unwrap())
    };
    assert_eq!(f32_on(&Device::Cpu), f32_on(&gpu));
    let supports_f16 = gpu.gpu_context().is_some_and(|c| c.caps().shader_f16);
    if !supports_f16 {
        common::skip("the adapter has no shader-f16: the f16 kernel is not tried");
        return;
    }
    let halves: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
    let f16_on = |device: &Device| {
        let x = Tensor::from_f16(dims.clone(), halves.clone(), device).unwrap();
        let out = reflect_translate_alternating_flip(&x, 2, &rows, seed, 9, 1).unwrap();
        out.to_vec_f16()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    let cpu = f16_on(&Device::Cpu);
    assert_eq!(cpu, f16_on(&gpu));
    // The f16 batch is the f32 one's permutation, rounded.
    let from_f32: Vec<u16> = f32_on(&Device::Cpu)
        .iter()
        .map(|&b| half::f16::from_f32(f32::from_bits(b)).to_bits())
        .collect();
    assert_eq!(cpu, from_f32);
}

test_device!(
    translate_and_flip_refuse_bad_input_naming_it,
    |device: &Device| {
        let x = Tensor::from_f32(ODD.to_vec(), vec![0.5; ODD.iter().product()], device).unwrap();
        let message = |e: AetherError| e.to_string();
        // Height 7: a shift of 7 would mirror past the far edge.
        let e = message(reflect_translate(&x, 7, 0, 0).unwrap_err());
        assert!(e.contains("up to 7 pixels") && e.contains("7x9"), "{e}");
        let wide = Tensor::from_f32(vec![1, 9, 3, 1], vec![0.5; 27], device).unwrap();
        let e = message(reflect_translate(&wide, 3, 0, 0).unwrap_err());
        assert!(e.contains("up to 3 pixels") && e.contains("9x3"), "{e}");
        let e = message(alternating_flip(&x, &[1, 2, 3], 0, 0).unwrap_err());
        assert!(
            e.contains("3 dataset rows") && e.contains("batch of 5"),
            "{e}"
        );
        let e = message(reflect_translate_alternating_flip(&x, 2, &[0; 6], 0, 0, 0).unwrap_err());
        assert!(e.contains("6 dataset rows"), "{e}");
        let flat = Tensor::from_f32(vec![12], vec![0.5; 12], device).unwrap();
        assert!(matches!(
            reflect_translate(&flat, 1, 0, 0),
            Err(AetherError::InvalidShape { .. })
        ));
        let labels = Tensor::from_u32(vec![1, 2, 2, 1], vec![1, 2, 3, 4], device).unwrap();
        let e = message(reflect_translate(&labels, 1, 0, 0).unwrap_err());
        assert!(e.contains("F32 or F16"), "{e}");
    }
);
