//! Pooling ops on every device, checked against f64 references written here from
//! the definitions (scatter-style backward references, unlike the crate's gathers).

mod common;

use aether::conv::Padding;
use aether::ops::dropout::{dropout_backward, spatial_dropout, spatial_dropout_as};
use aether::ops::pool::{
    PoolDropout, PoolParams, avg_pool2d, avg_pool2d_backward, global_avg_pool,
    global_avg_pool_backward, max_pool2d, max_pool2d_as, max_pool2d_backward,
    max_pool2d_backward_as, max_pool2d_dropout, max_pool2d_dropout_backward,
};
use aether::{AetherError, DType, Device, Tensor};
use common::{Rng, f32_bits};

/// Norm-relative error bound for f32 results against the f64 references.
const F32_BOUND: f64 = 1e-5;
/// Norm-relative bound for finite differences (central, f64 loss of f32 outputs).
const FD_BOUND: f64 = 1e-3;

/// The shapes every op is checked on: (input NHWC, params, description).
fn cases() -> Vec<([usize; 4], PoolParams, &'static str)> {
    vec![
        (
            [1, 6, 8, 3],
            PoolParams::new(2, 2, Padding::Valid),
            "2x2/2 valid, even",
        ),
        (
            [5, 7, 5, 7],
            PoolParams::new(2, 2, Padding::Valid),
            "2x2/2 valid, odd",
        ),
        (
            [2, 8, 7, 5],
            PoolParams::new(3, 3, Padding::Valid),
            "3x3/3 valid, 2 rows and 1 column left over",
        ),
        (
            [1, 9, 7, 3],
            PoolParams::new(3, 2, Padding::Same),
            "3x3/2 same",
        ),
        (
            [5, 5, 6, 7],
            PoolParams::new(3, 1, Padding::Same),
            "3x3/1 same",
        ),
        (
            [1, 9, 6, 3],
            PoolParams {
                filter: (3, 2),
                stride: (2, 1),
                padding: Padding::Same,
            },
            "(3,2)/(2,1) same",
        ),
        (
            [5, 6, 7, 3],
            PoolParams {
                filter: (3, 3),
                stride: (2, 2),
                padding: Padding::Explicit {
                    top: 0,
                    bottom: 2,
                    left: 1,
                    right: 0,
                },
            },
            "3x3/2 explicit (0,2,1,0)",
        ),
    ]
}

/// Reference geometry, straight from the definition: pads, output size, and the
/// in-bounds (row, col) of each window position in r-major, then s order.
struct RefGeometry {
    dims: [usize; 4],
    out: [usize; 4],
    p: PoolParams,
    pad_top: isize,
    pad_left: isize,
}

impl RefGeometry {
    fn new(dims: [usize; 4], p: PoolParams) -> Self {
        let (fh, fw) = p.filter;
        let (top, bottom, left, right) = match p.padding {
            Padding::Same => ((fh - 1) / 2, (fh - 1) / 2, (fw - 1) / 2, (fw - 1) / 2),
            Padding::Valid => (0, 0, 0, 0),
            Padding::Explicit {
                top,
                bottom,
                left,
                right,
            } => (top, bottom, left, right),
        };
        let h_out = (dims[1] + top + bottom - fh) / p.stride.0 + 1;
        let w_out = (dims[2] + left + right - fw) / p.stride.1 + 1;
        Self {
            dims,
            out: [dims[0], h_out, w_out, dims[3]],
            p,
            pad_top: top as isize,
            pad_left: left as isize,
        }
    }

    fn window(&self, oh: usize, ow: usize) -> Vec<(usize, usize)> {
        let mut cells = Vec::new();
        for r in 0..self.p.filter.0 {
            for s in 0..self.p.filter.1 {
                let ih = (oh * self.p.stride.0) as isize + r as isize - self.pad_top;
                let iw = (ow * self.p.stride.1) as isize + s as isize - self.pad_left;
                if (0..self.dims[1] as isize).contains(&ih)
                    && (0..self.dims[2] as isize).contains(&iw)
                {
                    cells.push((ih as usize, iw as usize));
                }
            }
        }
        cells
    }

    fn x_index(&self, n: usize, h: usize, w: usize, c: usize) -> usize {
        ((n * self.dims[1] + h) * self.dims[2] + w) * self.dims[3] + c
    }

    fn y_index(&self, n: usize, h: usize, w: usize, c: usize) -> usize {
        ((n * self.out[1] + h) * self.out[2] + w) * self.out[3] + c
    }

    /// Calls `f(output index, window as flat x indices)` for every output element.
    fn for_each_window(&self, mut f: impl FnMut(usize, Vec<usize>)) {
        let [n, h_out, w_out, c] = self.out;
        for b in 0..n {
            for oh in 0..h_out {
                for ow in 0..w_out {
                    let cells = self.window(oh, ow);
                    for ch in 0..c {
                        let xs = cells
                            .iter()
                            .map(|&(ih, iw)| self.x_index(b, ih, iw, ch))
                            .collect();
                        f(self.y_index(b, oh, ow, ch), xs);
                    }
                }
            }
        }
    }
}

/// Max pool: the value and flat index of the max; the first NaN in scan order is
/// the max, otherwise the first of equal maxima.
fn ref_max_pool(x: &[f32], g: &RefGeometry) -> (Vec<f64>, Vec<u32>) {
    let len: usize = g.out.iter().product();
    let (mut values, mut argmax) = (vec![0.0; len], vec![0u32; len]);
    g.for_each_window(|o, xs| {
        let best = xs
            .iter()
            .copied()
            .find(|&i| x[i].is_nan())
            .unwrap_or_else(|| {
                let mut best = xs[0];
                for &i in &xs {
                    if f64::from(x[i]) > f64::from(x[best]) {
                        best = i;
                    }
                }
                best
            });
        values[o] = f64::from(x[best]);
        argmax[o] = best as u32;
    });
    (values, argmax)
}

/// Max pool backward as a scatter: dy of each output goes to its argmax.
fn ref_max_backward(dy: &[f32], argmax: &[u32], input_len: usize) -> Vec<f64> {
    let mut dx = vec![0.0; input_len];
    for (&d, &i) in dy.iter().zip(argmax) {
        dx[i as usize] += f64::from(d);
    }
    dx
}

fn ref_avg_pool(x: &[f32], g: &RefGeometry) -> Vec<f64> {
    let mut values = vec![0.0; g.out.iter().product()];
    g.for_each_window(|o, xs| {
        values[o] = xs.iter().map(|&i| f64::from(x[i])).sum::<f64>() / xs.len() as f64;
    });
    values
}

/// Average pool backward as a scatter: dy / count to every in-bounds element.
fn ref_avg_backward(dy: &[f32], g: &RefGeometry) -> Vec<f64> {
    let mut dx = vec![0.0; g.dims.iter().product()];
    g.for_each_window(|o, xs| {
        for &i in &xs {
            dx[i] += f64::from(dy[o]) / xs.len() as f64;
        }
    });
    dx
}

fn ref_global_avg(x: &[f32], [n, h, w, c]: [usize; 4]) -> Vec<f64> {
    let mut y = vec![0.0; n * c];
    for (i, &v) in x.iter().enumerate() {
        y[(i / (h * w * c)) * c + i % c] += f64::from(v) / (h * w) as f64;
    }
    y
}

fn ref_global_avg_backward(dy: &[f32], [n, h, w, c]: [usize; 4]) -> Vec<f64> {
    (0..n * h * w * c)
        .map(|i| f64::from(dy[(i / (h * w * c)) * c + i % c]) / (h * w) as f64)
        .collect()
}

/// `||got - want|| / ||want||`; `want` must not be all zeros.
fn rel_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let norm: f64 = want.iter().map(|v| v * v).sum::<f64>().sqrt();
    assert!(
        norm > 0.0,
        "reference is all zeros: the check could not fail"
    );
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).powi(2))
        .sum::<f64>()
        .sqrt();
    diff / norm
}

fn numel(dims: [usize; 4]) -> usize {
    dims.iter().product()
}

test_device!(max_pool_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    for (dims, p, name) in cases() {
        let g = RefGeometry::new(dims, p);
        let data = rng.vec(numel(dims));
        let x = Tensor::from_f32(dims.to_vec(), data.clone(), device).unwrap();
        let (y, argmax) = max_pool2d(&x, &p).unwrap();
        assert_eq!(y.dims(), g.out, "{name}");
        assert_eq!(argmax.dtype(), aether::DType::U32, "{name}");
        let (want_values, want_argmax) = ref_max_pool(&data, &g);
        let got_argmax = argmax.to_vec_u32().unwrap();
        assert_eq!(
            got_argmax, want_argmax,
            "{name}: argmax (seed {})",
            rng.seed
        );
        let got = y.to_vec_f32().unwrap();
        for (o, (&v, &want)) in got.iter().zip(&want_values).enumerate() {
            assert_eq!(
                f64::from(v),
                want,
                "{name}: output {o} is not x[argmax] (seed {})",
                rng.seed
            );
        }

        let dy_data = rng.vec(numel(g.out));
        let dy = Tensor::from_f32(g.out.to_vec(), dy_data.clone(), device).unwrap();
        let dx = max_pool2d_backward(&dy, &argmax, dims, &p).unwrap();
        assert_eq!(dx.dims(), dims, "{name}");
        let err = rel_error(
            &dx.to_vec_f32().unwrap(),
            &ref_max_backward(&dy_data, &want_argmax, numel(dims)),
        );
        assert!(
            err <= F32_BOUND,
            "{name}: max backward error {err} > {F32_BOUND} (seed {})",
            rng.seed
        );
    }
});

test_device!(max_pool_ties_nan_and_padding, |device: &Device| {
    let mut rng = Rng::fresh();
    // Values on a coarse grid give many ties; a few NaNs, some windows with two.
    // All values are negative, so a padding zero would win if it were counted.
    let dims = [2, 7, 5, 3];
    let mut data: Vec<f32> = rng
        .vec(numel(dims))
        .iter()
        .map(|v| -1.25 - (v * 2.0).round() * 0.5)
        .collect();
    for _ in 0..6 {
        let i = (rng.next_u64() % data.len() as u64) as usize;
        data[i] = f32::NAN;
    }
    let x = Tensor::from_f32(dims.to_vec(), data.clone(), device).unwrap();
    for p in [
        PoolParams::new(3, 1, Padding::Same),
        PoolParams::new(3, 2, Padding::Same),
    ] {
        let g = RefGeometry::new(dims, p);
        let (want_values, want_argmax) = ref_max_pool(&data, &g);
        let (y, argmax) = max_pool2d(&x, &p).unwrap();
        assert_eq!(
            argmax.to_vec_u32().unwrap(),
            want_argmax,
            "{p:?} (seed {})",
            rng.seed
        );
        let got = y.to_vec_f32().unwrap();
        let mut nans = 0;
        for (o, (&v, &want)) in got.iter().zip(&want_values).enumerate() {
            if want.is_nan() {
                nans += 1;
                assert!(
                    v.is_nan(),
                    "{p:?}: NaN must propagate at {o} (seed {})",
                    rng.seed
                );
            } else {
                assert!(v < 0.0, "{p:?}: padding won at {o} (seed {})", rng.seed);
                assert_eq!(f64::from(v), want, "{p:?} at {o} (seed {})", rng.seed);
            }
        }
        assert!(nans > 0, "the NaN case was not exercised");
    }

    // Hand-made: all equal -> the first; two NaNs -> the first NaN.
    let p = PoolParams::new(2, 2, Padding::Valid);
    let equal = Tensor::from_f32(vec![1, 2, 2, 1], vec![0.5; 4], device).unwrap();
    assert_eq!(max_pool2d(&equal, &p).unwrap().1.to_vec_u32().unwrap(), [0]);
    let two_nans =
        Tensor::from_f32(vec![1, 2, 2, 1], vec![3.0, f32::NAN, 7.0, f32::NAN], device).unwrap();
    let (y, argmax) = max_pool2d(&two_nans, &p).unwrap();
    assert!(y.to_vec_f32().unwrap()[0].is_nan());
    assert_eq!(argmax.to_vec_u32().unwrap(), [1]);
});

test_device!(avg_pool_matches_reference, |device: &Device| {
    let mut rng = Rng::fresh();
    for (dims, p, name) in cases() {
        let g = RefGeometry::new(dims, p);
        let data = rng.vec(numel(dims));
        let x = Tensor::from_f32(dims.to_vec(), data.clone(), device).unwrap();
        let y = avg_pool2d(&x, &p).unwrap();
        assert_eq!(y.dims(), g.out, "{name}");
        let err = rel_error(&y.to_vec_f32().unwrap(), &ref_avg_pool(&data, &g));
        assert!(
            err <= F32_BOUND,
            "{name}: avg forward error {err} (seed {})",
            rng.seed
        );

        let dy_data = rng.vec(numel(g.out));
        let dy = Tensor::from_f32(g.out.to_vec(), dy_data.clone(), device).unwrap();
        let dx = avg_pool2d_backward(&dy, dims, &p).unwrap();
        assert_eq!(dx.dims(), dims, "{name}");
        let err = rel_error(&dx.to_vec_f32().unwrap(), &ref_avg_backward(&dy_data, &g));
        assert!(
            err <= F32_BOUND,
            "{name}: avg backward error {err} (seed {})",
            rng.seed
        );
    }
});

test_device!(
    avg_pool_excludes_padding_from_the_count,
    |device: &Device| {
        // A constant input averages to exactly that constant everywhere, borders
        // included, only if padding is left out of the count.
        let dims = [1, 5, 4, 3];
        let x = Tensor::from_f32(dims.to_vec(), vec![0.75; numel(dims)], device).unwrap();
        let y = avg_pool2d(&x, &PoolParams::new(3, 2, Padding::Same)).unwrap();
        for (o, v) in y.to_vec_f32().unwrap().into_iter().enumerate() {
            assert_eq!(v, 0.75, "output {o}");
        }
    }
);

test_device!(
    global_avg_pool_matches_reference_and_is_deterministic,
    |device: &Device| {
        let mut rng = Rng::fresh();
        // 23 * 19 = 437 elements per plane: lanes add more than one element; 35
        // (n, c) pairs end mid-workgroup.
        for dims in [[1, 3, 5, 3], [5, 23, 19, 7]] {
            let data = rng.vec(numel(dims));
            let x = Tensor::from_f32(dims.to_vec(), data.clone(), device).unwrap();
            let first = global_avg_pool(&x).unwrap();
            assert_eq!(first.dims(), [dims[0], dims[3]]);
            let first = first.to_vec_f32().unwrap();
            let second = global_avg_pool(&x).unwrap().to_vec_f32().unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&first), bits(&second), "{dims:?}: two runs differ");
            let err = rel_error(&first, &ref_global_avg(&data, dims));
            assert!(
                err <= F32_BOUND,
                "{dims:?}: global forward error {err} (seed {})",
                rng.seed
            );

            let dy_data = rng.vec(dims[0] * dims[3]);
            let dy = Tensor::from_f32(vec![dims[0], dims[3]], dy_data.clone(), device).unwrap();
            let dx = global_avg_pool_backward(&dy, dims).unwrap();
            assert_eq!(dx.dims(), dims);
            let err = rel_error(
                &dx.to_vec_f32().unwrap(),
                &ref_global_avg_backward(&dy_data, dims),
            );
            assert!(
                err <= F32_BOUND,
                "{dims:?}: global backward error {err} (seed {})",
                rng.seed
            );
        }
    }
);

/// Central finite differences of `sum(forward(x) * g)` at every element of `x`,
/// compared with `analytic` (the backward pass applied to `g`).
fn check_finite_differences(
    what: &str,
    x: &[f32],
    dims: [usize; 4],
    g: &[f32],
    eps: f32,
    forward: impl Fn(&Tensor) -> Tensor,
    analytic: &[f32],
) {
    let loss = |data: Vec<f32>| -> f64 {
        let y = forward(&Tensor::from_f32(dims.to_vec(), data, &Device::Cpu).unwrap());
        y.to_vec_f32()
            .unwrap()
            .iter()
            .zip(g)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    };
    let numeric: Vec<f64> = (0..x.len())
        .map(|i| {
            let (mut plus, mut minus) = (x.to_vec(), x.to_vec());
            plus[i] += eps;
            minus[i] -= eps;
            let step = f64::from(plus[i]) - f64::from(minus[i]);
            (loss(plus) - loss(minus)) / step
        })
        .collect();
    let err = rel_error(analytic, &numeric);
    assert!(
        err <= FD_BOUND,
        "{what}: finite-difference error {err} > {FD_BOUND}"
    );
}

#[test]
fn finite_differences_of_backward_passes_on_cpu() {
    let mut rng = Rng::fresh();
    let cpu = Device::Cpu;
    for (dims, p, name) in cases().into_iter().filter(|(d, _, _)| d[0] == 1) {
        let out = RefGeometry::new(dims, p).out;
        let len = numel(dims);
        let g = rng.vec(numel(out));
        let dy = Tensor::from_f32(out.to_vec(), g.clone(), &cpu).unwrap();

        let x = rng.vec(len);
        let analytic = avg_pool2d_backward(&dy, dims, &p).unwrap();
        check_finite_differences(
            &format!("avg {name} (seed {})", rng.seed),
            &x,
            dims,
            &g,
            1e-2,
            |t| avg_pool2d(t, &p).unwrap(),
            &analytic.to_vec_f32().unwrap(),
        );

        // Distinct values 2/len apart (a shuffled ramp): no ties, and a step of a
        // quarter of the spacing cannot change any argmax.
        let mut order: Vec<usize> = (0..len).collect();
        for i in (1..len).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let spacing = 2.0 / len as f32;
        let x: Vec<f32> = order
            .iter()
            .map(|&k| -1.0 + (k as f32 + 0.5) * spacing)
            .collect();
        let xt = Tensor::from_f32(dims.to_vec(), x.clone(), &cpu).unwrap();
        let (_, argmax) = max_pool2d(&xt, &p).unwrap();
        let analytic = max_pool2d_backward(&dy, &argmax, dims, &p).unwrap();
        check_finite_differences(
            &format!("max {name} (seed {})", rng.seed),
            &x,
            dims,
            &g,
            spacing / 4.0,
            |t| max_pool2d(t, &p).unwrap().0,
            &analytic.to_vec_f32().unwrap(),
        );
    }

    let dims = [2, 5, 3, 3];
    let x = rng.vec(numel(dims));
    let g = rng.vec(dims[0] * dims[3]);
    let dy = Tensor::from_f32(vec![dims[0], dims[3]], g.clone(), &cpu).unwrap();
    let analytic = global_avg_pool_backward(&dy, dims).unwrap();
    check_finite_differences(
        &format!("global avg (seed {})", rng.seed),
        &x,
        dims,
        &g,
        1e-2,
        |t| global_avg_pool(t).unwrap(),
        &analytic.to_vec_f32().unwrap(),
    );
}

#[test]
fn max_pool_gpu_is_bit_identical_to_cpu() {
    let Some(gpu) = common::gpu() else {
        return;
    };
    let mut rng = Rng::fresh();
    for (dims, p, name) in cases() {
        // Random data with coarse-grid ties, signed zeros and NaNs mixed in.
        let mut data = rng.vec(numel(dims));
        for v in data.iter_mut().step_by(3) {
            *v = (*v * 2.0).round() * 0.5;
        }
        for _ in 0..3 {
            let i = (rng.next_u64() % data.len() as u64) as usize;
            data[i] = f32::NAN;
        }
        // A signed-zero tie in the first window: the first in scan order wins.
        let (w, c) = (dims[2], dims[3]);
        data[0] = -0.0;
        data[c] = 0.0;
        data[w * c] = 0.0;
        data[w * c + c] = -0.0;
        let on_cpu = Tensor::from_f32(dims.to_vec(), data.clone(), &Device::Cpu).unwrap();
        let on_gpu = Tensor::from_f32(dims.to_vec(), data, &gpu).unwrap();
        let (cpu_y, cpu_arg) = max_pool2d(&on_cpu, &p).unwrap();
        let (gpu_y, gpu_arg) = max_pool2d(&on_gpu, &p).unwrap();
        assert_eq!(
            gpu_arg.to_vec_u32().unwrap(),
            cpu_arg.to_vec_u32().unwrap(),
            "{name}: argmax (seed {})",
            rng.seed
        );
        assert_eq!(
            f32_bits(&gpu_y),
            f32_bits(&cpu_y),
            "{name}: output bits (seed {})",
            rng.seed
        );
        // The backward too (the tiling windows take their own kernel): dy with
        // signed zeros and a NaN. A NaN must stay NaN, but its payload may not
        // survive the gather's sum on every driver (NVIDIA returns its canonical
        // NaN), so NaNs compare as one value.
        let mut dy = rng.vec(cpu_y.numel());
        dy[0] = -0.0;
        dy[1] = f32::NAN;
        let last = dy.len() - 1;
        dy[last] = -0.0;
        let backward = |device: &Device, argmax: &Tensor| {
            let dyt = Tensor::from_f32(cpu_y.dims().to_vec(), dy.clone(), device).unwrap();
            max_pool2d_backward(&dyt, argmax, dims, &p).unwrap()
        };
        let nan_as_one = |t: &Tensor| -> Vec<u32> {
            let canonical = f32::NAN.to_bits();
            let v = t.to_vec_f32().unwrap();
            v.iter()
                .map(|x| if x.is_nan() { canonical } else { x.to_bits() })
                .collect()
        };
        assert_eq!(
            nan_as_one(&backward(&gpu, &gpu_arg)),
            nan_as_one(&backward(&Device::Cpu, &cpu_arg)),
            "{name}: dx bits (seed {})",
            rng.seed
        );
    }
}

#[test]
fn operands_on_different_devices_are_a_typed_error() {
    let Some(gpu) = common::gpu() else {
        return;
    };
    let mut rng = Rng::fresh();
    let dims = [1, 4, 4, 3];
    let p = PoolParams::new(2, 2, Padding::Valid);
    let x = Tensor::from_f32(dims.to_vec(), rng.vec(numel(dims)), &gpu).unwrap();
    let (y, argmax) = max_pool2d(&x, &p).unwrap();
    let host_argmax = argmax.to(&Device::Cpu).unwrap();
    let err = max_pool2d_backward(&y, &host_argmax, dims, &p).unwrap_err();
    assert!(
        matches!(
            err,
            AetherError::DeviceMismatch {
                op: "max_pool2d_backward",
                ..
            }
        ),
        "{err}"
    );
}

test_device!(bad_inputs_are_typed_errors, |device: &Device| {
    let mut rng = Rng::fresh();
    let p = PoolParams::new(2, 2, Padding::Valid);
    let is_invalid = |e: &AetherError, op: &str| matches!(e, AetherError::InvalidShape { op: o, .. } if *o == op);

    let rank3 = Tensor::from_f32(vec![4, 4, 3], rng.vec(48), device).unwrap();
    for err in [
        max_pool2d(&rank3, &p).unwrap_err(),
        avg_pool2d(&rank3, &p).unwrap_err(),
        global_avg_pool(&rank3).unwrap_err(),
    ] {
        assert!(err.to_string().contains("rank 4"), "{err}");
    }

    let x = Tensor::from_f32(vec![1, 3, 3, 2], rng.vec(18), device).unwrap();
    let too_big = PoolParams::new(5, 1, Padding::Valid);
    let err = max_pool2d(&x, &too_big).unwrap_err();
    assert!(
        is_invalid(&err, "max_pool2d") && err.to_string().contains("larger"),
        "{err}"
    );
    let err = avg_pool2d(&x, &too_big).unwrap_err();
    assert!(is_invalid(&err, "avg_pool2d"), "{err}");
    // Same padding of a 5x5 window gives 3x3 + 4 = 7 >= 5: it fits.
    assert!(max_pool2d(&x, &PoolParams::new(5, 1, Padding::Same)).is_ok());

    let zero_stride = PoolParams::new(2, 0, Padding::Valid);
    assert!(is_invalid(
        &max_pool2d(&x, &zero_stride).unwrap_err(),
        "max_pool2d"
    ));
    let padding_only = PoolParams {
        padding: Padding::Explicit {
            top: 2,
            bottom: 0,
            left: 0,
            right: 0,
        },
        ..p
    };
    let err = avg_pool2d(&x, &padding_only).unwrap_err();
    assert!(err.to_string().contains("padding only"), "{err}");

    let labels = Tensor::from_u32(vec![1, 4, 4, 1], (0..16).collect(), device).unwrap();
    for err in [
        max_pool2d(&labels, &p).unwrap_err(),
        avg_pool2d(&labels, &p).unwrap_err(),
        global_avg_pool(&labels).unwrap_err(),
    ] {
        assert!(err.to_string().contains("F32"), "{err}");
    }

    // Backward: dy of the wrong shape, an argmax that is not U32, zero input dims.
    let dims = [1, 4, 4, 3];
    let xt = Tensor::from_f32(dims.to_vec(), rng.vec(48), device).unwrap();
    let (y, argmax) = max_pool2d(&xt, &p).unwrap();
    let wrong_dy = Tensor::from_f32(vec![1, 3, 2, 3], rng.vec(18), device).unwrap();
    let err = max_pool2d_backward(&wrong_dy, &argmax, dims, &p).unwrap_err();
    assert!(matches!(err, AetherError::ShapeMismatch { .. }), "{err}");
    let err = avg_pool2d_backward(&wrong_dy, dims, &p).unwrap_err();
    assert!(matches!(err, AetherError::ShapeMismatch { .. }), "{err}");
    let err = max_pool2d_backward(&y, &y, dims, &p).unwrap_err();
    assert!(err.to_string().contains("U32"), "{err}");
    let err = avg_pool2d_backward(&y, [1, 0, 4, 3], &p).unwrap_err();
    assert!(is_invalid(&err, "avg_pool2d_backward"), "{err}");
    // Sizes past the kernels' index range, which overflowed the geometry's
    // arithmetic or were cut to u32 (a stride of 2^32 became 0).
    let huge = 1usize << 32;
    let wide_stride = PoolParams::new(2, huge, Padding::Valid);
    let err = avg_pool2d_backward(&y, dims, &wide_stride).unwrap_err();
    assert!(err.to_string().contains("2^31"), "{err}");
    let err = avg_pool2d_backward(&y, [huge, huge, huge, 3], &p).unwrap_err();
    assert!(is_invalid(&err, "avg_pool2d_backward"), "{err}");
    let err = global_avg_pool_backward(&wrong_dy, dims).unwrap_err();
    assert!(
        err.to_string().contains("global_avg_pool_backward"),
        "{err}"
    );
    let dy = Tensor::from_f32(vec![1, 3], rng.vec(3), device).unwrap();
    let err = global_avg_pool_backward(&dy, [1, 4, 0, 3]).unwrap_err();
    assert!(is_invalid(&err, "global_avg_pool_backward"), "{err}");
});

/// The bits of a tensor's values: f32 as they are, f16 widened from their bits.
fn value_bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::F16 => t
            .to_vec_f16()
            .unwrap()
            .iter()
            .map(|v| u32::from(v.to_bits()))
            .collect(),
        _ => t
            .to_vec_f32()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    }
}

test_device!(
    max_pool_with_dropout_folded_in_is_bit_identical_to_the_two,
    |device: &Device| {
        // 2x2/2 pools. Shapes: a few odd maps (one with a row and a column
        // past the last window, written as zeros with it); many small maps, so a workgroup's
        // outputs straddle maps and share a table of their masks; 36 and 2048
        // channels, where a workgroup's maps need more than the table's 1024
        // draws (at 4 outputs an invocation) and each invocation draws; 3
        // channels, one an invocation (f32 only: f16 needs channels in fours).
        // NaNs in some windows, values beyond f16's range.
        let mut rng = Rng::fresh();
        let params = PoolParams::new(2, 2, Padding::Valid);
        let seed = rng.next_u64();
        let step = rng.next_u64() as u32;
        let context = format!("dropout seed {seed}, step {step}, rng seed {}", rng.seed);
        for dims in [
            [3, 6, 4, 12],
            [40, 4, 4, 8],
            [64, 2, 2, 36],
            [2, 2, 2, 2048],
            [5, 4, 6, 3],
            [3, 7, 5, 8],
        ] {
            let len = numel(dims);
            let mut data: Vec<f32> = rng
                .vec(len)
                .iter()
                .enumerate()
                .map(|(i, v)| v * [1.0, 1e5, 3.0, 1e-5][i % 4])
                .collect();
            for i in (0..len).step_by(97) {
                data[i] = f32::NAN;
            }
            let x = Tensor::from_f32(dims.to_vec(), data, device).unwrap();
            let (pooled, want_argmax) = max_pool2d(&x, &params).unwrap();
            for (rate, output) in [(0.0, DType::F32), (0.45, DType::F32), (0.45, DType::F16)] {
                if output == DType::F16 && dims[3] % 4 != 0 {
                    continue;
                }
                let what = format!("{dims:?} rate {rate} {output:?} ({context})");
                let dropout = PoolDropout { rate, seed, step };
                let (y, argmax) = max_pool2d_dropout(&x, &params, &dropout, output).unwrap();
                let (want_y, mask) = spatial_dropout_as(&pooled, rate, seed, step, output).unwrap();
                assert_eq!(y.dtype(), output, "{what}");
                assert_eq!(value_bits(&y), value_bits(&want_y), "y of {what}");
                assert_eq!(
                    argmax.to_vec_u32().unwrap(),
                    want_argmax.to_vec_u32().unwrap(),
                    "argmax of {what}"
                );
                let dy = Tensor::from_f32(pooled.dims().to_vec(), rng.vec(pooled.numel()), device)
                    .unwrap();
                let dx =
                    max_pool2d_dropout_backward(&dy, &argmax, dims, &params, &dropout).unwrap();
                let (_, f32_mask) = spatial_dropout(&pooled, rate, seed, step).unwrap();
                assert_eq!(value_bits(&mask), value_bits(&f32_mask), "{what}");
                let want_dx = max_pool2d_backward(
                    &dropout_backward(&dy, &f32_mask).unwrap(),
                    &want_argmax,
                    dims,
                    &params,
                )
                .unwrap();
                assert_eq!(value_bits(&dx), value_bits(&want_dx), "dx of {what}");
                if rate > 0.0 {
                    let m = f32_mask.to_vec_f32().unwrap();
                    assert!(m.contains(&0.0) && m.iter().any(|&v| v != 0.0), "{what}");
                }
            }
        }
        // Overlapping windows (3x3/2), and F16 over 6 channels.
        let dropout = PoolDropout {
            rate: 0.5,
            seed,
            step,
        };
        let overlapping = PoolParams::new(3, 2, Padding::Valid);
        let x = Tensor::from_f32(vec![1, 5, 5, 4], rng.vec(100), device).unwrap();
        let x6 = Tensor::from_f32(vec![1, 4, 4, 6], rng.vec(96), device).unwrap();
        for (x, p, output) in [(&x, &overlapping, DType::F32), (&x6, &params, DType::F16)] {
            assert!(matches!(
                max_pool2d_dropout(x, p, &dropout, output),
                Err(AetherError::InvalidShape {
                    op: "max_pool2d_dropout",
                    ..
                })
            ));
        }
    }
);

test_device!(
    max_pool_f16_dx_is_the_f32_dx_cast_as_a_conv_casts_it,
    |device: &Device| {
        // dx as f16 for a conv before the pool: the f32 backward's values,
        // clipped to +-65504 and rounded as the conv's cast does, plain and
        // with a folded dropout. Shapes as the test above: odd maps with a
        // row and a column past the last window, many small maps, wide
        // channels. dy carries values beyond f16's range, f16 subnormals,
        // -0.0 and NaN.
        let mut rng = Rng::fresh();
        let params = PoolParams::new(2, 2, Padding::Valid);
        let dropout = PoolDropout {
            rate: 0.3,
            seed: rng.next_u64(),
            step: rng.next_u64() as u32,
        };
        for dims in [[3, 7, 5, 8], [40, 4, 4, 8], [2, 2, 2, 2048], [2, 6, 6, 12]] {
            let x = Tensor::from_f32(dims.to_vec(), rng.vec(numel(dims)), device).unwrap();
            let (pooled, argmax) = max_pool2d(&x, &params).unwrap();
            let mut dys: Vec<f32> = rng
                .vec(pooled.numel())
                .iter()
                .enumerate()
                .map(|(i, v)| v * [1.0, 1e5, 3e-6, 1.0][i % 4])
                .collect();
            (dys[1], dys[2], dys[3]) = (-0.0, f32::NAN, 7e4);
            let dy = Tensor::from_f32(pooled.dims().to_vec(), dys, device).unwrap();
            for folded in [None, Some(&dropout)] {
                let what = format!("{dims:?} dropout {folded:?} (seed {})", rng.seed);
                let dx = max_pool2d_backward_as(&dy, &argmax, dims, &params, folded, DType::F16)
                    .unwrap();
                let f32_dx =
                    max_pool2d_backward_as(&dy, &argmax, dims, &params, folded, DType::F32)
                        .unwrap();
                let want = aether::conv::cast_f16(&f32_dx, true).unwrap();
                assert_eq!(dx.dtype(), DType::F16, "{what}");
                assert_eq!(value_bits(&dx), value_bits(&want), "dx of {what}");
                let halves = dx.to_vec_f16().unwrap();
                assert!(
                    halves.iter().any(|h| h.to_f32().abs() == 65504.0),
                    "nothing saturated in {what}"
                );
                assert!(halves.iter().any(|h| h.is_nan()), "no NaN kept in {what}");
            }
        }
        // The GPU kernels write four channels of whole windows: overlapping
        // windows or 6 channels are a typed error there, and work on the CPU.
        let overlapping = PoolParams::new(3, 2, Padding::Valid);
        for (dims, p) in [([1, 5, 5, 4], &overlapping), ([1, 4, 4, 6], &params)] {
            let x = Tensor::from_f32(dims.to_vec(), rng.vec(numel(dims)), device).unwrap();
            let (pooled, argmax) = max_pool2d(&x, p).unwrap();
            let dy =
                Tensor::from_f32(pooled.dims().to_vec(), rng.vec(pooled.numel()), device).unwrap();
            let result = max_pool2d_backward_as(&dy, &argmax, dims, p, None, DType::F16);
            match (device.gpu_context(), result) {
                (None, Ok(dx)) => assert_eq!(dx.dtype(), DType::F16),
                (Some(_), Err(AetherError::InvalidShape { op, reason, .. })) => {
                    assert_eq!(op, "max_pool2d_backward");
                    assert!(reason.contains("fours"), "{reason}");
                }
                (_, other) => panic!("f16 dx of {dims:?} {p:?}: {other:?}"),
            }
        }
    }
);

test_device!(
    max_pool_f16_output_is_the_f32_one_rounded,
    |device: &Device| {
        // For a conv after the pool: y as f16 against the f32 y clipped and
        // rounded, bit for bit, and the same argmax; tiling and overlapping
        // windows, padding, maps that straddle workgroups, NaNs and values
        // past f16's range.
        let mut rng = Rng::fresh();
        let cases = [
            ([3, 7, 5, 8], PoolParams::new(2, 2, Padding::Valid)),
            ([2, 9, 9, 12], PoolParams::new(3, 2, Padding::Same)),
            ([40, 4, 4, 4], PoolParams::new(2, 2, Padding::Valid)),
        ];
        for (dims, p) in cases {
            let len = numel(dims);
            let mut data: Vec<f32> = rng
                .vec(len)
                .iter()
                .enumerate()
                .map(|(i, v)| v * [1.0, 1e5, 3.0][i % 3])
                .collect();
            for i in (0..len).step_by(89) {
                data[i] = f32::NAN;
            }
            let x = Tensor::from_f32(dims.to_vec(), data, device).unwrap();
            let what = format!("{dims:?} {p:?} (seed {})", rng.seed);
            let (y32, argmax32) = max_pool2d_as(&x, &p, DType::F32).unwrap();
            let (y16, argmax16) = max_pool2d_as(&x, &p, DType::F16).unwrap();
            assert_eq!(y16.dtype(), DType::F16, "{what}");
            let want = aether::conv::cast_f16(&y32, true).unwrap();
            assert_eq!(value_bits(&y16), value_bits(&want), "y of {what}");
            assert_eq!(
                argmax16.to_vec_u32().unwrap(),
                argmax32.to_vec_u32().unwrap(),
                "argmax of {what}"
            );
            let wide = y16.to_vec_f32().unwrap();
            assert!(
                wide.iter().any(|v| v.abs() == 65504.0),
                "nothing saturated: {what}"
            );
        }
        // Six channels: a typed error on the GPU, which writes four at a time.
        let x = Tensor::from_f32(vec![1, 4, 4, 6], rng.vec(96), device).unwrap();
        let p = PoolParams::new(2, 2, Padding::Valid);
        match (device.gpu_context(), max_pool2d_as(&x, &p, DType::F16)) {
            (None, Ok((y, _))) => assert_eq!(y.dtype(), DType::F16),
            (Some(_), Err(AetherError::InvalidShape { op, reason, .. })) => {
                assert_eq!(op, "max_pool2d");
                assert!(reason.contains("fours"), "{reason}");
            }
            (_, other) => panic!("f16 output over 6 channels: {other:?}"),
        }
    }
);
