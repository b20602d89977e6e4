//! Host f32 values written into an upload's staging memory, as f32 or rounded
//! to f16, by several threads at once when there are many.
//!
//! On a discrete GPU wgpu maps upload staging in device memory across PCIe
//! (write-combined), and one host thread fills it several times slower than
//! all of them (`cargo bench --bench upload`, docs/lab/perf-notes.md, entry
//! 68). The values go in as the caller lists them, so a shuffled batch
//! is gathered straight into staging with no host copy in between.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::tensor::DType;

/// Values one thread writes at a time: large enough that handing out the job
/// costs nothing next to it, small enough that a v1 batch makes a dozen.
const JOB_VALUES: usize = 1 << 16;

/// f16 values rounded on the stack before one copy into staging.
const ROUND_BLOCK: usize = 2048;

/// Writes `sources`, one after another, into `dst` as `dtype` (F32 as it is,
/// F16 rounded to nearest as `half::f16::from_f32` rounds, saturating at
/// +-65504 with NaN kept, as every f32 -> f16 conversion of aether). `dst` holds exactly
/// their values.
///
/// # Panics
/// If `dtype` is not F32 or F16, or `dst` is not the sources' size; callers
/// size both from the same shape.
pub(crate) fn write_f32s(dst: wgpu::WriteOnly<'_, [u8]>, sources: &[&[f32]], dtype: DType) {
    assert!(
        matches!(dtype, DType::F32 | DType::F16),
        "{dtype:?} is not a float type"
    );
    let size = dtype.size_bytes();
    let mut jobs = Vec::new();
    let (mut rest, mut first, mut values) = (dst, 0, 0);
    for (k, source) in sources.iter().enumerate() {
        values += source.len();
        if values >= JOB_VALUES || k + 1 == sources.len() {
            let (piece, tail) = rest.split_at(values * size);
            jobs.push((&sources[first..=k], Piece(piece)));
            (rest, first, values) = (tail, k + 1, 0);
        }
    }
    assert_eq!(
        rest.len(),
        0,
        "staging is larger than the values written into it"
    );
    if jobs.len() > 1 {
        jobs.into_par_iter()
            .for_each(|(sources, piece)| write_job(piece.0, sources, dtype));
    } else {
        for (sources, piece) in jobs {
            write_job(piece.0, sources, dtype);
        }
    }
}

/// A job's piece of staging, moved to the thread that writes it.
struct Piece<'a>(wgpu::WriteOnly<'a, [u8]>);

// SAFETY: a `WriteOnly<[u8]>` is exclusive, write-only access to its bytes, as
// `&mut [u8]` is, and that is `Send`; wgpu's `impl<T: Send> Send for
// WriteOnly<'_, T>` leaves out unsized `T` only through the implicit `T: Sized`.
// The pieces come from `split_at`, so no two overlap.
unsafe impl Send for Piece<'_> {}

/// One job's sources, one after another, into its piece of staging.
fn write_job(mut piece: wgpu::WriteOnly<'_, [u8]>, sources: &[&[f32]], dtype: DType) {
    let size = dtype.size_bytes();
    let mut at = 0;
    for source in sources {
        let end = at + source.len() * size;
        write_one(piece.slice(at..end), source, dtype);
        at = end;
    }
}

fn write_one(mut dst: wgpu::WriteOnly<'_, [u8]>, values: &[f32], dtype: DType) {
    if dtype == DType::F32 {
        dst.copy_from_slice(bytemuck::cast_slice(values));
        return;
    }
    let mut block = [f16::ZERO; ROUND_BLOCK];
    for (i, chunk) in values.chunks(ROUND_BLOCK).enumerate() {
        let rounded = &mut block[..chunk.len()];
        rounded.convert_from_f32_slice(chunk);
        // Saturate: an overflow (or an infinity) becomes +-65504.
        for h in rounded.iter_mut().filter(|h| h.is_infinite()) {
            *h = if h.is_sign_negative() {
                -f16::MAX
            } else {
                f16::MAX
            };
        }
        let at = 2 * ROUND_BLOCK * i;
        dst.slice(at..at + 2 * chunk.len())
            .copy_from_slice(bytemuck::cast_slice(rounded));
    }
}

/// `data` as sources of at most one job each, for [`write_f32s`].
pub(crate) fn in_jobs(data: &[f32]) -> Vec<&[f32]> {
    data.chunks(JOB_VALUES).collect()
}
