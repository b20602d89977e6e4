// The packed-parameter segment table shared by the optimizer kernels: one
// entry per parameter tensor, sorted by start, with the tensor's L1/L2
// coefficients and its parameter group's multipliers of the learning rate and
// of the weight decay (0 where no decay applies, as for BatchNorm by default).
// Each kernel declares the `segments` storage binding; `segment_of` finds the
// entry holding element i.

struct Segment {
    start: u32,
    end: u32,
    l1: f32,
    l2: f32,
    decay: f32,
    lr: f32,
}

fn segment_of(i: u32, count: u32) -> Segment {
    var lo = 0u;
    var hi = count;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (segments[mid].start <= i) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return segments[lo];
}

