// Batch norm, variance pass 1: partials[chunk, c] = sum of (x[row, c] - mean[c])^2
// over the chunk's rows. Squared deviations from the already computed mean, not
// E[x^2] - E[x]^2, which cancels catastrophically when the data has an offset.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> mean: array<f32>;
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;
@group(0) @binding(3) var<uniform> params: ReduceParams;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let group = group_index(wid);
    if (group >= params.groups) {
        return;
    }
    let channel = (group % params.channel_tiles) * TILE_CHANNELS + lid.x;
    let chunk = group / params.channel_tiles;
    var sum = 0.0;
    if (channel < params.channels) {
        let m = mean[channel];
        let end = min((chunk + 1u) * params.chunk_rows, params.rows);
        for (var row = chunk * params.chunk_rows + lid.y; row < end; row += ROW_LANES) {
            let d = x[row * params.channels + channel] - m;
            sum += d * d;
        }
    }
    let total = reduce_lanes(lid, vec2(sum, 0.0));
    if (lid.y == 0u && channel < params.channels) {
        partials[chunk * params.channels + channel] = total.x;
    }
}
