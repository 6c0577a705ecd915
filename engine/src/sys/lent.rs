//! Registered memory a caller lent to a send queue: each
//! [`MemoryRegion`] a request sends from waits here, in posting order,
//! from its post until the request retires, and only then goes back.
//!
//! The regions sit in a ring allocated once, so lending and reclaiming
//! never allocate. A region is returned when its request retired (the NIC
//! is done reading it) or never went (its sequence number is at or past
//! the ledger's `posted` again: the batch was dropped or refused before
//! it). A request the NIC has is never rolled back, so neither test can
//! let a region go while the NIC may still read it.

use super::region::MemoryRegion;

/// Lent regions, oldest first, each with its request's sequence number
/// (generic only so that the accounting is tested without a device).
pub(crate) struct LentRegions<T = MemoryRegion> {
    entries: Box<[Option<(u64, T)>]>,
    /// Index of the oldest entry.
    head: usize,
    len: usize,
}

impl<T> std::fmt::Debug for LentRegions<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentRegions")
            .field("len", &self.len)
            .field("capacity", &self.entries.len())
            .finish()
    }
}

impl<T> LentRegions<T> {
    /// Room for at least `capacity` regions at once (a power of two).
    pub(crate) fn new(capacity: usize) -> Self {
        LentRegions {
            entries: (0..capacity.max(1).next_power_of_two())
                .map(|_| None)
                .collect(),
            head: 0,
            len: 0,
        }
    }

    /// Regions lent and not yet returned.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.len == self.entries.len()
    }

    /// Keeps `region` for request `seq`; gives it back if there is no room.
    #[inline]
    pub(crate) fn push(&mut self, seq: u64, region: T) -> Result<(), T> {
        if self.is_full() {
            return Err(region);
        }
        let at = self.index(self.len);
        self.entries[at] = Some((seq, region));
        // Below the capacity: not full (above).
        self.len = self.len.wrapping_add(1);
        Ok(())
    }

    /// The oldest region, if its request retired (`seq < retired`) or was
    /// never posted (`seq >= posted`).
    #[inline]
    pub(crate) fn pop_returned(&mut self, retired: u64, posted: u64) -> Option<T> {
        let (seq, _) = self.entries[self.head].as_ref()?;
        if *seq >= retired && *seq < posted {
            return None;
        }
        let (_, region) = self.entries[self.head].take()?;
        self.head = self.index(1);
        // At least one: the oldest was there.
        self.len = self.len.wrapping_sub(1);
        Some(region)
    }

    /// The entry `i` places after the oldest (`i` at most the capacity).
    #[inline]
    fn index(&self, i: usize) -> usize {
        // Neither wraps: head and i are at most the capacity, a power of
        // two (see `new`), so this masks the sum onto the ring.
        self.head.wrapping_add(i) & self.entries.len().wrapping_sub(1)
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    #[test]
    fn a_region_comes_back_only_once_its_request_retired_and_in_lending_order() {
        // Room for 3 is room for 4: a power of two.
        let mut lent = LentRegions::new(3);
        for seq in 0..4 {
            lent.push(seq, seq as u32 + 10).unwrap();
        }
        // Full: the fifth is given back at once.
        assert_eq!(lent.push(4, 14), Err(14));
        // Posted 0..4, none retired: nothing comes back.
        assert_eq!(lent.pop_returned(0, 4), None);
        // 0 and 1 retired: those two, oldest first, and not 2.
        assert_eq!(lent.pop_returned(2, 4), Some(10));
        assert_eq!(lent.pop_returned(2, 4), Some(11));
        assert_eq!(lent.pop_returned(2, 4), None);
        assert_eq!(lent.len(), 2);
        // The ring wraps.
        lent.push(4, 14).unwrap();
        lent.push(5, 15).unwrap();
        assert!(lent.is_full());
        for expected in 12..16 {
            assert_eq!(lent.pop_returned(6, 6), Some(expected));
        }
        assert_eq!(lent.pop_returned(6, 6), None);
        assert_eq!(lent.len(), 0);
    }

    #[test]
    fn a_region_whose_request_never_went_comes_back_at_once() {
        let mut lent = LentRegions::new(4);
        lent.push(0, 'a').unwrap();
        lent.push(1, 'b').unwrap();
        // Request 0 went and is in flight; 1 was rolled back (posted = 1).
        assert_eq!(lent.pop_returned(0, 1), None, "0 is still the NIC's");
        assert_eq!(lent.pop_returned(1, 1), Some('a'));
        assert_eq!(lent.pop_returned(1, 1), Some('b'), "1 never went");
    }
}
