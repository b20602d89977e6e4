// Backward dx's gradient through a fused ReLU, or through nothing: binding 1
// holds ReLU's output, and dy passes where it does (on its bits, as
// relu_backward: NaN does not pass). Without ReLU it is bound to dy, not read.
// batchnorm_dx_through_smooth.wgsl is the GELU and SiLU version.

@group(0) @binding(1) var<storage, read> relu_y: array<ActBits>;

fn through_activation(g: Lanes, i: u32, c: u32, xhat: Lanes) -> Lanes {
    if (params.activation == ACTIVATION_RELU) {
        return select(Lanes(0.0), g, act_passes(relu_y[i]));
    }
    return g;
}
