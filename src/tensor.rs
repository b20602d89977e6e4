//! Tensors: NHWC f32 (or f16 storage for GPU operands) on the host or a GPU.
//!
//! A tensor is an immutable value; kernels produce new tensors. Cloning is cheap
//! (storage is shared). GPU storage comes from the context's buffer pool and goes
//! back to it when the last clone is dropped. The exception to immutability is
//! the optimizer's packed buffers (see `crate::optim`): a model's parameters,
//! their gradients and their f16 mirror each live in one buffer, the layers
//! hold views of them, and kernels write those views in place every step.

use std::sync::Arc;

use half::f16;

use crate::device::Device;
use crate::error::{AetherError, Result};
use crate::gpu::{GpuContext, GpuSlice, PooledBuffer, in_jobs, write_f32s};

/// Element type of a tensor's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    /// Indices and counts (e.g. max-pool argmax, labels).
    U32,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            Self::F32 | Self::U32 => 4,
            Self::F16 => 2,
        }
    }
}

/// Dimensions of a tensor, outermost first (NHWC for images). Every dimension is
/// at least 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape, or [`AetherError::InvalidShape`] for rank 0 or a zero dimension.
    pub fn new(dims: impl Into<Vec<usize>>) -> Result<Self> {
        let dims = dims.into();
        if dims.is_empty() || dims.contains(&0) {
            return Err(AetherError::InvalidShape {
                op: "Shape::new",
                shape: dims,
                reason: "every tensor needs rank >= 1 and no zero-sized dimension".into(),
            });
        }
        if dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(AetherError::InvalidShape {
                op: "Shape::new",
                shape: dims,
                reason: "element count overflows usize".into(),
            });
        }
        Ok(Self(dims))
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// `[n, h, w, c]` of a rank-4 shape; `op` names the caller in the error.
    pub fn nhwc(&self, op: &'static str) -> Result<[usize; 4]> {
        <[usize; 4]>::try_from(self.0.as_slice()).map_err(|_| AetherError::InvalidShape {
            op,
            shape: self.0.clone(),
            reason: "expected rank 4 (N, H, W, C)".into(),
        })
    }
}

#[derive(Clone)]
enum Storage {
    HostF32(Arc<Vec<f32>>),
    HostF16(Arc<Vec<f16>>),
    HostU32(Arc<Vec<u32>>),
    Gpu(GpuRange),
}

struct GpuStorage {
    ctx: Arc<GpuContext>,
    buffer: PooledBuffer,
}

/// The part of a pooled buffer a GPU tensor occupies: all of it, or a view's
/// segment (see [`Tensor::gpu_views`]). `size` is the binding size, a multiple
/// of the pool's granule.
#[derive(Clone)]
struct GpuRange {
    storage: Arc<GpuStorage>,
    offset: u64,
    size: u64,
}

impl GpuRange {
    fn slice(&self) -> GpuSlice<'_> {
        GpuSlice {
            buffer: self.storage.buffer.buffer(),
            offset: self.offset,
            size: self.size,
        }
    }
}

/// Where a GPU tensor's values lie in its buffer (see [`Tensor::gpu_buffer`]).
#[derive(Clone, Copy, Debug)]
pub struct TensorBuffer<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// Byte offset of the first element (a multiple of 256).
    pub offset: u64,
    /// Bytes of the values: elements x [`DType::size_bytes`].
    pub bytes: u64,
}

/// A shaped array of numbers on one device.
#[derive(Clone)]
pub struct Tensor {
    shape: Shape,
    dtype: DType,
    storage: Storage,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape.dims())
            .field("dtype", &self.dtype)
            .field("device", &self.device().name())
            .finish()
    }
}

fn check_len(shape: &Shape, len: usize) -> Result<()> {
    if shape.numel() == len {
        Ok(())
    } else {
        Err(AetherError::DataLength {
            shape: shape.dims().to_vec(),
            expected: shape.numel(),
            actual: len,
        })
    }
}

impl Tensor {
    /// An f32 tensor from host data, placed on `device`.
    pub fn from_f32(dims: impl Into<Vec<usize>>, data: Vec<f32>, device: &Device) -> Result<Self> {
        match device {
            Device::Cpu => {
                let shape = Shape::new(dims)?;
                check_len(&shape, data.len())?;
                Ok(Self {
                    shape,
                    dtype: DType::F32,
                    storage: Storage::HostF32(Arc::new(data)),
                })
            }
            Device::Gpu(_) => Self::from_f32_slice(dims, &data, device),
        }
    }

    /// An f32 tensor copied from a host slice, placed on `device`: on a GPU the
    /// slice is uploaded as it is, with no intermediate `Vec`.
    pub fn from_f32_slice(
        dims: impl Into<Vec<usize>>,
        data: &[f32],
        device: &Device,
    ) -> Result<Self> {
        match device {
            Device::Cpu => Self::from_f32(dims, data.to_vec(), device),
            Device::Gpu(ctx) => {
                let shape = Shape::new(dims)?;
                check_len(&shape, data.len())?;
                Self::upload_with(ctx, shape, DType::F32, |dst| {
                    write_f32s(dst, &in_jobs(data), DType::F32)
                })
            }
        }
    }

    /// An f16 tensor from host data, placed on `device`.
    pub fn from_f16(dims: impl Into<Vec<usize>>, data: Vec<f16>, device: &Device) -> Result<Self> {
        let shape = Shape::new(dims)?;
        check_len(&shape, data.len())?;
        match device {
            Device::Cpu => Ok(Self {
                shape,
                dtype: DType::F16,
                storage: Storage::HostF16(Arc::new(data)),
            }),
            Device::Gpu(ctx) => Self::upload(ctx, shape, DType::F16, bytemuck::cast_slice(&data)),
        }
    }

    /// An f16 tensor of host f32 values rounded to nearest, as
    /// `half::f16::from_f32` rounds them, saturating: beyond +-65504 (infinities
    /// too) gives +-65504, NaN stays NaN, as every f32 -> f16 conversion of
    /// aether. On a GPU they are converted straight into
    /// the upload's staging memory: half the bytes of an f32 upload.
    pub fn from_f32_as_f16(
        dims: impl Into<Vec<usize>>,
        data: &[f32],
        device: &Device,
    ) -> Result<Self> {
        let shape = Shape::new(dims)?;
        check_len(&shape, data.len())?;
        let Device::Gpu(ctx) = device else {
            let rounded = data
                .iter()
                .map(|&v| f16::from_f32(crate::conv::clip_f16_range(v)))
                .collect();
            return Self::from_f16(shape.dims().to_vec(), rounded, device);
        };
        Self::upload_with(ctx, shape, DType::F16, |dst| {
            write_f32s(dst, &in_jobs(data), DType::F16)
        })
    }

    /// The rows `rows` of `x` (a host array of `x.len() / row_len` rows of
    /// `row_len` values), in that order, as one tensor of shape `dims`
    /// (`dims[0] == rows.len()`), stored as `dtype`: F32, or F16 rounded to
    /// nearest as `half::f16::from_f32` rounds, saturating at +-65504 (see
    /// [`Tensor::from_f32_as_f16`]). This is how a shuffled batch
    /// goes to a GPU: each row straight into the upload's staging memory, no
    /// gathered copy on the host.
    pub fn from_f32_rows(
        dims: impl Into<Vec<usize>>,
        x: &[f32],
        rows: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shape = Shape::new(dims)?;
        let invalid = |reason: String| AetherError::InvalidShape {
            op: "Tensor::from_f32_rows",
            shape: shape.dims().to_vec(),
            reason,
        };
        if shape.dims()[0] != rows.len() {
            return Err(invalid(format!(
                "{} rows for its first dimension",
                rows.len()
            )));
        }
        if dtype == DType::U32 {
            return Err(invalid("U32 is not a float type".into()));
        }
        let row_len = shape.numel() / rows.len();
        let available = x.len() / row_len;
        if let Some(&bad) = rows.iter().find(|&&r| r >= available) {
            return Err(invalid(format!(
                "row {bad} of an array of {available} rows of {row_len} values ({} values)",
                x.len()
            )));
        }
        let sources: Vec<&[f32]> = rows
            .iter()
            .map(|&r| &x[r * row_len..(r + 1) * row_len])
            .collect();
        match device {
            Device::Gpu(ctx) => {
                Self::upload_with(ctx, shape, dtype, |dst| write_f32s(dst, &sources, dtype))
            }
            Device::Cpu => {
                let data = sources.concat();
                match dtype {
                    DType::F16 => Self::from_f32_as_f16(shape.dims().to_vec(), &data, device),
                    _ => Self::from_f32(shape.dims().to_vec(), data, device),
                }
            }
        }
    }

    /// A u32 tensor from host data, placed on `device`.
    pub fn from_u32(dims: impl Into<Vec<usize>>, data: Vec<u32>, device: &Device) -> Result<Self> {
        let shape = Shape::new(dims)?;
        check_len(&shape, data.len())?;
        match device {
            Device::Cpu => Ok(Self {
                shape,
                dtype: DType::U32,
                storage: Storage::HostU32(Arc::new(data)),
            }),
            Device::Gpu(ctx) => Self::upload(ctx, shape, DType::U32, bytemuck::cast_slice(&data)),
        }
    }

    fn upload(ctx: &Arc<GpuContext>, shape: Shape, dtype: DType, bytes: &[u8]) -> Result<Self> {
        Self::upload_with(ctx, shape, dtype, |mut dst| dst.copy_from_slice(bytes))
    }

    /// A new GPU tensor whose bytes `fill` writes into the upload's staging
    /// memory. wgpu copies whole 4-byte words, so an odd count of f16 values
    /// gets one zero f16 of padding, which the buffer (sized in 256-byte
    /// granules) has room for.
    fn upload_with(
        ctx: &Arc<GpuContext>,
        shape: Shape,
        dtype: DType,
        fill: impl FnOnce(wgpu::WriteOnly<'_, [u8]>),
    ) -> Result<Self> {
        let bytes = shape.numel() * dtype.size_bytes();
        let tensor = Self::uninit_gpu(ctx, shape, dtype)?;
        let padded = bytes.next_multiple_of(4);
        ctx.upload_with(
            tensor.gpu_slice().expect("GPU tensor"),
            padded as u64,
            |mut dst| {
                fill(dst.slice(..bytes));
                dst.slice(bytes..).fill(0);
            },
        );
        Ok(tensor)
    }

    /// A GPU tensor whose contents a kernel is about to write. A size over the
    /// device's limits is [`AetherError::TooLarge`]; an allocation the device
    /// refuses (caught in a wgpu error scope) is [`AetherError::Allocation`].
    pub(crate) fn uninit_gpu(ctx: &Arc<GpuContext>, shape: Shape, dtype: DType) -> Result<Self> {
        Self::uninit_gpu_from(ctx, shape, dtype, true)
    }

    /// [`Tensor::uninit_gpu`] in a new buffer, never a recycled one: for a
    /// tensor made once in the middle of a pass and kept across calls (a
    /// layer's f16 weight shadow). Taking a free buffer would leave the next
    /// call's transient tensors a different free list, so they would meet
    /// different buffers and build new bind groups once more.
    pub(crate) fn uninit_gpu_kept(
        ctx: &Arc<GpuContext>,
        shape: Shape,
        dtype: DType,
    ) -> Result<Self> {
        Self::uninit_gpu_from(ctx, shape, dtype, false)
    }

    fn uninit_gpu_from(
        ctx: &Arc<GpuContext>,
        shape: Shape,
        dtype: DType,
        recycle: bool,
    ) -> Result<Self> {
        let what = || format!("tensor of shape {:?} ({dtype:?})", shape.dims());
        // Past u64 (only for shapes near usize::MAX) is past every limit.
        let bytes = shape
            .numel()
            .checked_mul(dtype.size_bytes())
            .map_or(u64::MAX, |b| b as u64);
        let limit = ctx.caps().max_tensor_bytes();
        if bytes > limit {
            return Err(AetherError::TooLarge {
                what: what(),
                bytes,
                limit,
            });
        }
        ctx.check_faults("allocation")?;
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        // A recycled buffer cannot fail: error scopes only around a new one.
        let recycled = if recycle {
            ctx.pool().recycle(bytes, usage)
        } else {
            None
        };
        let buffer = match recycled {
            Some(buffer) => buffer,
            None => new_buffer(ctx, bytes, usage, what)?,
        };
        let size = buffer.size();
        Ok(Self {
            shape,
            dtype,
            storage: Storage::Gpu(GpuRange {
                storage: Arc::new(GpuStorage {
                    ctx: Arc::clone(ctx),
                    buffer,
                }),
                offset: 0,
                size,
            }),
        })
    }

    /// One new GPU buffer holding `dtype` tensors of `shapes` end to end, at the
    /// element offsets of [`view_offsets`]: the whole buffer as a flat tensor,
    /// and a view of each segment. The views share the buffer: a kernel writing
    /// the flat tensor changes them.
    pub(crate) fn gpu_views(
        ctx: &Arc<GpuContext>,
        shapes: &[Shape],
        dtype: DType,
    ) -> Result<(Self, Vec<Self>)> {
        let offsets = view_offsets(ctx, shapes);
        let total = offsets.last().copied().unwrap_or(0);
        let flat = Self::uninit_gpu(ctx, Shape::new([total])?, dtype)?;
        let bytes = |elements: usize| (elements * dtype.size_bytes()) as u64;
        let Storage::Gpu(range) = &flat.storage else {
            unreachable!("uninit_gpu gives GPU storage")
        };
        let views = shapes
            .iter()
            .zip(offsets.windows(2))
            .map(|(shape, ends)| Self {
                shape: shape.clone(),
                dtype,
                storage: Storage::Gpu(GpuRange {
                    storage: Arc::clone(&range.storage),
                    offset: bytes(ends[0]),
                    size: bytes(ends[1] - ends[0]),
                }),
            })
            .collect();
        Ok((flat, views))
    }

    /// Whether this is the view of `flat`'s buffer at byte `offset` (see
    /// [`Self::gpu_views`]).
    pub(crate) fn is_view_at(&self, flat: &Tensor, offset: u64) -> bool {
        match (&self.storage, &flat.storage) {
            (Storage::Gpu(view), Storage::Gpu(whole)) => {
                Arc::ptr_eq(&view.storage, &whole.storage) && view.offset == offset
            }
            _ => false,
        }
    }

    /// The same data under another shape with the same element count (no copy).
    pub fn reshape(&self, dims: impl Into<Vec<usize>>) -> Result<Self> {
        let shape = Shape::new(dims)?;
        check_len(&shape, self.numel())?;
        Ok(Self {
            shape,
            dtype: self.dtype,
            storage: self.storage.clone(),
        })
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        match &self.storage {
            Storage::HostF32(_) | Storage::HostF16(_) | Storage::HostU32(_) => Device::Cpu,
            Storage::Gpu(g) => Device::Gpu(Arc::clone(&g.storage.ctx)),
        }
    }

    /// The GPU buffer holding this tensor, for an app that renders from it or
    /// runs its own kernels on it; `None` on the CPU path. Work aether has
    /// recorded is submitted first, so commands the app submits afterwards on
    /// the same queue see the values.
    ///
    /// Layout: the tensor's elements row-major over its dims (NHWC for images,
    /// `[n, classes]` for a model's outputs), packed with no padding, from
    /// [`TensorBuffer::offset`] for [`TensorBuffer::bytes`] bytes; each element
    /// little-endian [`DType::F32`] (`f32` in WGSL), [`DType::F16`] (`f16`,
    /// two a word) or [`DType::U32`]. The buffer has `STORAGE | COPY_SRC |
    /// COPY_DST` usage and may be larger than the tensor.
    ///
    /// Tensors are immutable: the app reads the buffer, never writes it. It
    /// must keep the tensor (or a clone) alive until its commands reading the
    /// buffer are done, since a dropped tensor's buffer goes back to aether's
    /// pool and is reused for the next tensor.
    pub fn gpu_buffer(&self) -> Option<TensorBuffer<'_>> {
        let Storage::Gpu(range) = &self.storage else {
            return None;
        };
        range.storage.ctx.flush();
        Some(TensorBuffer {
            buffer: range.storage.buffer.buffer(),
            offset: range.offset,
            bytes: self.byte_len(),
        })
    }

    /// The values as f32 on the host (f16 storage is widened exactly); an error
    /// for u32 tensors.
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        match &self.storage {
            Storage::HostU32(_) => Err(self.wrong_dtype("Tensor::to_vec_f32")),
            Storage::HostF32(v) => Ok(v.to_vec()),
            Storage::HostF16(v) => Ok(v.iter().map(|x| x.to_f32()).collect()),
            Storage::Gpu(g) => {
                let bytes = g.storage.ctx.read_bytes(g.slice(), self.byte_len())?;
                match self.dtype {
                    DType::F32 => Ok(bytemuck::pod_collect_to_vec(&bytes)),
                    DType::F16 => Ok(bytemuck::pod_collect_to_vec::<u8, f16>(&bytes)
                        .into_iter()
                        .map(f16::to_f32)
                        .collect()),
                    DType::U32 => Err(self.wrong_dtype("Tensor::to_vec_f32")),
                }
            }
        }
    }

    /// Appends the values as f32 to `out` (f16 widened exactly), reusing its
    /// memory: with enough capacity, reading back allocates nothing on the
    /// host. An error for u32 tensors.
    pub fn read_f32_into(&self, out: &mut Vec<f32>) -> Result<()> {
        match (&self.storage, self.dtype) {
            (Storage::HostU32(_), _) | (_, DType::U32) => {
                Err(self.wrong_dtype("Tensor::read_f32_into"))
            }
            (Storage::HostF32(v), _) => {
                out.extend_from_slice(v);
                Ok(())
            }
            (Storage::HostF16(v), _) => {
                out.extend(v.iter().map(|x| x.to_f32()));
                Ok(())
            }
            (Storage::Gpu(g), dtype) => {
                g.storage
                    .ctx
                    .read_bytes_with(g.slice(), self.byte_len(), |bytes| match dtype {
                        DType::F16 => out.extend(
                            bytes
                                .chunks_exact(2)
                                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
                        ),
                        _ => out.extend(
                            bytes
                                .chunks_exact(4)
                                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                        ),
                    })
            }
        }
    }

    /// The raw f16 values of an f16 tensor; an error for other dtypes.
    pub fn to_vec_f16(&self) -> Result<Vec<f16>> {
        match (&self.storage, self.dtype) {
            (Storage::HostF16(v), _) => Ok(v.to_vec()),
            (Storage::Gpu(g), DType::F16) => {
                let bytes = g.storage.ctx.read_bytes(g.slice(), self.byte_len())?;
                Ok(bytemuck::pod_collect_to_vec(&bytes))
            }
            _ => Err(self.wrong_dtype("Tensor::to_vec_f16")),
        }
    }

    /// The values of a u32 tensor; an error for other dtypes.
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        match (&self.storage, self.dtype) {
            (Storage::HostU32(v), _) => Ok(v.to_vec()),
            (Storage::Gpu(g), DType::U32) => {
                let bytes = g.storage.ctx.read_bytes(g.slice(), self.byte_len())?;
                Ok(bytemuck::pod_collect_to_vec(&bytes))
            }
            _ => Err(self.wrong_dtype("Tensor::to_vec_u32")),
        }
    }

    /// `Ok` when the tensor holds `dtype`, else a typed error naming `op`.
    pub(crate) fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype == dtype {
            Ok(())
        } else {
            Err(AetherError::InvalidShape {
                op,
                shape: self.dims().to_vec(),
                reason: format!("expected {dtype:?}, got {:?}", self.dtype),
            })
        }
    }

    /// Checks that this tensor can take a kernel's f32 output of `dims` computed
    /// from `input`: a GPU tensor on `input`'s device, F32, with exactly `dims`.
    pub(crate) fn expect_output_for(
        &self,
        op: &'static str,
        dims: &[usize],
        input: &Tensor,
    ) -> Result<()> {
        self.expect_dtype(op, DType::F32)?;
        if self.dims() != dims {
            return Err(AetherError::ShapeMismatch {
                op,
                expected: dims.to_vec(),
                actual: self.dims().to_vec(),
            });
        }
        if self.gpu_context().is_none() || !self.device().same_as(&input.device()) {
            return Err(AetherError::DeviceMismatch {
                op,
                a: input.device().name(),
                b: self.device().name(),
            });
        }
        Ok(())
    }

    fn wrong_dtype(&self, op: &'static str) -> AetherError {
        AetherError::InvalidShape {
            op,
            shape: self.dims().to_vec(),
            reason: format!("tensor holds {:?}", self.dtype),
        }
    }

    /// This tensor on `device` (a cheap clone when it is already there).
    pub fn to(&self, device: &Device) -> Result<Self> {
        if self.device().same_as(device) {
            return Ok(self.clone());
        }
        match self.dtype {
            DType::F32 => Self::from_f32(self.dims().to_vec(), self.to_vec_f32()?, device),
            DType::F16 => Self::from_f16(self.dims().to_vec(), self.to_vec_f16()?, device),
            DType::U32 => Self::from_u32(self.dims().to_vec(), self.to_vec_u32()?, device),
        }
    }

    fn byte_len(&self) -> u64 {
        (self.numel() * self.dtype.size_bytes()) as u64
    }

    /// Host f32 data, when this is an f32 tensor on the CPU.
    pub(crate) fn host_f32(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::HostF32(v) => Some(v),
            _ => None,
        }
    }

    /// Host u32 data, when this is a u32 tensor on the CPU.
    pub(crate) fn host_u32(&self) -> Option<&[u32]> {
        match &self.storage {
            Storage::HostU32(v) => Some(v),
            _ => None,
        }
    }

    /// The slice of a GPU buffer this tensor occupies, when it lives on a GPU.
    pub(crate) fn gpu_slice(&self) -> Option<GpuSlice<'_>> {
        match &self.storage {
            Storage::Gpu(g) => Some(g.slice()),
            _ => None,
        }
    }

    /// The GPU context, when this tensor lives on a GPU.
    pub(crate) fn gpu_context(&self) -> Option<&Arc<GpuContext>> {
        match &self.storage {
            Storage::Gpu(g) => Some(&g.storage.ctx),
            _ => None,
        }
    }
}

/// Element offsets of tensors of `shapes` packed end to end, then the total.
/// Each segment is rounded up so that, in f16 and in f32 alike, every offset
/// is a multiple of 256 bytes (the pool's granule) and of the adapter's
/// storage-binding offset alignment.
pub(crate) fn view_offsets(ctx: &GpuContext, shapes: &[Shape]) -> Vec<usize> {
    let align = (ctx.caps().limits.min_storage_buffer_offset_alignment as usize).max(256);
    packed_offsets(
        shapes.iter().map(Shape::numel),
        align / DType::F16.size_bytes(),
    )
}

/// Element offsets of segments of `lengths` elements packed end to end, each
/// rounded up to a multiple of `unit` elements, then the total.
pub(crate) fn packed_offsets(lengths: impl IntoIterator<Item = usize>, unit: usize) -> Vec<usize> {
    let mut offsets = vec![0];
    for len in lengths {
        let end = offsets.last().copied().unwrap_or(0) + len.div_ceil(unit) * unit;
        offsets.push(end);
    }
    offsets
}

/// A new pooled buffer inside error scopes, so a refused or failed allocation is
/// an `AetherError::Allocation` naming `what`, not a device error later.
fn new_buffer(
    ctx: &GpuContext,
    bytes: u64,
    usage: wgpu::BufferUsages,
    what: impl FnOnce() -> String,
) -> Result<PooledBuffer> {
    let out_of_memory = ctx
        .device()
        .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let refused = ctx.device().push_error_scope(wgpu::ErrorFilter::Validation);
    let buffer = ctx.pool().create(ctx.device(), bytes, usage);
    let refused = pollster::block_on(refused.pop());
    if let Some(error) = pollster::block_on(out_of_memory.pop()).or(refused) {
        // wgpu hands back an invalid buffer; in the pool it would be given to
        // the next request of this size, so its (small) handle is leaked instead.
        std::mem::forget(buffer);
        return Err(AetherError::Allocation {
            what: what(),
            bytes,
            message: error.to_string(),
        });
    }
    Ok(buffer)
}
