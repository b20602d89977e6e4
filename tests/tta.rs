//! Test-time augmentation against views built here: the averaged logits are
//! the mean of the model's logits on mirrored and reflect-translated images.

mod common;

use aether::nn::{Conv2d, Dense, Flatten};
use aether::{Model, Padding, Tta};
use common::Rng;

const SHAPE: [usize; 3] = [5, 6, 2];

/// The image translated by `shift` (reading `(y + shift, x + shift)` of the
/// reflected image), then optionally mirrored, as airbench's views are.
fn view(x: &[f32], mirror: bool, shift: isize) -> Vec<f32> {
    let [h, w, c] = SHAPE;
    let reflect = |i: isize, n: usize| -> usize {
        let n = n as isize;
        (if i < 0 {
            -i
        } else if i >= n {
            2 * n - 2 - i
        } else {
            i
        }) as usize
    };
    let mut out = vec![0.0; x.len()];
    for (img, o) in x
        .chunks_exact(h * w * c)
        .zip(out.chunks_exact_mut(h * w * c))
    {
        for y in 0..h {
            for xx in 0..w {
                let sy = reflect(y as isize + shift, h);
                let from = if mirror { w - 1 - xx } else { xx };
                let sx = reflect(from as isize + shift, w);
                for ch in 0..c {
                    o[(y * w + xx) * c + ch] = img[(sy * w + sx) * c + ch];
                }
            }
        }
    }
    out
}

#[test]
fn tta_averages_the_logits_of_its_views() {
    let mut rng = Rng::fresh();
    let mut model = Model::new().seed(rng.seed);
    model
        .add(Conv2d::new(3, (3, 3), Padding::Same))
        .add(Flatten::default())
        .add(Dense::new(4));
    model.finalize(&SHAPE).unwrap();
    let n = 3;
    let x = rng.vec(n * SHAPE.iter().product::<usize>());
    let logits = |model: &mut Model, v: &[f32]| model.predict(v, 2, true).unwrap();
    let plain = logits(&mut model, &x);
    assert_eq!(model.predict_tta(&x, 2, Tta::None).unwrap(), plain);
    let flipped = logits(&mut model, &view(&x, true, 0));
    let mirror: Vec<f32> = plain
        .iter()
        .zip(&flipped)
        .map(|(a, b)| (a + b) / 2.0)
        .collect();
    let got = model.predict_tta(&x, 2, Tta::Mirror).unwrap();
    assert_eq!(got, mirror);
    let mut want = Vec::new();
    let views: Vec<Vec<f32>> = [(false, -1), (true, -1), (false, 1), (true, 1)]
        .iter()
        .map(|&(m, s)| logits(&mut model, &view(&x, m, s)))
        .collect();
    for i in 0..plain.len() {
        let up = (views[0][i] + views[1][i]) / 2.0;
        let down = (views[2][i] + views[3][i]) / 2.0;
        want.push((mirror[i] + (up + down) / 2.0) / 2.0);
    }
    let got = model.predict_tta(&x, 2, Tta::MirrorTranslate).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
    let labels = [0u32, 3, 1];
    let accuracy = model.accuracy_tta(&x, &labels, 2, Tta::Mirror).unwrap();
    let hits = mirror
        .chunks_exact(4)
        .zip(labels)
        .filter(|(row, l)| {
            let best = (0..4).fold(0, |b, k| if row[k] > row[b] { k } else { b });
            best == *l as usize
        })
        .count();
    assert_eq!(accuracy, hits as f32 / 3.0);
    assert!(
        model
            .accuracy_tta(&x, &labels[..2], 2, Tta::Mirror)
            .is_err()
    );
}
