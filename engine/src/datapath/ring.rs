//! Fixed-size slots carved from a registered region, addressed by a
//! monotonically increasing sequence number.

use std::ops::Range;

/// The geometry of a ring: `count` slots (a power of two) of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    size: usize,
    count: usize,
}

impl SlotLayout {
    pub fn new(size: usize, count: usize) -> SlotLayout {
        assert!(
            count.is_power_of_two(),
            "slot count {count} must be a power of two"
        );
        assert!(size > 0, "slots hold at least one byte");
        SlotLayout { size, count }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes of the whole ring.
    pub fn bytes(&self) -> usize {
        self.size * self.count
    }

    /// The slot a sequence number maps to.
    #[inline]
    pub fn slot(&self, seq: u64) -> usize {
        (seq as usize) & (self.count - 1)
    }

    /// The byte range of slot `slot` holding `len` bytes.
    #[inline]
    pub fn range(&self, slot: usize, len: usize) -> Range<usize> {
        debug_assert!(slot < self.count && len <= self.size);
        let start = slot * self.size;
        start..start + len
    }
}

/// Producer and consumer positions of a ring whose slots are claimed in
/// order and released in order. Positions only grow; the slot of a position
/// is `layout.slot(pos)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingCursor {
    pub head: u64,
    pub tail: u64,
}

impl RingCursor {
    /// Slots claimed and not yet released.
    #[inline]
    pub fn in_use(&self) -> u64 {
        self.head - self.tail
    }

    /// Claims the next slot, if one of `count` is free.
    #[inline]
    pub fn claim(&mut self, count: usize) -> Option<u64> {
        if self.in_use() >= count as u64 {
            return None;
        }
        let pos = self.head;
        self.head += 1;
        Some(pos)
    }

    /// Releases the oldest `n` claimed slots.
    #[inline]
    pub fn release(&mut self, n: u64) {
        debug_assert!(n <= self.in_use());
        self.tail += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_wrap_onto_slots() {
        let l = SlotLayout::new(4096, 8);
        assert_eq!(l.bytes(), 32768);
        assert_eq!(l.slot(0), 0);
        assert_eq!(l.slot(7), 7);
        assert_eq!(l.slot(8), 0);
        assert_eq!(l.slot(u64::MAX), 7);
        assert_eq!(l.range(3, 10), 12288..12298);
    }

    #[test]
    fn a_cursor_claims_at_most_count_slots_and_releases_in_order() {
        let mut c = RingCursor::default();
        let claimed: Vec<u64> = (0..4).map(|_| c.claim(4).unwrap()).collect();
        assert_eq!(claimed, [0, 1, 2, 3]);
        assert_eq!(c.claim(4), None);
        c.release(2);
        assert_eq!(c.in_use(), 2);
        assert_eq!(c.claim(4), Some(4));
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn a_non_power_of_two_count_is_refused() {
        SlotLayout::new(64, 6);
    }
}
