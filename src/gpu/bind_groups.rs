//! Bind groups reused across steps: a training step binds the same pooled
//! buffers to the same pipelines every time, so each (pipeline, buffers) pair
//! is bound once instead of once per dispatch.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::GpuSlice;

/// Entries kept before the cache starts over. A settled v1 training step uses
/// 78; the bound keeps a long run with changing shapes from growing without end.
const CAPACITY: usize = 4096;

type Key = (wgpu::ComputePipeline, Vec<(wgpu::Buffer, u64, u64)>);

/// Bind groups of storage bindings, keyed by pipeline and buffer slices.
/// Entries hold their buffers, which are pooled and never freed before the
/// context, so a cached group can never name a buffer that has been replaced.
#[derive(Default)]
pub(crate) struct BindGroupCache {
    entries: Mutex<HashMap<Key, wgpu::BindGroup>>,
    created: AtomicUsize,
}

impl BindGroupCache {
    /// The bind group of `slices` at bindings `0..n` of `pipeline`'s group 0.
    pub(crate) fn get_or_create(
        &self,
        device: &wgpu::Device,
        label: &str,
        pipeline: &wgpu::ComputePipeline,
        slices: &[GpuSlice<'_>],
    ) -> wgpu::BindGroup {
        let key: Key = (
            pipeline.clone(),
            slices
                .iter()
                .map(|s| (s.buffer.clone(), s.offset, s.size))
                .collect(),
        );
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(group) = entries.get(&key) {
            return group.clone();
        }
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        let group = create(device, label, pipeline, slices, None);
        self.created.fetch_add(1, Ordering::Relaxed);
        entries.insert(key, group.clone());
        group
    }

    /// Bind groups this cache has built (misses) since the context was created.
    pub(crate) fn created(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }
}

/// A bind group of `slices` at bindings `0..n`, then `params` (a uniform
/// buffer and its size) at binding `n` when given.
pub(crate) fn create(
    device: &wgpu::Device,
    label: &str,
    pipeline: &wgpu::ComputePipeline,
    slices: &[GpuSlice<'_>],
    params: Option<(&wgpu::Buffer, u64)>,
) -> wgpu::BindGroup {
    let mut entries: Vec<wgpu::BindGroupEntry> = slices
        .iter()
        .enumerate()
        .map(|(i, s)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: s.binding(),
        })
        .collect();
    if let Some((buffer, size)) = params {
        entries.push(wgpu::BindGroupEntry {
            binding: slices.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: wgpu::BufferSize::new(size),
            }),
        });
    }
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    })
}
