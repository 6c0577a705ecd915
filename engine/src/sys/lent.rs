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
    /// Room for `capacity` regions at once.
    pub(crate) fn new(capacity: usize) -> Self {
        LentRegions {
            entries: (0..capacity.max(1)).map(|_| None).collect(),
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
        let at = (self.head + self.len) % self.entries.len();
        self.entries[at] = Some((seq, region));
        self.len += 1;
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
        self.head = (self.head + 1) % self.entries.len();
        self.len -= 1;
        Some(region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_comes_back_only_once_its_request_retired_and_in_lending_order() {
        let mut lent = LentRegions::new(3);
        for seq in 0..3 {
            lent.push(seq, seq as u32 + 10).unwrap();
        }
        // Full: the fourth is given back at once.
        assert_eq!(lent.push(3, 13), Err(13));
        // Posted 0..3, none retired: nothing comes back.
        assert_eq!(lent.pop_returned(0, 3), None);
        // 0 and 1 retired: those two, oldest first, and not 2.
        assert_eq!(lent.pop_returned(2, 3), Some(10));
        assert_eq!(lent.pop_returned(2, 3), Some(11));
        assert_eq!(lent.pop_returned(2, 3), None);
        assert_eq!(lent.len(), 1);
        // The ring wraps.
        lent.push(3, 13).unwrap();
        lent.push(4, 14).unwrap();
        assert!(lent.is_full());
        assert_eq!(lent.pop_returned(5, 5), Some(12));
        assert_eq!(lent.pop_returned(5, 5), Some(13));
        assert_eq!(lent.pop_returned(5, 5), Some(14));
        assert_eq!(lent.pop_returned(5, 5), None);
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
