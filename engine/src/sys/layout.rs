//! Fixed-size slots carved from one memory area, addressed by a
//! monotonically increasing position.
//!
//! Every byte range this hands out lies inside the area, for any position
//! (a `u64`, which may wrap): a position maps to its slot by a mask, and
//! `new` refuses any geometry whose bytes do not fit an `isize` — so a
//! slot's start and end never overflow, whatever the caller asked for.

use std::ops::Range;

use crate::config::bad_setting;
use crate::error::Result;

/// The geometry of a ring: `count` slots (a power of two) of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotLayout {
    size: usize,
    count: usize,
}

impl SlotLayout {
    /// `count` slots of `size` bytes, or why not: at least one slot of at
    /// least one byte, a power of two of them, and at most `isize::MAX`
    /// bytes in all (what one allocation may span).
    pub(crate) fn new(size: usize, count: usize) -> Result<SlotLayout> {
        let refuse = |why: &str| {
            Err(bad_setting(
                "slot_count",
                count,
                format!("(of {size}-byte slots) is refused: {why}"),
            ))
        };
        if !count.is_power_of_two() {
            return refuse("the slot count must be a power of two");
        }
        if size == 0 {
            return refuse("slots hold at least one byte");
        }
        match size.checked_mul(count) {
            Some(bytes) if isize::try_from(bytes).is_ok() => Ok(SlotLayout { size, count }),
            _ => refuse("more bytes than one mapping can hold"),
        }
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
        // Never wraps: `new` checked the product.
        self.size.wrapping_mul(self.count)
    }

    /// The slot position `pos` maps to (positions are modular: any `u64`).
    #[inline]
    pub(crate) fn slot(&self, pos: u64) -> usize {
        // Truncating `pos` keeps its low bits, which are all the mask keeps;
        // `count - 1` never wraps: `new` checked count is a power of two.
        pos as usize & self.count.wrapping_sub(1)
    }

    /// The byte range of the slot position `pos` maps to, holding `len`
    /// bytes, clamped to the slot (callers pass `len <= size`).
    #[inline]
    pub(crate) fn range(&self, pos: u64, len: usize) -> Range<usize> {
        debug_assert!(len <= self.size);
        // Neither wraps: slot < count, so start + size <= bytes, which
        // `new` checked fits an isize.
        let start = self.slot(pos).wrapping_mul(self.size);
        start..start.wrapping_add(len.min(self.size))
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    #[test]
    fn positions_wrap_onto_slots() {
        let l = SlotLayout::new(4096, 8).unwrap();
        assert_eq!(l.bytes(), 32768);
        assert_eq!(l.range(0, 1), 0..1);
        assert_eq!(l.range(7, 4096), 28672..32768);
        assert_eq!(l.range(8, 10), 0..10);
        assert_eq!(l.range(u64::MAX, 0), 28672..28672);
        assert_eq!(l.range(3, 10), 12288..12298);
    }

    #[test]
    fn every_range_lies_in_the_ring_at_the_integer_extremes() {
        let layouts = [
            SlotLayout::new(1, 1).unwrap(),
            SlotLayout::new(3, 4).unwrap(),
            SlotLayout::new(4096, 256).unwrap(),
            SlotLayout::new(1, 1 << 62).unwrap(),
            SlotLayout::new(isize::MAX as usize, 1).unwrap(),
            SlotLayout::new((isize::MAX as usize) >> 3, 8).unwrap(),
        ];
        let positions = [0, 1, u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1];
        for l in layouts {
            for pos in positions {
                for len in [0, 1, l.size() - 1, l.size(), usize::MAX] {
                    let r = l.range(pos, len.min(l.size()));
                    assert!(r.start <= r.end && r.end <= l.bytes(), "{l:?} {pos} {len}");
                    assert!(r.end - r.start <= l.size());
                    assert_eq!(r.start % l.size(), 0, "a slot's start");
                }
            }
        }
    }

    #[test]
    fn a_geometry_that_does_not_fit_is_refused_with_a_reason() {
        let refused = |size, count| SlotLayout::new(size, count).unwrap_err().to_string();
        assert!(refused(64, 6).contains("power of two"));
        assert!(refused(64, 0).contains("power of two"));
        assert!(refused(0, 4).contains("at least one byte"));
        for (size, count) in [
            (1 << 62, 4),
            (usize::MAX, 2),
            (2, 1 << 63),
            ((isize::MAX as usize) + 1, 1),
            (3, 1 << 62),
        ] {
            assert!(
                refused(size, count).contains("more bytes than one mapping can hold"),
                "{size} x {count}"
            );
        }
    }
}
