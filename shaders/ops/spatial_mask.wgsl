// Spatial-dropout masks drawn once per workgroup: the mask of map (image) n and
// channel c is draw n * C + c of the Philox contract in src/ops/dropout.rs, the
// same for every pixel of the map, so a workgroup draws those of the maps its
// invocations touch into workgroup memory (each once) rather than every
// invocation drawing its own. Prepended after philox.wgsl.

struct MaskDraws {
    threshold: u32,
    scale: f32,
    key: vec2<u32>,
    step: u32,
    stream: u32,
}

// The global index of the first of a 256-invocation workgroup's
// invocations, on a grid folded into rows of `row_stride` invocations.
fn first_invocation(wid: vec3<u32>, row_stride: u32) -> u32 {
    return (wid.x + wid.y * (row_stride / 256u)) * 256u;
}

const MASK_TABLE: u32 = 1024u;
var<workgroup> mask_table: array<f32, MASK_TABLE>;

// The mask value of draw number `draw`: 0 when dropped, else the scale.
fn draw_mask(d: MaskDraws, draw: u32) -> f32 {
    if (d.threshold == 0u) {
        return d.scale;
    }
    let bits = philox_lane0(vec4<u32>(draw, d.step, d.stream, 0u), d.key);
    return select(d.scale, 0.0, bits < d.threshold);
}

// Draws maps first_map..=last_map's masks (`channels` each) into the table
// where they fit, and says whether they did. Every invocation of the workgroup
// (`lane` its local index of 256) calls it from uniform control flow; a
// workgroupBarrier() must follow before `table_mask` reads the table.
fn fill_mask_table(d: MaskDraws, first_map: u32, last_map: u32, channels: u32, lane: u32) -> bool {
    let draws = (last_map - first_map + 1u) * channels;
    if (draws > MASK_TABLE) {
        return false;
    }
    for (var j = lane; j < draws; j += 256u) {
        mask_table[j] = draw_mask(d, first_map * channels + j);
    }
    return true;
}

// The mask of (map, c): from the table where `fill_mask_table` said it fits.
fn table_mask(d: MaskDraws, tabled: bool, first_map: u32, map: u32, c: u32, channels: u32) -> f32 {
    if (tabled) {
        return mask_table[(map - first_map) * channels + c];
    }
    return draw_mask(d, map * channels + c);
}
