// dinput as a gather, one residue class per z: input rows h with
// (h + PAD_TOP) % STRIDE_H == qh (likewise w) receive gradient only from the
// filter taps r with r * DIL_H == qh (mod STRIDE_H), so each class is a dense GEMM
// over its own taps. Every dX element is written exactly once: no atomics, no
// zero-fill.
//   rows: (n, h, w) of the class; cols: c_in; reduction: (tap r, tap s, c_out).

@group(0) @binding(0) var<storage, read> dy: array<dy_elem>;
@group(0) @binding(1) var<storage, read> w: array<w_elem>;
@group(0) @binding(2) var<storage, read_write> dx: array<f32>;

struct Params {
    n: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

// One spatial dimension of a residue class: a function of the slice z and
// the shape's constants, uniform over the workgroup.
struct Axis {
    first_in: u32,   // first input coordinate of the class
    count_in: u32,   // input coordinates in the class
    first_tap: u32,  // first filter tap that reaches the class
    count_tap: u32,
}

// Smallest step p > 0 with p * dil == 0 (mod stride): stride / gcd(dil, stride).
// A function of the shape's constants only, so the compiler folds it.
fn tap_step(stride: u32, dil: u32) -> u32 {
    for (var p = 1u; p < stride; p++) {
        if ((p * dil) % stride == 0u) {
            return p;
        }
    }
    return stride;
}

fn axis(q: u32, size: u32, pad: u32, stride: u32, dil: u32, taps: u32) -> Axis {
    var a: Axis;
    a.first_in = (q + stride - pad % stride) % stride;
    a.count_in = select(0u, (size - a.first_in + stride - 1u) / stride, a.first_in < size);
    let step = tap_step(stride, dil);
    a.first_tap = taps;
    for (var t = 0u; t < min(taps, step); t++) {
        if ((t * dil) % stride == q) {
            a.first_tap = t;
            break;
        }
    }
    a.count_tap = select(0u, (taps - 1u - a.first_tap) / step + 1u, a.first_tap < taps);
    return a;
}

fn axis_h(z: u32) -> Axis {
    return axis(z / STRIDE_W, H, PAD_TOP, STRIDE_H, DIL_H, R);
}

fn axis_w(z: u32) -> Axis {
    return axis(z % STRIDE_W, W, PAD_LEFT, STRIDE_W, DIL_W, S);
}

// (x / d, x % d) for a count d of a class: its input coordinates (`size`
// over the stride) or its taps a row (`size` taps over the tap step). A class
// has floor or ceil of size / step of them, or none, and a class with none
// is never split. Dividing by those two constants costs a few multiplies;
// dividing by d itself, a runtime division at every element. At step 1 (a
// stride-1 conv's one class, or taps whose dilation the stride divides) a
// class that is split has all `size`: no branch there, since stride-1
// dinputs on the GEMM core ran 7-17% slower with it (docs/lab/perf-notes.md,
// entries 89 and 97).
fn split_by_count(x: u32, d: u32, size: u32, step: u32) -> vec2<u32> {
    if (step == 1u) {
        return vec2<u32>(x / size, x % size);
    }
    let hi = (size + step - 1u) / step;
    if (d == hi) {
        return vec2<u32>(x / hi, x % hi);
    }
    let lo = max(size / step, 1u);
    return vec2<u32>(x / lo, x % lo);
}

fn gemm_rows(z: u32) -> u32 {
    return params.n * axis_h(z).count_in * axis_w(z).count_in;
}

fn gemm_cols() -> u32 {
    return C_IN;
}

fn reduction_range(z: u32) -> vec2<u32> {
    return vec2<u32>(0u, axis_h(z).count_tap * axis_w(z).count_tap * C_OUT);
}

// Input coordinates (n, h, w) of a class row.
fn class_position(z: u32, row: u32) -> vec3<u32> {
    let class_h = axis_h(z);
    let class_w = axis_w(z);
    let along_w = split_by_count(row, class_w.count_in, W, STRIDE_W);
    let along_h = split_by_count(along_w.x, class_h.count_in, H, STRIDE_H);
    return vec3<u32>(
        along_h.x,
        class_h.first_in + along_h.y * STRIDE_H,
        class_w.first_in + along_w.y * STRIDE_W,
    );
}

// Filter tap (r, s) and output channel of a reduction index.
fn class_tap(z: u32, red: u32) -> vec3<u32> {
    let class_h = axis_h(z);
    let class_w = axis_w(z);
    let step_h = tap_step(STRIDE_H, DIL_H);
    let step_w = tap_step(STRIDE_W, DIL_W);
    let tap = split_by_count(red / C_OUT, class_w.count_tap, S, step_w);
    return vec3<u32>(
        class_h.first_tap + tap.x * step_h,
        class_w.first_tap + tap.y * step_w,
        red % C_OUT,
    );
}

// Offset in `dy` of A's element (row, red), or -1 where no output position
// reaches it (padding or the output's edge).
fn dy_offset(z: u32, row: u32, red: u32) -> i32 {
    let p = class_position(z, row);
    let t = class_tap(z, red);
    let oh_num = i32(p.y + PAD_TOP) - i32(t.x * DIL_H);
    let ow_num = i32(p.z + PAD_LEFT) - i32(t.y * DIL_W);
    if (oh_num < 0 || ow_num < 0) {
        return -1;
    }
    let oh = u32(oh_num) / STRIDE_H;
    let ow = u32(ow_num) / STRIDE_W;
    if (oh >= H_OUT || ow >= W_OUT) {
        return -1;
    }
    return i32(((p.x * H_OUT + oh) * W_OUT + ow) * C_OUT + t.z);
}

fn load_a(z: u32, row: u32, red: u32) -> f32 {
    let offset = dy_offset(z, row, red);
    if (offset < 0) {
        return 0.0;
    }
    return dy_at(u32(offset));
}

fn w_offset(z: u32, red: u32, col: u32) -> u32 {
    let t = class_tap(z, red);
    return ((t.x * S + t.y) * C_IN + col) * C_OUT + t.z;
}

fn load_b(z: u32, red: u32, col: u32) -> f32 {
    return w_at(w_offset(z, red, col));
}

// Runs for the coop core: both operands along the reduction, whose fastest
// index is the output channel (C_OUT % 8 == 0 keeps a run inside one tap).
fn load_a_run(z: u32, row: u32, red: u32) -> Run {
    return dy_run(dy_offset(z, row, red));
}

fn load_b_run(z: u32, red: u32, col: u32) -> Run {
    return w_run(i32(w_offset(z, red, col)));
}

// Where C's element (row, col) lives in `dx`, and the stride between C's rows
// (the distance between consecutive class rows where the strides are 1).
fn c_index(z: u32, row: u32, col: u32) -> u32 {
    let p = class_position(z, row);
    return ((p.x * H + p.y) * W + p.z) * C_IN + col;
}

fn c_row_stride() -> u32 {
    return C_IN;
}

fn store_c(z: u32, row: u32, col: u32, v: f32) {
    dx[c_index(z, row, col)] = v;
}
