//! The bytes of a ring of slots ([`super::handoff`]): one mmap'd buffer,
//! whose slots the ring's indices hand between its two sides; this module
//! only carries out what they decide.
//!
//! Under `cfg(loom)` it is the very same buffer, reached through the very
//! same index arithmetic ([`SlotLayout::range`]), and every access also
//! goes through one loom cell per byte: loom's model checker then flags
//! any access to a byte that does not happen-after the other side's
//! conflicting one. A position or size computed wrong — a wrapped sum, an
//! overflowed product — lands on bytes the other side owns and shows as
//! such a race (or, past the end, as an index out of bounds).

use std::ops::Range;

use super::layout::SlotLayout;
use super::mem::Buffer;
use crate::config::PageSize;
use crate::error::Result;

#[derive(Debug)]
pub(crate) struct SlotStorage {
    layout: SlotLayout,
    /// `layout.bytes()` long.
    buf: Buffer,
    /// One cell per byte of `buf`, which every access goes through.
    #[cfg(loom)]
    access: Box<[loom::cell::UnsafeCell<()>]>,
}

// SAFETY: as for the mmap'd buffer (`mem::Buffer` is Sync); the cells,
// which loom makes !Sync, are reached only through `read` and `write`,
// whose callers give each slot to one side at a time in happens-before
// order — which is what loom checks at each of them.
#[cfg(loom)]
unsafe impl Sync for SlotStorage {}

impl SlotStorage {
    pub(crate) fn new(layout: SlotLayout) -> Result<SlotStorage> {
        Ok(SlotStorage {
            buf: Buffer::new(layout.bytes(), PageSize::Base)?,
            #[cfg(loom)]
            access: (0..layout.bytes())
                .map(|_| loom::cell::UnsafeCell::new(()))
                .collect(),
            layout,
        })
    }

    #[inline]
    pub(crate) fn layout(&self) -> SlotLayout {
        self.layout
    }

    /// Lets `fill` write the bytes of `range`.
    ///
    /// # Safety
    /// `range` is `self.layout().range(pos, len)` for some position `pos`
    /// (so it lies in that position's slot), and no other access to the
    /// slot happens until `fill` returns.
    #[inline]
    pub(crate) unsafe fn write(&self, range: Range<usize>, fill: impl FnOnce(&mut [u8])) {
        self.track(&range, true);
        // `end - start`, not `range.len()`: the optimiser folds the former
        // to the caller's `len`, but keeps the latter's empty-range check.
        // Never wraps: a layout's range is ordered.
        let len = range.end.wrapping_sub(range.start);
        // SAFETY: the range lies in one slot, so in the buffer (which is
        // layout.bytes() long); the caller rules out any other access while
        // the &mut lives.
        fill(unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr().add(range.start), len) })
    }

    /// The bytes of `range`.
    ///
    /// # Safety
    /// `range` is as for `write`; every write to the slot happened before
    /// this call, and none happens while the slice lives.
    #[inline]
    pub(crate) unsafe fn read(&self, range: Range<usize>) -> &[u8] {
        self.track(&range, false);
        let len = range.end.wrapping_sub(range.start); // as in `write`
                                                       // SAFETY: in the buffer, as in `write`; the caller rules out writes
                                                       // while the slice lives.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(range.start), len) }
    }

    /// Has loom check an access to every byte of `range` against the
    /// conflicting accesses of the other side.
    #[cfg(loom)]
    fn track(&self, range: &Range<usize>, write: bool) {
        for cell in &self.access[range.clone()] {
            if write {
                cell.with_mut(|_| ());
            } else {
                cell.with(|_| ());
            }
        }
    }

    #[cfg(not(loom))]
    #[inline(always)]
    fn track(&self, _range: &Range<usize>, _write: bool) {}
}
