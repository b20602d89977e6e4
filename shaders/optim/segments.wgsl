// The packed-parameter segment table shared by the optimizer kernels: one
// entry per parameter tensor, sorted by start. Each kernel declares the
// `segments` storage binding; `segment_of` finds the entry holding element i.

struct Segment {
    start: u32,
    end: u32,
    l1: f32,
    l2: f32,
    decays: u32,
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

