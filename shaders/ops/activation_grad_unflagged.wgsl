// An activation's f16 dx without a saturation flag (see
// activation_grad_flag.wgsl): no loss scaler asks for one.

@group(0) @binding(3) var<uniform> params: Params;

fn flag_saturation(words: vec4<u32>) {}
