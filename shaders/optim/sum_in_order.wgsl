// out[0] = sum of values[0..len] added strictly in index order by one invocation:
// the last pass of a deterministic reduction (len is a few hundred partials).

@group(0) @binding(0) var<storage, read> values: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

struct Params {
    len: u32,
}
@group(0) @binding(2) var<uniform> sizes: Params;

@compute @workgroup_size(1)
fn main() {
    var total = 0.0;
    for (var i = 0u; i < sizes.len; i++) {
        total += values[i];
    }
    out[0] = total;
}
