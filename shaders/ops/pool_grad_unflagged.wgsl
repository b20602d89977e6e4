// A pool backward that flags no saturation (see pool_grad_flag.wgsl): its dx
// is f32, or f16 whose saturation the model checks itself.

@group(0) @binding(3) var<uniform> params: Params;

fn flag_saturation(halves: vec4<u32>) {}
