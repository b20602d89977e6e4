//! Batched submission: kernels are recorded into one pending command encoder and
//! submitted together when the host needs a result (a read back, an upload into a
//! recycled buffer, or an explicit [`GpuContext::flush`]). A training step
//! therefore becomes one submission without the caller managing encoders.
//!
//! One exception: work recorded while the GPU is known to be idle (the host has
//! waited for everything it submitted) is also submitted early, after 8, 16,
//! 32, ... more dispatches, so the GPU starts on the first kernels while the
//! host records the rest. A caller that reads the loss every step waits for
//! each step, and an idle GPU would otherwise wait for the whole step to be
//! recorded (docs/lab/perf-notes.md, entry 48). Work recorded while earlier work
//! is still running stays one submission: the GPU is busy anyway.
//!
//! Binding convention for every kernel: storage buffers at `@group(0)
//! @binding(0..n)` in the order given, then the optional uniform parameter block
//! at `@binding(n)`. Where the adapter has immediates the parameter block is
//! moved there instead (see `GpuCapabilities::params_in_immediates`): no
//! buffer, no upload and a smaller bind group per dispatch.

use std::sync::Arc;

use super::GpuSlice;
use super::bind_groups;
use super::context::GpuContext;
use super::pool::PooledBuffer;
use crate::error::{AetherError, Result};

/// GPU time of one timed dispatch.
#[derive(Clone, Debug)]
pub struct KernelTime {
    pub label: &'static str,
    /// The [`GpuContext::timing_scope`] the dispatch was recorded in, if any
    /// (for example `"3 BatchNorm forward"`), so a profile can group by layer.
    pub scope: Option<Arc<str>>,
    pub nanos: f64,
}

/// Timestamp queries for the dispatches of one timed region.
struct Timer {
    queries: wgpu::QuerySet,
    /// Dispatches timed one pass each ([`GpuContext::timed`]); 0 for a span.
    capacity: u32,
    labels: Vec<(&'static str, Option<Arc<str>>)>,
    scope: Option<Arc<str>>,
    /// For [`GpuContext::timed_span`]: whether its one pass has been opened.
    span: Option<bool>,
}

/// Work recorded but not yet submitted.
#[derive(Default)]
pub(crate) struct Batch {
    /// The compute pass untimed dispatches are recorded into, open on `encoder`
    /// until a copy, a timed dispatch or the submission needs the encoder: one
    /// pass for a run of dispatches costs less host time than a pass each.
    /// (Declared before `encoder` so it is dropped first.)
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// Uniform parameter buffers the recorded dispatches read; released after submission.
    params: Vec<PooledBuffer>,
    dispatches: usize,
    copies: usize,
    timer: Option<Timer>,
    submissions: usize,
    /// Dispatches recorded since the last submission.
    unsubmitted: usize,
    /// Uploads written since the last submission: wgpu copies them out of its
    /// staging memory at the next submission, so a flush with no commands
    /// still submits (an empty submission) to deliver them and free that memory.
    uploads: bool,
    /// Since the host last waited for the GPU (and submitted nothing but
    /// early submissions): the count of unsubmitted dispatches at which the
    /// next early submission is made (see the module doc).
    early_submit_at: Option<usize>,
}

/// Dispatches in the first early submission after the GPU fell idle; each
/// later one takes twice as many, so the GPU starts early without a
/// submission per dispatch (docs/lab/perf-notes.md, entry 48).
const FIRST_EARLY_SUBMIT: usize = 8;

impl Batch {
    /// The pending encoder for a command outside compute passes: the open pass
    /// is ended first (an encoder is locked while a pass is open on it).
    fn encoder(&mut self, new: impl FnOnce() -> wgpu::CommandEncoder) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(new)
    }
}

impl GpuContext {
    /// Records one dispatch of `pipeline` over `workgroups` into the pending batch.
    pub fn dispatch(
        &self,
        label: &'static str,
        pipeline: &wgpu::ComputePipeline,
        buffers: &[GpuSlice<'_>],
        params: &[u8],
        workgroups: [u32; 3],
    ) -> Result<()> {
        self.check_faults(label)?;
        let limit = self.caps().limits.max_compute_workgroups_per_dimension;
        if let Some(&too_many) = workgroups.iter().find(|&&w| w > limit) {
            return Err(AetherError::TooManyWorkgroups {
                what: format!("{label} dispatch of {workgroups:?} workgroups"),
                workgroups: u64::from(too_many),
                limit: u64::from(limit),
            });
        }
        if workgroups.contains(&0) {
            return Ok(());
        }
        let immediates = self.caps().params_in_immediates();
        if immediates && params.len() as u32 > self.caps().immediate_bytes {
            return Err(AetherError::TooLarge {
                what: format!("{label} parameter block"),
                bytes: params.len() as u64,
                limit: u64::from(self.caps().immediate_bytes),
            });
        }
        let param_buffer = (!params.is_empty() && !immediates).then(|| {
            let pooled = self.pool().get_or_create(
                &self.device,
                params.len() as u64,
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            );
            // Safe to write now: this buffer is not in use by any pending dispatch.
            self.queue.write_buffer(pooled.buffer(), 0, params);
            pooled
        });
        // Parameters in a uniform buffer change the group every dispatch; without
        // them the group depends only on pipeline and buffers, and is reused.
        let bind_group = match &param_buffer {
            Some(p) => bind_groups::create(
                &self.device,
                label,
                pipeline,
                buffers,
                Some((p.buffer(), params.len() as u64)),
            ),
            None => self
                .bind_groups()
                .get_or_create(&self.device, label, pipeline, buffers),
        };
        let mut batch = self.batch();
        let Batch {
            encoder,
            pass,
            params: param_buffers,
            dispatches,
            timer,
            ..
        } = &mut *batch;
        // A span's dispatches share one pass, its timestamps at the pass's
        // two ends; a copy or read back in between would have closed it.
        if let Some(Timer {
            queries,
            span: Some(opened),
            ..
        }) = timer
            && pass.is_none()
        {
            if *opened {
                return Err(AetherError::Gpu {
                    during: "timing",
                    message: format!(
                        "{label}: a copy or read back inside a timed span split its compute pass"
                    ),
                });
            }
            *opened = true;
            *pass = Some(
                encoder
                    .get_or_insert_with(|| self.new_encoder())
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("aether timed span"),
                        timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                            query_set: queries,
                            beginning_of_pass_write_index: Some(0),
                            end_of_pass_write_index: Some(1),
                        }),
                    })
                    .forget_lifetime(),
            );
        }
        let timestamp_writes = match timer {
            Some(t) if (t.labels.len() as u32) < t.capacity => {
                let index = t.labels.len() as u32;
                t.labels.push((label, t.scope.clone()));
                Some(wgpu::ComputePassTimestampWrites {
                    query_set: &t.queries,
                    beginning_of_pass_write_index: Some(2 * index),
                    end_of_pass_write_index: Some(2 * index + 1),
                })
            }
            _ => None,
        };
        let record = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            if immediates && !params.is_empty() {
                pass.set_immediates(0, params);
            }
            pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        };
        if timestamp_writes.is_some() {
            // A timed dispatch gets a pass of its own: timestamps bracket passes.
            *pass = None;
            let encoder = encoder.get_or_insert_with(|| self.new_encoder());
            record(
                &mut encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(label),
                    timestamp_writes,
                }),
            );
        } else {
            let open = pass.get_or_insert_with(|| {
                encoder
                    .get_or_insert_with(|| self.new_encoder())
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("aether dispatches"),
                        timestamp_writes: None,
                    })
                    .forget_lifetime()
            });
            record(open);
        }
        param_buffers.extend(param_buffer);
        *dispatches += 1;
        batch.unsubmitted += 1;
        // Timed regions keep their dispatches in one submission.
        if batch.timer.is_none()
            && let Some(at) = batch.early_submit_at
            && batch.unsubmitted >= at
        {
            batch.early_submit_at = Some(2 * at);
            self.submit(&mut batch, true);
        }
        Ok(())
    }

    /// Records a copy of `bytes` from `src` at `src_offset` to `dst` at
    /// `dst_offset` (offsets and size multiples of 4) into the pending batch.
    pub fn copy_buffer_region(
        &self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        let mut batch = self.batch();
        batch.copies += 1;
        batch
            .encoder(|| self.new_encoder())
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
    }

    /// Submits the pending batch, if any, as one command buffer; uploads
    /// written since the last submission go with it (or alone).
    pub fn flush(&self) {
        self.flush_with(true);
    }

    /// [`GpuContext::flush`]; with `uploads` false, pending uploads alone are
    /// not worth a submission: they stay for the next one.
    fn flush_with(&self, uploads: bool) {
        let mut batch = self.batch();
        if self.submit(&mut batch, uploads) {
            // The host did not wait for this: the GPU is busy now.
            batch.early_submit_at = None;
        }
    }

    /// Submits `batch`'s recorded commands, or only its pending uploads (an
    /// empty submission) where `uploads` asks for them; true when it submitted.
    fn submit(&self, batch: &mut Batch, uploads: bool) -> bool {
        batch.pass = None;
        batch.unsubmitted = 0;
        match batch.encoder.take() {
            Some(encoder) => self.queue.submit([encoder.finish()]),
            None if uploads && batch.uploads => self.queue.submit([]),
            None => return false,
        };
        batch.uploads = false;
        batch.submissions += 1;
        batch.params.clear();
        true
    }

    /// Called once the host has waited for all submitted work: what is
    /// recorded next is submitted early as it grows (see the module doc).
    pub(crate) fn gpu_went_idle(&self) {
        self.batch().early_submit_at = Some(FIRST_EARLY_SUBMIT);
    }

    /// Total queue submissions made through the batch, for tests and benchmarks.
    pub fn submission_count(&self) -> usize {
        self.batch().submissions
    }

    /// Dispatches recorded since the context was created.
    pub fn dispatch_count(&self) -> usize {
        self.batch().dispatches
    }

    /// Buffer-to-buffer copies recorded since the context was created (each
    /// one a command with barriers of its own, outside the compute pass).
    pub fn copy_count(&self) -> usize {
        self.batch().copies
    }

    /// Names the dispatches recorded from now on inside a [`GpuContext::timed`]
    /// region; outside one it does nothing and `name` is never called, so hot
    /// paths can mark their phases for free.
    pub fn timing_scope(&self, name: impl FnOnce() -> String) {
        if let Some(timer) = self.batch().timer.as_mut() {
            timer.scope = Some(name().into());
        }
    }

    /// Runs `work`, timing each dispatch it records (up to `capacity`) with
    /// timestamp queries. An error when the adapter has no timestamps.
    pub fn timed<T>(
        &self,
        capacity: u32,
        work: impl FnOnce() -> Result<T>,
    ) -> Result<(T, Vec<KernelTime>)> {
        self.expect_timestamps()?;
        let queries = self.start_timer(capacity, None);
        let result = work();
        let timer = self.batch().timer.take().expect("timer set above");
        let value = result?;
        let count = timer.labels.len() as u32 * 2;
        if count == 0 {
            self.flush();
            return Ok((value, Vec::new()));
        }
        let ticks = self.resolve_timestamps(&queries, count)?;
        let period = f64::from(self.queue.get_timestamp_period());
        let times = timer
            .labels
            .iter()
            .enumerate()
            .map(|(i, (label, scope))| KernelTime {
                label,
                scope: scope.clone(),
                nanos: ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period,
            })
            .collect();
        Ok((value, times))
    }

    /// Runs `work`, whose dispatches (it may record nothing else) go into
    /// one compute pass, and returns the GPU nanoseconds from the pass's
    /// start to its end: the dispatches back to back, as a training step
    /// records them, with no timestamps between them (what the per-dispatch
    /// passes of [`GpuContext::timed`] add). 0 where `work` dispatched
    /// nothing; an error when the adapter has no timestamps, or where `work`
    /// copied or read back (which splits the pass).
    pub fn timed_span<T>(&self, work: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
        self.expect_timestamps()?;
        let queries = self.start_timer(0, Some(false));
        let result = work();
        let opened = {
            let mut batch = self.batch();
            // Ends the span's pass, writing its end timestamp.
            batch.pass = None;
            let timer = batch.timer.take().expect("timer set above");
            timer.span == Some(true)
        };
        let value = result?;
        if !opened {
            self.flush();
            return Ok((value, 0.0));
        }
        let ticks = self.resolve_timestamps(&queries, 2)?;
        let period = f64::from(self.queue.get_timestamp_period());
        Ok((value, ticks[1].saturating_sub(ticks[0]) as f64 * period))
    }

    fn expect_timestamps(&self) -> Result<()> {
        if self.caps().timestamps {
            return Ok(());
        }
        Err(AetherError::Gpu {
            during: "timing",
            message: format!(
                "adapter {:?} has no timestamp queries",
                self.caps().adapter_name
            ),
        })
    }

    /// Submits what is pending (so a timed region holds only its own work)
    /// and starts a timer of `capacity` dispatch passes, or a `span`; returns
    /// its query set.
    fn start_timer(&self, capacity: u32, span: Option<bool>) -> wgpu::QuerySet {
        self.flush();
        let queries = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("aether timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: (capacity * 2).max(2),
        });
        self.batch().timer = Some(Timer {
            queries: queries.clone(),
            capacity,
            labels: Vec::new(),
            scope: None,
            span,
        });
        queries
    }

    /// The first `count` timestamps of `queries`, after the pending work.
    fn resolve_timestamps(&self, queries: &wgpu::QuerySet, count: u32) -> Result<Vec<u64>> {
        let bytes = u64::from(count) * 8;
        let resolve = self.pool().get_or_create(
            &self.device,
            bytes,
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        );
        self.batch()
            .encoder(|| self.new_encoder())
            .resolve_query_set(queries, 0..count, resolve.buffer(), 0);
        let raw = self.read_bytes(GpuSlice::whole(resolve.buffer()), bytes)?;
        Ok(bytemuck::cast_slice(&raw).to_vec())
    }

    /// Writes `data` into `slice` after all pending work, so a recycled buffer
    /// is never overwritten before earlier recorded kernels have read it.
    pub fn upload(&self, slice: GpuSlice<'_>, data: &[u8]) {
        self.upload_with(slice, data.len() as u64, |mut dst| {
            dst.copy_from_slice(data)
        });
    }

    /// Like [`GpuContext::upload`], but `fill` writes the `bytes` bytes straight
    /// into wgpu's staging memory, with no host buffer in between.
    pub fn upload_with(
        &self,
        slice: GpuSlice<'_>,
        bytes: u64,
        fill: impl FnOnce(wgpu::WriteOnly<'_, [u8]>),
    ) {
        // Commands recorded so far read the buffer as it was; uploads before
        // this one are ordered with it anyway, so they need no submission yet.
        self.flush_with(false);
        let Some(size) = wgpu::BufferSize::new(bytes) else {
            return;
        };
        // `None` when validation failed; wgpu has then reported the error to
        // the device's handler, as `write_buffer` does.
        if let Some(mut view) = self
            .queue
            .write_buffer_with(slice.buffer, slice.offset, size)
        {
            fill(view.slice(..));
        }
        self.batch().uploads = true;
    }

    /// Submits pending work and copies the first `bytes` of `slice` to the host.
    pub fn read_bytes(&self, slice: GpuSlice<'_>, bytes: u64) -> Result<Vec<u8>> {
        self.read_bytes_with(slice, bytes, <[u8]>::to_vec)
    }

    /// Submits pending work and hands the first `bytes` of `slice` to `read`
    /// straight from the mapped staging buffer (pooled): no host copy of
    /// aether's own, for readers that reuse their memory.
    pub fn read_bytes_with<T>(
        &self,
        slice: GpuSlice<'_>,
        bytes: u64,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T> {
        let gpu_err = |message: String| AetherError::Gpu {
            during: "read back",
            message,
        };
        let padded = bytes.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT;
        let staging = self.pool().get_or_create(
            &self.device,
            padded,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        self.copy_buffer_region(slice.buffer, slice.offset, staging.buffer(), 0, padded);
        self.flush();
        let mapped = staging.buffer().slice(..padded);
        let (sender, receiver) = std::sync::mpsc::channel();
        mapped.map_async(wgpu::MapMode::Read, move |r| {
            let _ = sender.send(r);
        });
        self.wait_idle()?;
        receiver
            .recv()
            .map_err(|e| gpu_err(e.to_string()))?
            .map_err(|e| gpu_err(e.to_string()))?;
        let value = {
            let view = mapped
                .get_mapped_range()
                .map_err(|e| gpu_err(e.to_string()))?;
            read(&view[..bytes as usize])
        };
        staging.buffer().unmap();
        Ok(value)
    }

    fn new_encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("aether batch"),
            })
    }
}
