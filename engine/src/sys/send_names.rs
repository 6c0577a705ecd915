//! How a send queue names its requests to the NIC (their wr_ids) and
//! finds them again in the completions it is handed.
//!
//! A connection's queue has a CQ of its own ([`OwnCq`]): it holds that
//! CQ's poller, every completion it reaps is its own queue pair's, and a
//! request's wr_id is its sequence number, as it always was. A queue on a
//! CQ it shares with the other connections of a poller ([`PooledIds`],
//! issue 25) holds only that CQ's brand; its wr_ids carry its
//! connection's slot and generation beside the sequence number's low 32
//! bits ([`wr_id::pooled`]), so that a completion of another connection —
//! or of an earlier one in the same slot, still arriving after it closed
//! — is never taken for one of its requests.

use std::ops::Range;

use super::cq::{CqId, Reaper};
use super::ledger::{Ledger, NotOutstanding};
use super::wr_id;

/// How a send queue names its requests, and what it holds of its CQ.
pub(crate) trait Naming: Copy {
    /// What the queue holds of the CQ its completions arrive on.
    type Cq;

    /// The CQ whose completions the queue believes.
    fn cq_id(cq: &Self::Cq) -> CqId;

    /// The wr_id request `seq` is posted with.
    fn wr_id(self, seq: u64) -> u64;

    /// The sequence number a completion's `wr_id` names, if it is one of
    /// this queue's and in `[retired, posted)` (the ledger then checks it
    /// is outstanding): `None` for another queue's.
    fn seq(self, wr_id: u64, retired: u64, posted: u64) -> Option<u64>;

    /// Retires through the request a completion's `wr_id` names, if it is
    /// one of this queue's and outstanding: the range newly retired
    /// ([`Ledger::retire_through`]).
    #[inline(always)]
    fn retire_through(self, ledger: &mut Ledger, wr_id: u64) -> Result<Range<u64>, NotOutstanding> {
        match self.seq(wr_id, ledger.retired(), ledger.posted()) {
            Some(seq) => ledger.retire_through(seq),
            None => Err(NotOutstanding {
                wr_id,
                retired: ledger.retired(),
                posted: ledger.posted(),
            }),
        }
    }
}

/// A CQ of the queue's own: the queue owns its poller, and a wr_id is the
/// sequence number itself (the ledger checks the window).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OwnCq;

impl Naming for OwnCq {
    type Cq = Reaper;

    #[inline(always)]
    fn cq_id(cq: &Reaper) -> CqId {
        cq.id()
    }

    #[inline(always)]
    fn wr_id(self, seq: u64) -> u64 {
        seq
    }

    #[inline(always)]
    fn seq(self, wr_id: u64, _retired: u64, _posted: u64) -> Option<u64> {
        Some(wr_id)
    }

    /// The ledger's own check, as a connection's queue always had it: the
    /// id is the sequence number.
    #[inline(always)]
    fn retire_through(self, ledger: &mut Ledger, wr_id: u64) -> Result<Range<u64>, NotOutstanding> {
        ledger.retire_through(wr_id)
    }
}

/// A CQ shared by the connections of one poller: the queue is connection
/// `index` of the poller's slab, generation `gen` (its low
/// [`wr_id::POOLED_GEN_BITS`] bits are kept, as in the wr_id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PooledIds {
    index: u32,
    gen: u32,
}

impl PooledIds {
    /// The names of connection `index` (below 2^16), generation `gen`.
    pub(crate) fn new(index: u32, gen: u32) -> PooledIds {
        assert!(
            index >> wr_id::POOLED_INDEX_BITS == 0,
            "slot {index} past a poller's 2^16"
        );
        PooledIds {
            index,
            gen: gen & ((1 << wr_id::POOLED_GEN_BITS) - 1),
        }
    }
}

impl Naming for PooledIds {
    type Cq = CqId;

    #[inline(always)]
    fn cq_id(cq: &CqId) -> CqId {
        *cq
    }

    #[inline(always)]
    fn wr_id(self, seq: u64) -> u64 {
        wr_id::pooled(self.index, self.gen, seq)
    }

    #[inline(always)]
    fn seq(self, wr_id: u64, retired: u64, posted: u64) -> Option<u64> {
        if wr_id >= wr_id::LEDGER_LIMIT {
            return None;
        }
        let (index, gen, low) = wr_id::unpack_pooled(wr_id);
        if (index, gen) != (self.index, self.gen) {
            return None;
        }
        wr_id::unfold(low, retired, posted)
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_own_queue_names_a_request_by_its_sequence_number() {
        assert_eq!(OwnCq.wr_id(41), 41);
        assert_eq!(
            OwnCq.seq(41, 0, 1),
            Some(41),
            "the ledger checks the window"
        );
    }

    #[test]
    fn a_pooled_queue_finds_only_its_own_requests_again() {
        let names = PooledIds::new(7, 3);
        let (retired, posted) = (10, 20);
        for seq in retired..posted {
            assert_eq!(names.seq(names.wr_id(seq), retired, posted), Some(seq));
        }
        let id = names.wr_id(12);
        for other in [PooledIds::new(8, 3), PooledIds::new(7, 4)] {
            assert_eq!(
                other.seq(id, retired, posted),
                None,
                "{other:?} took {names:?}'s request"
            );
        }
        assert_eq!(names.seq(names.wr_id(9), retired, posted), None, "retired");
        assert_eq!(
            names.seq(names.wr_id(20), retired, posted),
            None,
            "not posted"
        );
        for tagged in [wr_id::SRQ_RECV, wr_id::RAW, wr_id::OWNED] {
            assert_eq!(names.seq(tagged | 12, retired, posted), None, "{tagged:#x}");
        }
    }

    #[test]
    #[should_panic(expected = "past a poller's 2^16")]
    fn a_slot_past_2_16_is_refused() {
        let _ = PooledIds::new(1 << 16, 0);
    }

    proptest! {
        /// Generations that differ in their kept bits never take each
        /// other's requests, across the 2^32 boundary of the sequence
        /// numbers too.
        #[test]
        fn generations_never_take_each_other_s_requests(
            index in 0u32..1 << 16,
            gen in any::<u32>(),
            step in 1u32..1 << wr_id::POOLED_GEN_BITS,
            retired in (1u64 << 32) - 64..(1u64 << 32) + 64,
            window in 1u64..64,
            k in 0u64..64,
        ) {
            let posted = retired + window;
            let seq = retired + k % window;
            let ours = PooledIds::new(index, gen);
            let successor = PooledIds::new(index, gen.wrapping_add(step));
            prop_assert_eq!(ours.seq(ours.wr_id(seq), retired, posted), Some(seq));
            prop_assert_eq!(successor.seq(ours.wr_id(seq), retired, posted), None);
        }
    }
}
