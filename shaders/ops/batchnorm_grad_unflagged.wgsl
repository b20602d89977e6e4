// Backward dx without a saturation flag (see batchnorm_grad_flag.wgsl): the
// model checks the gradient itself, or nothing rounds it.

@group(0) @binding(9) var<uniform> params: Params;

fn flag_saturation(b: GradBits) {}
