// Lookahead of the weights over the packed parameters (airbench's
// LookaheadState.update): ema = lerp(ema, p, weight) with weight = 1 - decay,
// as torch.lerp computes it, then p = ema. Gaps between segments belong to
// no parameter and are left alone; a closed gate (a non-finite step, see
// finite_check.wgsl) changes nothing. Entry points: lookahead_main.wgsl, and
// lookahead_f16.wgsl, which also writes the parameters' f16 mirror as the
// update does.

@group(0) @binding(0) var<storage, read_write> params: array<f32>;
@group(0) @binding(1) var<storage, read_write> ema: array<f32>;
@group(0) @binding(2) var<storage, read> segments: array<Segment>;
@group(0) @binding(3) var<storage, read> gate: array<u32>;

struct Lookahead {
    len: u32,
    row_stride: u32,
    segment_count: u32,
    weight: f32,
}

// The new value of element i, or none (a gap, or the gate is closed).
fn lookahead(i: u32) -> bool {
    if (gate[0] != 0xffffffffu) {
        return false;
    }
    let seg = segment_of(i, step.segment_count);
    if (i >= seg.end) {
        return false;
    }
    let start = ema[i];
    let end = params[i];
    var e: f32;
    if (step.weight < 0.5) {
        e = start + step.weight * (end - start);
    } else {
        e = end - (end - start) * (1.0 - step.weight);
    }
    ema[i] = e;
    params[i] = e;
    return true;
}
