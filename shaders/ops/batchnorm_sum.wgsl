// Batch norm, mean pass 1: partials[chunk, c] = sum of x[row, c] over the chunk's rows.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
@group(0) @binding(2) var<uniform> params: ReduceParams;

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
        let end = min((chunk + 1u) * params.chunk_rows, params.rows);
        for (var row = chunk * params.chunk_rows + lid.y; row < end; row += ROW_LANES) {
            sum += x[row * params.channels + channel];
        }
    }
    let total = reduce_lanes(lid, vec2(sum, 0.0));
    if (lid.y == 0u && channel < params.channels) {
        partials[chunk * params.channels + channel] = total.x;
    }
}
