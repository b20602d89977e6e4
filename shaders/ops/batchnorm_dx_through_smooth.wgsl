// Backward dx's gradient through a fused GELU or SiLU: dy times the slope at
// normalize's output, recomputed from xhat as normalize computes it (times
// gamma, plus beta) instead of read back. Binding 1 holds beta, in the slot
// where batchnorm_dx_through_relu.wgsl binds ReLU's output, so the kernel
// binds no more buffers than the plain one.

@group(0) @binding(1) var<storage, read> beta: array<Lanes>;

fn through_activation(g: Lanes, i: u32, c: u32, xhat: Lanes) -> Lanes {
    return g * smooth_slope_lanes(xhat * gamma[c] + beta[c], params.activation);
}
