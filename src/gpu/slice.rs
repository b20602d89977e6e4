//! A tensor's range of a GPU buffer, as kernels bind it and copies address it.

/// `size` bytes of `buffer` from `offset`. A tensor's slice is the whole pooled
/// buffer it owns, or a view's segment of a shared buffer (the optimizer's
/// packed parameters); either way its size is the tensor's bytes rounded up
/// to the pool's 256-byte granule, so a kernel that reads the tail as vectors
/// stays inside the binding.
#[derive(Clone, Copy, Debug)]
pub struct GpuSlice<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl<'a> GpuSlice<'a> {
    /// All of `buffer`.
    pub fn whole(buffer: &'a wgpu::Buffer) -> Self {
        Self {
            buffer,
            offset: 0,
            size: buffer.size(),
        }
    }

    pub(crate) fn binding(self) -> wgpu::BindingResource<'a> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: self.buffer,
            offset: self.offset,
            size: wgpu::BufferSize::new(self.size),
        })
    }
}
