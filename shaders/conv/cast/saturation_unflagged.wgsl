// The cast without a saturation flag (see saturation_flag.wgsl).

@group(0) @binding(2) var<uniform> params: Params;

fn flag_saturation(halves: vec4<u32>) {}
