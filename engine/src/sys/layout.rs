//! Fixed-size slots carved from one memory area, addressed by a
//! monotonically increasing position.

use std::ops::Range;

/// The geometry of a ring: `count` slots (a power of two) of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotLayout {
    size: usize,
    count: usize,
}

impl SlotLayout {
    pub(crate) fn new(size: usize, count: usize) -> SlotLayout {
        assert!(
            count.is_power_of_two(),
            "slot count {count} must be a power of two"
        );
        assert!(size > 0, "slots hold at least one byte");
        SlotLayout { size, count }
    }

    #[inline]
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    #[inline]
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Bytes of the whole ring.
    pub(crate) fn bytes(&self) -> usize {
        self.size * self.count
    }

    /// The slot position `pos` maps to.
    #[inline]
    pub(crate) fn slot(&self, pos: u64) -> usize {
        pos as usize & (self.count - 1)
    }

    /// The byte range of the slot position `pos` maps to, holding `len`
    /// bytes (`len <= size`).
    #[inline]
    pub(crate) fn range(&self, pos: u64, len: usize) -> Range<usize> {
        debug_assert!(len <= self.size);
        let start = self.slot(pos) * self.size;
        start..start + len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_wrap_onto_slots() {
        let l = SlotLayout::new(4096, 8);
        assert_eq!(l.bytes(), 32768);
        assert_eq!(l.range(0, 1), 0..1);
        assert_eq!(l.range(7, 4096), 28672..32768);
        assert_eq!(l.range(8, 10), 0..10);
        assert_eq!(l.range(u64::MAX, 0), 28672..28672);
        assert_eq!(l.range(3, 10), 12288..12298);
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn a_non_power_of_two_count_is_refused() {
        SlotLayout::new(64, 6);
    }
}
