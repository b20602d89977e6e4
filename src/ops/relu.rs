//! ReLU, on the CPU and the GPU.

use rayon::prelude::*;

use crate::error::Result;
use crate::gpu::{PipelineKey, flat_grid};
use crate::tensor::{DType, Tensor};

const SHADER: &str = concat!(
    include_str!("../../shaders/ops/relu_bits.wgsl"),
    include_str!("../../shaders/ops/relu.wgsl")
);
const WORKGROUP: u32 = 256;

/// `max(x, 0)` elementwise; NaN passes through. `x` must be f32.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    x.expect_dtype("relu", DType::F32)?;
    if let Some(data) = x.host_f32() {
        let out = data
            .par_iter()
            .map(|&v| if v < 0.0 { 0.0 } else { v })
            .collect();
        return Tensor::from_f32(x.dims().to_vec(), out, &x.device());
    }
    super::require_u32_elements("relu", x)?;
    let ctx = x.gpu_context().expect("non-host tensor is on a GPU");
    let pipeline =
        ctx.pipelines()
            .require(&PipelineKey::new("relu", "portable"), "main", || {
                SHADER.into()
            })?;
    let y = Tensor::uninit_gpu(ctx, x.shape().clone(), DType::F32)?;
    let len = x.numel();
    let (grid, row_stride) = flat_grid(
        len,
        WORKGROUP,
        ctx.caps().limits.max_compute_workgroups_per_dimension,
    );
    let params = [len as u32, row_stride];
    ctx.dispatch(
        "relu",
        &pipeline,
        &[x.gpu_slice().expect("GPU"), y.gpu_slice().expect("GPU")],
        bytemuck::cast_slice(&params),
        grid,
    )?;
    Ok(y)
}
