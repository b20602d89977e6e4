//! Workgroup grids for kernels over a flat range of elements.

/// A grid covering `len` elements at `per_workgroup` each, folded into x and y so
/// no dimension exceeds `max_per_dim`. Returns the grid and the row stride in
/// elements: the kernel's flat index is `gid.x + gid.y * row_stride`.
pub fn flat_grid(len: usize, per_workgroup: u32, max_per_dim: u32) -> ([u32; 3], u32) {
    let groups = len.div_ceil(per_workgroup as usize).max(1);
    let x = groups.min(max_per_dim as usize);
    let y = groups.div_ceil(x);
    ([x as u32, y as u32, 1], x as u32 * per_workgroup)
}

#[cfg(test)]
mod tests {
    use super::flat_grid;

    #[test]
    fn grid_covers_every_element_within_limits() {
        for (len, per, max) in [
            (1, 256, 65535),
            (1000, 64, 7),
            (65535 * 256 + 1, 256, 65535),
        ] {
            let ([x, y, z], stride) = flat_grid(len, per, max);
            assert!(x <= max && y <= max && z == 1);
            assert_eq!(stride, x * per);
            assert!((x as usize * y as usize * per as usize) >= len);
            // The last row is needed: one fewer row would not cover `len`.
            assert!(((y as usize - 1) * stride as usize) < len);
        }
    }
}
