//! Image augmentation on the host, batch by batch, before upload: a random crop
//! of the zero-padded image and a random horizontal flip (the usual CIFAR
//! recipe). It runs on the CPU because `Model` takes host batches; for the
//! reference model it costs a small fraction of a training step.

/// Replaces each NHWC image of `images` (`height x width x channels` values
/// each) in place by a `height x width` crop at a uniformly random offset of the
/// image padded with `pad` zero pixels on every side, mirrored left-right with
/// probability 1/2. The same `seed` gives the same crops and flips.
pub fn random_crop_flip(
    images: &mut [f32],
    height: usize,
    width: usize,
    channels: usize,
    pad: usize,
    seed: u64,
) {
    let per_image = height * width * channels;
    if per_image == 0 {
        return;
    }
    let mut state = seed;
    let mut source = vec![0.0f32; per_image];
    let offsets = 2 * pad as u64 + 1;
    for image in images.chunks_exact_mut(per_image) {
        let r = splitmix64(&mut state);
        // Offsets of the crop in the padded image, relative to the original.
        let dy = (r % offsets) as isize - pad as isize;
        let dx = ((r >> 21) % offsets) as isize - pad as isize;
        let flip = (r >> 63) == 1;
        source.copy_from_slice(image);
        for y in 0..height {
            let sy = y as isize + dy;
            for x in 0..width {
                let cx = if flip { width - 1 - x } else { x };
                let sx = cx as isize + dx;
                let out = &mut image[(y * width + x) * channels..][..channels];
                if (0..height as isize).contains(&sy) && (0..width as isize).contains(&sx) {
                    let at = (sy as usize * width + sx as usize) * channels;
                    out.copy_from_slice(&source[at..at + channels]);
                } else {
                    out.fill(0.0);
                }
            }
        }
    }
}

/// SplitMix64: a fast, well-mixed stream from any seed.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
