//! Learning-rate schedules: one small trait, the rate of each step.
//!
//! A model with a schedule ([`crate::Model::set_schedule`]) sets its
//! optimizer's learning rate from it before every step; the rate reaches the
//! fused update as part of the step's parameter block (a uniform or
//! immediate write, no read back), so a schedule costs nothing on the GPU.

/// The learning rate of each training step.
pub trait Schedule: Send + Sync {
    /// The rate of step `step`, counting from 0 (the model's step count
    /// before the step, which a resumed model carries on from).
    fn lr(&self, step: u64) -> f32;
}

/// The same rate every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constant(pub f32);

impl Schedule for Constant {
    fn lr(&self, _step: u64) -> f32 {
        self.0
    }
}

/// Linear interpolation between `(step, rate)` points, as `numpy.interp`:
/// the first rate before the first point, the last after the last. The
/// triangular and one-cycle schedules are made of it.
#[derive(Clone, Debug, PartialEq)]
pub struct PiecewiseLinear {
    points: Vec<(f64, f64)>,
}

impl PiecewiseLinear {
    /// Through `points`, sorted by step (a point out of order is dropped
    /// from the interpolation's view: each segment runs forward). Empty:
    /// rate 0.
    pub fn new(points: &[(u64, f32)]) -> Self {
        Self {
            points: points
                .iter()
                .map(|&(s, r)| (s as f64, f64::from(r)))
                .collect(),
        }
    }

    /// airbench's triangle over `total_steps`: from `start x base_lr` at
    /// step 0 up to `base_lr` at step `floor(peak x total_steps)`, down to
    /// `end x base_lr` at `total_steps` (airbench94: start 0.2, peak 0.23,
    /// end 0.07).
    pub fn triangle(base_lr: f32, total_steps: u64, start: f32, peak: f32, end: f32) -> Self {
        let top = (f64::from(peak) * total_steps as f64).floor() as u64;
        Self::new(&[
            (0, base_lr * start),
            (top, base_lr),
            (total_steps, base_lr * end),
        ])
    }

    /// PyTorch's `OneCycleLR` with `anneal_strategy="linear"` and its
    /// defaults: from `max_lr / 25` up to `max_lr` at step `pct_start x
    /// total_steps - 1`, down to `max_lr / 25 / 1e4` at step `total_steps - 1`.
    pub fn one_cycle(max_lr: f32, total_steps: u64, pct_start: f32) -> Self {
        let initial = max_lr / 25.0;
        let top = (f64::from(pct_start) * total_steps as f64) as u64;
        Self::new(&[
            (0, initial),
            (top.saturating_sub(1), max_lr),
            (total_steps.saturating_sub(1), initial / 1e4),
        ])
    }
}

impl Schedule for PiecewiseLinear {
    fn lr(&self, step: u64) -> f32 {
        let x = step as f64;
        let (Some(first), Some(last)) = (self.points.first(), self.points.last()) else {
            return 0.0;
        };
        if x <= first.0 {
            return first.1 as f32;
        }
        for pair in self.points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            if x <= x1 && x1 > x0 {
                return (y0 + (y1 - y0) * (x - x0) / (x1 - x0)) as f32;
            }
        }
        last.1 as f32
    }
}

/// How [`WarmupDecay`] falls after its warmup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decay {
    Linear,
    /// Half a cosine wave.
    Cosine,
}

/// Linear warmup from 0 at step 0 to `peak` at step `warmup`, then a linear
/// or cosine decay to `end` at step `total`, and `end` after it (the
/// convention of the transformers library's schedules with warmup).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupDecay {
    pub peak: f32,
    pub warmup: u64,
    pub total: u64,
    pub end: f32,
    pub decay: Decay,
}

impl Schedule for WarmupDecay {
    fn lr(&self, step: u64) -> f32 {
        let (peak, end) = (f64::from(self.peak), f64::from(self.end));
        if step < self.warmup {
            return (peak * step as f64 / self.warmup as f64) as f32;
        }
        if step >= self.total {
            return self.end;
        }
        let progress = (step - self.warmup) as f64 / (self.total - self.warmup) as f64;
        let fall = match self.decay {
            Decay::Linear => 1.0 - progress,
            Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        };
        (end + (peak - end) * fall) as f32
    }
}
