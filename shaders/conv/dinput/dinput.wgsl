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

// One spatial dimension of a residue class.
struct Axis {
    first_in: u32,   // first input coordinate of the class
    count_in: u32,   // input coordinates in the class
    first_tap: u32,  // first filter tap that reaches the class
    tap_step: u32,
    count_tap: u32,
}

fn axis(q: u32, size: u32, pad: u32, stride: u32, dil: u32, taps: u32) -> Axis {
    var a: Axis;
    a.first_in = (q + stride - pad % stride) % stride;
    a.count_in = select(0u, (size - a.first_in + stride - 1u) / stride, a.first_in < size);
    // Smallest step p > 0 with p * dil == 0 (mod stride): stride / gcd(dil, stride).
    a.tap_step = stride;
    for (var p = 1u; p < stride; p++) {
        if ((p * dil) % stride == 0u) {
            a.tap_step = p;
            break;
        }
    }
    a.first_tap = taps;
    for (var t = 0u; t < min(taps, a.tap_step); t++) {
        if ((t * dil) % stride == q) {
            a.first_tap = t;
            break;
        }
    }
    a.count_tap = select(0u, (taps - 1u - a.first_tap) / a.tap_step + 1u, a.first_tap < taps);
    return a;
}

fn axis_h(z: u32) -> Axis {
    return axis(z / STRIDE_W, H, PAD_TOP, STRIDE_H, DIL_H, R);
}

fn axis_w(z: u32) -> Axis {
    return axis(z % STRIDE_W, W, PAD_LEFT, STRIDE_W, DIL_W, S);
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
    let ah = axis_h(z);
    let aw = axis_w(z);
    let iw = row % aw.count_in;
    let ih = (row / aw.count_in) % ah.count_in;
    let n = row / (aw.count_in * ah.count_in);
    return vec3<u32>(n, ah.first_in + ih * STRIDE_H, aw.first_in + iw * STRIDE_W);
}

// Filter tap (r, s) and output channel of a reduction index.
fn class_tap(z: u32, red: u32) -> vec3<u32> {
    let ah = axis_h(z);
    let aw = axis_w(z);
    let co = red % C_OUT;
    let js = (red / C_OUT) % aw.count_tap;
    let jr = red / (C_OUT * aw.count_tap);
    return vec3<u32>(ah.first_tap + jr * ah.tap_step, aw.first_tap + js * aw.tap_step, co);
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
