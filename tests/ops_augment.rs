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
    let (cpu, gpu) = (on(&Device::Cpu), on(&gpu));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&cpu), bits(&gpu));
}

test_device!(bad_inputs_are_typed_errors, |device: &Device| {
    let flat = Tensor::from_f32(vec![12], vec![0.5; 12], device).unwrap();
    assert!(random_crop_flip(&flat, 1, 0, 0).is_err());
    let labels = Tensor::from_u32(vec![1, 2, 2, 1], vec![1, 2, 3, 4], device).unwrap();
    assert!(random_crop_flip(&labels, 1, 0, 0).is_err());
});
