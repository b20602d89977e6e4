// The loss scaler's step, after the optimizer's update (one invocation), as
// PyTorch's GradScaler.update: where this step overflowed (a non-finite
// gradient from finite_check.wgsl, or an output gradient at f16's limit from
// saturation_check.wgsl) a dynamic scale halves and the growth count restarts;
// a static scale, or a dynamic one already at 1, closes the gate instead (no
// smaller scale can help, so training stops as it would without scaling).
// Where it did not, the count grows and the scale doubles after
// `growth_interval` such steps in a row. A closed gate freezes the scaler
// with everything else. The overflow flag is cleared for the next step.

// [scale as f32 bits, steps since the last overflow or growth, overflow flag, 0]
@group(0) @binding(0) var<storage, read_write> scaler: array<u32>;
@group(0) @binding(1) var<storage, read_write> gate: array<atomic<u32>>;

struct Update {
    step: u32,
    growth_interval: u32,
    dynamic: u32,
    max_scale: f32,
}
@group(0) @binding(2) var<uniform> update: Update;

@compute @workgroup_size(1)
fn main() {
    let overflow = scaler[2] != 0u;
    scaler[2] = 0u;
    if (atomicLoad(&gate[0]) != 0xffffffffu) {
        return;
    }
    var scale = bitcast<f32>(scaler[0]);
    if (overflow) {
        if (update.dynamic == 1u && scale > 1.0) {
            scale = scale * 0.5;
        } else {
            atomicMin(&gate[0], update.step);
        }
        scaler[1] = 0u;
    } else if (update.dynamic == 1u) {
        let good = scaler[1] + 1u;
        if (good >= update.growth_interval) {
            scale = min(scale * 2.0, update.max_scale);
            scaler[1] = 0u;
        } else {
            scaler[1] = good;
        }
    }
    scaler[0] = bitcast<u32>(scale);
}
