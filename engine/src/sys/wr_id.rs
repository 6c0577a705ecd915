//! Who a work request's id belongs to, so that no completion is ever
//! taken for another request's.
//!
//! A queue pair's completions name their requests only by `wr_id`, and
//! three kinds of request may share one queue pair: a connection's rings
//! count theirs with sequence numbers ([`super::ledger`]); the safe
//! low-level posts of whole regions ([`super::region::Posted`]) and the
//! raw, `unsafe` posts of experts ([`super::region::RawQueuePair`]) carry
//! a tag in the top two bits. The ledgers admit only ids below
//! [`LEDGER_LIMIT`] and take a completion only for an id they admitted,
//! so a tagged id is never counted as a ring position or a sequence
//! number. The receives of a shared receive ring ([`srq_recv`]) have ids
//! of their own between the two, each naming its ring.

/// Ids a ledger may hand out: every sequence number and ring position is
/// below this (2^61 requests: centuries at any rate); every tagged id and
/// every shared receive ring's is at or above it.
pub(crate) const LEDGER_LIMIT: u64 = 1 << 61;
/// The mark of a shared receive ring's receive: `001` from the top, then
/// the ring's tag (10 bits), a zero, the slot's lap (30 bits) and the
/// slot (20 bits).
pub(crate) const SRQ_RECV: u64 = 1 << 61;
/// Bits of a shared receive ring's slot: a ring holds at most 2^20.
pub(crate) const SRQ_SLOT_BITS: u32 = 20;
/// Bits of a slot's lap in a shared receive ring's id.
pub(crate) const SRQ_LAP_BITS: u32 = 30;
const SRQ_TAG_SHIFT: u32 = 51;
/// The tag of a raw post's id ([`super::region::RawQueuePair`]).
pub(crate) const RAW: u64 = 1 << 62;
/// The tag of a whole region's post ([`super::region::Posted`]).
pub(crate) const OWNED: u64 = 1 << 63;
/// Both tags.
const TAGS: u64 = RAW | OWNED;

/// Whose a polled completion's id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A ring's sequence number or position.
    Ledger,
    /// A raw post, with the id its poster gave.
    Raw(u64),
    /// A whole region's post.
    Owned,
}

/// Whose `wr_id` is. A shared receive ring's id ([`srq_recv`]) reads as
/// a ledger's here: it is only ever polled from that ring's CQ, which no
/// ledger of a connection's own queue reads (completions are branded with
/// their CQ, `super::cq::Reaped`), and the ring checks its own.
#[inline]
pub(crate) fn owner(wr_id: u64) -> Owner {
    if wr_id & OWNED != 0 {
        Owner::Owned
    } else if wr_id & RAW != 0 {
        Owner::Raw(wr_id & !TAGS)
    } else {
        Owner::Ledger
    }
}

/// The id a raw post of `id` carries, or `None` when `id` uses a tag's
/// bits (which the caller must not: it would lose them).
#[inline]
pub(crate) fn raw(id: u64) -> Option<u64> {
    (id & TAGS == 0).then_some(id | RAW)
}

/// The id of a shared receive ring's receive into `slot` (below 2^20) in
/// lap `lap` (below 2^30), the ring tagged `tag` (1 to 1023) by the CQ
/// its receives complete on: never a ledger's id, a tagged one, or
/// another ring's of that CQ.
pub(crate) fn srq_recv(tag: u16, lap: u32, slot: u32) -> u64 {
    debug_assert!(tag != 0 && tag >> 10 == 0, "ring tag {tag}");
    debug_assert!(lap >> SRQ_LAP_BITS == 0 && slot >> SRQ_SLOT_BITS == 0);
    SRQ_RECV | u64::from(tag) << SRQ_TAG_SHIFT | u64::from(lap) << SRQ_SLOT_BITS | u64::from(slot)
}

/// The lap and slot a shared receive ring tagged `tag` gave `wr_id`, if
/// it is one of that ring's ids at all.
pub(crate) fn unpack_srq_recv(tag: u16, wr_id: u64) -> Option<(u32, u32)> {
    let ring = SRQ_RECV | u64::from(tag) << SRQ_TAG_SHIFT;
    let low = wr_id.checked_sub(ring)?;
    // What is left must fit the lap and the slot: the bit between them
    // and the tag stays clear, so no other ring's id (nor a ledger's, nor
    // a tagged one) gets here.
    (low >> (SRQ_LAP_BITS + SRQ_SLOT_BITS) == 0).then_some((
        (low >> SRQ_SLOT_BITS) as u32,
        low as u32 & ((1 << SRQ_SLOT_BITS) - 1),
    ))
}

/// Bits of a pooled id's generation (issue 25's poller: many connections
/// share one CQ, so an id names its connection as well as its request).
pub(crate) const POOLED_GEN_BITS: u32 = 13;
/// Bits of a pooled id's connection slot: a poller holds at most 2^16.
pub(crate) const POOLED_INDEX_BITS: u32 = 16;

/// The id of the request with sequence number `seq` of the pooled
/// connection in slot `index` (below 2^16), generation `gen` (its low 13
/// bits are kept): `000`, generation, slot, the sequence number's low 32
/// bits, from the top. Always below [`LEDGER_LIMIT`], so never taken for
/// a tagged id; the connection's ledger rebuilds the sequence number from
/// its low bits (`Ledger::unfold`).
pub(crate) fn pooled(index: u32, gen: u32, seq: u64) -> u64 {
    debug_assert!(index >> POOLED_INDEX_BITS == 0, "slot {index} past 2^16");
    let gen = u64::from(gen) & ((1 << POOLED_GEN_BITS) - 1);
    let index = u64::from(index) & ((1 << POOLED_INDEX_BITS) - 1);
    gen << 48 | index << 32 | (seq & u64::from(u32::MAX))
}

/// The parts of a pooled id: slot, generation (13 bits), the sequence
/// number's low 32 bits.
pub(crate) fn unpack_pooled(wr_id: u64) -> (u32, u32, u32) {
    let index = (wr_id >> 32) as u32 & ((1 << POOLED_INDEX_BITS) - 1);
    let gen = (wr_id >> 48) as u32 & ((1 << POOLED_GEN_BITS) - 1);
    (index, gen, wr_id as u32)
}

/// The one sequence number in `[retired, posted)` whose low 32 bits are
/// `low`, if there is one (the window is never longer than 2^32: depths
/// are at most 2^20).
pub(crate) fn unfold(low: u32, retired: u64, posted: u64) -> Option<u64> {
    let top = posted.checked_sub(1)?;
    let back = u64::from((top as u32).wrapping_sub(low));
    let seq = top.checked_sub(back)?;
    (seq >= retired).then_some(seq)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Every request of a window, also across 2^32, is found again
        /// from its low bits, and nothing outside the window is.
        #[test]
        fn a_window_s_sequence_numbers_unfold_from_their_low_bits(
            start in prop_oneof![0u64..10, (1u64 << 32) - 20..(1u64 << 32) + 20, any::<u64>().prop_map(|v| v % (LEDGER_LIMIT - (1 << 21)))],
            len in 0u64..(1 << 20),
            probe in any::<u32>(),
        ) {
            let (retired, posted) = (start, start + len);
            for seq in [retired, retired + len / 2, posted.saturating_sub(1)] {
                if seq >= retired && seq < posted {
                    prop_assert_eq!(unfold(seq as u32, retired, posted), Some(seq));
                }
            }
            match unfold(probe, retired, posted) {
                Some(seq) => {
                    prop_assert!(seq >= retired && seq < posted);
                    prop_assert_eq!(seq as u32, probe);
                }
                None => prop_assert!((retired..posted).all(|s| s as u32 != probe) || len > 4096),
            }
        }

        #[test]
        fn pooled_ids_pack_and_unpack_below_the_ledger_limit(
            index in 0u32..(1 << 16),
            gen in any::<u32>(),
            seq in 0u64..LEDGER_LIMIT,
        ) {
            let id = pooled(index, gen, seq);
            prop_assert!(id < LEDGER_LIMIT);
            prop_assert_eq!(owner(id), Owner::Ledger);
            prop_assert_eq!(unpack_pooled(id), (index, gen & 0x1fff, seq as u32));
        }

        /// A shared receive ring's id is found again by its ring, and by
        /// no other ring; no ledger's, pooled or tagged id is taken for
        /// any ring's.
        #[test]
        fn a_shared_ring_s_ids_are_its_own_alone(
            tag in 1u16..1024,
            other in 1u16..1024,
            lap in 0u32..(1 << SRQ_LAP_BITS),
            slot in 0u32..(1 << SRQ_SLOT_BITS),
            seq in 0u64..LEDGER_LIMIT,
            index in 0u32..(1 << 16),
            gen in any::<u32>(),
            anything in 0u64..(1 << 51),
        ) {
            let id = srq_recv(tag, lap, slot);
            prop_assert!((LEDGER_LIMIT..RAW).contains(&id));
            prop_assert_eq!(unpack_srq_recv(tag, id), Some((lap, slot)));
            if other != tag {
                prop_assert_eq!(unpack_srq_recv(other, id), None);
            }
            for foreign in [seq, pooled(index, gen, seq), raw(seq).unwrap(), seq | OWNED] {
                prop_assert_eq!(unpack_srq_recv(tag, foreign), None);
            }
            // Ids at and past the ring's first: each that unpacks is the
            // one id of its lap and slot; past lap and slot bits, none.
            let near = srq_recv(tag, 0, 0) + anything;
            match unpack_srq_recv(tag, near) {
                Some((l, s)) => prop_assert_eq!(srq_recv(tag, l, s), near, "one id per lap and slot"),
                None => prop_assert!(anything >= 1 << 50),
            }
        }
    }

    #[test]
    fn an_empty_window_unfolds_nothing() {
        assert_eq!(unfold(0, 0, 0), None);
        assert_eq!(unfold(5, 7, 7), None);
        assert_eq!(unfold(6, 7, 9), None, "below the window");
        assert_eq!(unfold(9, 7, 9), None, "at its end");
    }

    #[test]
    fn tagged_ids_never_fall_in_a_ledgers_range() {
        for id in [0, 1, 42, LEDGER_LIMIT - 1] {
            let tagged = raw(id).unwrap();
            assert!(tagged >= LEDGER_LIMIT);
            assert_eq!(owner(tagged), Owner::Raw(id));
            assert_eq!(owner(id), Owner::Ledger);
        }
        assert_eq!(raw(RAW), None, "bit 62 is the raw tag");
        assert_eq!(raw(u64::MAX), None);
        assert_eq!(raw(OWNED | 5), None, "bit 63 is the owned tag");
        assert_eq!(owner(OWNED), Owner::Owned);
        assert_eq!(owner(u64::MAX), Owner::Owned);
    }
}
