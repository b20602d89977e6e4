// out[0] = sum of values[0..len] added strictly in index order by one invocation:
// the last pass of a deterministic reduction. One dispatch adds values
// [first, end) to the total so far in out[0] (0 for the first), so no
// invocation loops more than lavapipe's 65535 iterations.

@group(0) @binding(0) var<storage, read> values: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

struct Params {
    first: u32,
    end: u32,
}
@group(0) @binding(2) var<uniform> sizes: Params;

@compute @workgroup_size(1)
fn main() {
    var total = 0.0;
    if (sizes.first > 0u) {
        total = out[0];
    }
    for (var i = sizes.first; i < sizes.end; i++) {
        total += values[i];
    }
    out[0] = total;
}
