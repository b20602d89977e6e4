//! A pool of GPU buffers keyed by (size, usage), so a training step allocates
//! nothing new once the first step has run.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Buffers are sized in multiples of this, so nearly equal requests share buffers.
const SIZE_GRANULE: u64 = 256;

type PoolKey = (u64, wgpu::BufferUsages);

/// A request's size rounded up to the pool's granule.
fn granule(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(SIZE_GRANULE) * SIZE_GRANULE
}

/// Free buffers of one (size, usage), handed out lowest first (wgpu orders
/// buffers by identity). Which buffer a request gets then depends only on which
/// are free, not on the order they came back in, so a training step that
/// allocates and frees the same way every time settles on the same buffers and
/// its bind groups repeat (see bind_groups.rs). Handing out the last one
/// returned instead permuted the buffers from step to step: about half of a
/// v1 step's dispatches built a new bind group every step.
type FreeList = BTreeSet<wgpu::Buffer>;

/// Free buffers waiting to be reused, and counters that prove reuse.
#[derive(Default)]
pub struct BufferPool {
    free: Arc<Mutex<HashMap<PoolKey, FreeList>>>,
    created: AtomicUsize,
    reused: AtomicUsize,
    bytes: Arc<ByteCounters>,
}

/// Bytes held by the pool's buffers: all created, and on loan now / at most.
#[derive(Default)]
struct ByteCounters {
    created: AtomicU64,
    live: AtomicU64,
    peak_live: AtomicU64,
}

/// Counts of pool activity since the context was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers created on the device.
    pub created: usize,
    /// Requests served by a previously released buffer.
    pub reused: usize,
    /// Bytes of every buffer the pool created: its device memory footprint.
    pub created_bytes: u64,
    /// Bytes on loan right now (tensors, staging and parameter buffers alive).
    pub live_bytes: u64,
    /// The most bytes on loan at once since creation or [`BufferPool::reset_peak`].
    pub peak_live_bytes: u64,
}

impl BufferPool {
    /// A buffer of at least `bytes` bytes with `usage`; back in the pool when dropped.
    pub fn get_or_create(
        &self,
        device: &wgpu::Device,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> PooledBuffer {
        self.recycle(bytes, usage)
            .unwrap_or_else(|| self.create(device, bytes, usage))
    }

    /// A free buffer for (`bytes`, `usage`), if the pool holds one.
    pub fn recycle(&self, bytes: u64, usage: wgpu::BufferUsages) -> Option<PooledBuffer> {
        let key = (granule(bytes), usage);
        let buffer = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&key)
            .and_then(FreeList::pop_first)?;
        self.reused.fetch_add(1, Ordering::Relaxed);
        Some(self.lend(buffer, key))
    }

    /// A new buffer for (`bytes`, `usage`), which joins the pool when dropped.
    pub fn create(
        &self,
        device: &wgpu::Device,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> PooledBuffer {
        let size = granule(bytes);
        self.created.fetch_add(1, Ordering::Relaxed);
        self.bytes.created.fetch_add(size, Ordering::Relaxed);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("aether pooled"),
            size,
            usage,
            mapped_at_creation: false,
        });
        self.lend(buffer, (size, usage))
    }

    fn lend(&self, buffer: wgpu::Buffer, key: PoolKey) -> PooledBuffer {
        let size = key.0;
        let live = self.bytes.live.fetch_add(size, Ordering::Relaxed) + size;
        self.bytes.peak_live.fetch_max(live, Ordering::Relaxed);
        PooledBuffer {
            buffer: Some(buffer),
            key,
            home: Arc::clone(&self.free),
            bytes: Arc::clone(&self.bytes),
        }
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            created: self.created.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            created_bytes: self.bytes.created.load(Ordering::Relaxed),
            live_bytes: self.bytes.live.load(Ordering::Relaxed),
            peak_live_bytes: self.bytes.peak_live.load(Ordering::Relaxed),
        }
    }

    /// Starts a new peak measurement from the bytes on loan now.
    pub fn reset_peak(&self) {
        let live = self.bytes.live.load(Ordering::Relaxed);
        self.bytes.peak_live.store(live, Ordering::Relaxed);
    }
}

/// A buffer on loan from the pool.
pub struct PooledBuffer {
    buffer: Option<wgpu::Buffer>,
    key: PoolKey,
    home: Arc<Mutex<HashMap<PoolKey, FreeList>>>,
    bytes: Arc<ByteCounters>,
}

impl PooledBuffer {
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("buffer present until drop")
    }

    /// Allocated size in bytes (the request rounded up).
    pub fn size(&self) -> u64 {
        self.key.0
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.bytes.live.fetch_sub(self.key.0, Ordering::Relaxed);
            let mut free = self.home.lock().unwrap_or_else(|e| e.into_inner());
            free.entry(self.key).or_default().insert(buffer);
        }
    }
}
