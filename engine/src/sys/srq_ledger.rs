//! Which receive slots of a shared receive queue are the NIC's, as pure
//! data (issue 25).
//!
//! A slot is the NIC's from the post of its receive until that receive's
//! completion is polled; then the CPU's: lent to whoever reads what
//! arrived until it is released, then free to post again. Unlike a queue
//! pair's own receive queue, completions come in any order (several queue
//! pairs take from the one queue, each at its own pace), so no cursor
//! tells the owner: each slot has a state. A receive's id carries its
//! ring's tag, its slot and the slot's lap ([`srq_recv`]), so a completion
//! for another ring, for a slot not at the NIC, for an earlier post of it,
//! or seen already, is refused — never taken for another receive.
//!
//! Arithmetic: slots are below 2^20, laps wrap in 30 bits; the counts are
//! at most the slot count, and each falls only for a slot it counted:
//! written `wrapping_`, they never wrap.

use super::wr_id::{srq_recv, unpack_srq_recv, SRQ_LAP_BITS, SRQ_SLOT_BITS};

/// Laps wrap here.
const LAPS: u32 = 1 << SRQ_LAP_BITS;
/// The most slots a ledger keeps.
pub(crate) const MAX_SLOTS: u32 = 1 << SRQ_SLOT_BITS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The CPU's, in the free stack: may be posted.
    Free,
    /// Posted in lap `lap`: the NIC's.
    Nic { lap: u32 },
    /// Its receive completed: the CPU's, lent to a reader.
    Lent,
}

/// Why a completion or a release was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The id names no slot, or a slot not at the NIC in that lap: a
    /// duplicate, a stale or a foreign completion.
    NotPosted { wr_id: u64 },
    /// Released a slot that was not lent.
    NotLent { slot: u32 },
}

/// The slots of one SRQ ring. Allocated once; nothing here allocates
/// afterwards.
#[derive(Debug)]
pub(crate) struct SrqLedger {
    /// The ring's tag in its receives' ids.
    tag: u16,
    states: Box<[State]>,
    /// The lap of each slot's last post.
    laps: Box<[u32]>,
    /// Free slots, the most recently freed last.
    free: Vec<u32>,
    at_nic: usize,
    lent: usize,
    /// A post failed without saying which receives it took: every claimed
    /// slot stays the NIC's, and nothing more is posted.
    broken: bool,
}

impl SrqLedger {
    /// `slots` slots (at most [`MAX_SLOTS`]) of the ring tagged `tag` (1 to
    /// 1023, from the CQ its receives complete on).
    pub(crate) fn new(slots: u32, tag: u16) -> SrqLedger {
        assert!(slots <= MAX_SLOTS && tag != 0 && tag >> 10 == 0);
        SrqLedger {
            tag,
            states: vec![State::Free; slots as usize].into(),
            laps: vec![0; slots as usize].into(),
            free: (0..slots).rev().collect(),
            at_nic: 0,
            lent: 0,
            broken: false,
        }
    }

    /// Slots free to post.
    pub(crate) fn free(&self) -> usize {
        self.free.len()
    }

    /// Slots whose receives are posted.
    pub(crate) fn at_nic(&self) -> usize {
        self.at_nic
    }

    /// Slots lent to readers.
    pub(crate) fn lent(&self) -> usize {
        self.lent
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Claims a free slot for a receive about to be posted: the NIC's from
    /// now on (until [`give_back`](Self::give_back) if the post refuses
    /// it). Returns the slot and its receive's id; `None` when none is
    /// free or the ledger is broken.
    pub(crate) fn claim(&mut self) -> Option<(u32, u64)> {
        if self.broken {
            return None;
        }
        let slot = self.free.pop()?;
        let i = slot as usize;
        let lap = self.laps[i].wrapping_add(1) % LAPS;
        self.laps[i] = lap;
        self.states[i] = State::Nic { lap };
        self.at_nic = self.at_nic.wrapping_add(1);
        Some((slot, srq_recv(self.tag, lap, slot)))
    }

    /// The post refused the receive of `slot` (it said so, naming it or
    /// one before it): the slot is the CPU's again, free.
    pub(crate) fn give_back(&mut self, slot: u32) {
        let i = slot as usize;
        if matches!(self.states.get(i), Some(State::Nic { .. })) {
            self.states[i] = State::Free;
            self.at_nic = self.at_nic.wrapping_sub(1);
            self.free.push(slot);
        }
    }

    /// A post failed without naming what it refused: every claimed slot
    /// stays the NIC's (it may have taken them all), and the ledger claims
    /// nothing more.
    pub(crate) fn break_down(&mut self) {
        self.broken = true;
    }

    /// The completion of the receive `wr_id`: the slot it filled, now lent
    /// to its reader.
    pub(crate) fn complete(&mut self, wr_id: u64) -> Result<u32, Refused> {
        let refused = Refused::NotPosted { wr_id };
        let Some((lap, slot)) = unpack_srq_recv(self.tag, wr_id) else {
            return Err(refused);
        };
        match self.states.get(slot as usize) {
            Some(State::Nic { lap: posted }) if *posted == lap => {
                self.states[slot as usize] = State::Lent;
                self.at_nic = self.at_nic.wrapping_sub(1);
                self.lent = self.lent.wrapping_add(1);
                Ok(slot)
            }
            _ => Err(refused),
        }
    }

    /// The reader of `slot` is done: free to post again.
    pub(crate) fn release(&mut self, slot: u32) -> Result<(), Refused> {
        match self.states.get(slot as usize) {
            Some(State::Lent) => {
                self.states[slot as usize] = State::Free;
                self.lent = self.lent.wrapping_sub(1);
                self.free.push(slot);
                Ok(())
            }
            _ => Err(Refused::NotLent { slot }),
        }
    }

    /// Whether `slot`'s bytes are the CPU's to read now (lent).
    pub(crate) fn is_readable(&self, slot: u32) -> bool {
        matches!(self.states.get(slot as usize), Some(State::Lent))
    }

    /// Whether the receive `wr_id` completed and its slot is still lent:
    /// not released since, so neither posted again nor lent to the reader
    /// of a later receive into the same slot.
    pub(crate) fn is_lent(&self, wr_id: u64) -> bool {
        unpack_srq_recv(self.tag, wr_id).is_some_and(|(lap, slot)| {
            self.is_readable(slot) && self.laps.get(slot as usize) == Some(&lap)
        })
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use proptest::prelude::*;

    use super::*;

    const TAG: u16 = 7;

    #[derive(Debug, Clone)]
    enum Op {
        Claim,
        /// Complete the k-th (mod) receive at the NIC, in any order.
        Complete(usize),
        /// A completion with an id of the test's choosing.
        Bogus(u64),
        /// Complete again a receive completed before.
        Duplicate(usize),
        Release(usize),
        GiveBack(usize),
        Break,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Claim),
            4 => any::<usize>().prop_map(Op::Complete),
            1 => any::<u64>().prop_map(Op::Bogus),
            1 => any::<usize>().prop_map(Op::Duplicate),
            3 => any::<usize>().prop_map(Op::Release),
            1 => any::<usize>().prop_map(Op::GiveBack),
            1 => Just(Op::Break),
        ]
    }

    proptest! {
        /// Whatever order receives complete in, and whatever ids come,
        /// a slot is in exactly one of free, at the NIC and lent; only
        /// an id posted and not yet completed completes; a slot is posted
        /// again only after its completion and release.
        #[test]
        fn every_slot_has_one_owner_whatever_comes(
            slots in 1u32..12,
            ops in prop::collection::vec(op(), 0..300),
        ) {
            let mut ledger = SrqLedger::new(slots, TAG);
            let mut nic: Vec<(u32, u64)> = Vec::new(); // the model: posted receives
            let mut lent: Vec<u32> = Vec::new();
            let mut done: Vec<u64> = Vec::new(); // ids completed
            let mut broken = false;
            for op in ops {
                match op {
                    Op::Claim => match ledger.claim() {
                        Some((slot, id)) => {
                            prop_assert!(!broken);
                            prop_assert_eq!(unpack_srq_recv(TAG, id).map(|(_, s)| s), Some(slot));
                            prop_assert!(!nic.iter().any(|&(s, _)| s == slot), "posted twice");
                            prop_assert!(!lent.contains(&slot), "posted while lent");
                            prop_assert!(!done.contains(&id), "an id reused");
                            nic.push((slot, id));
                        }
                        None => prop_assert!(broken || nic.len() + lent.len() == slots as usize),
                    },
                    Op::Complete(k) if !nic.is_empty() => {
                        let (slot, id) = nic.remove(k % nic.len());
                        prop_assert_eq!(ledger.complete(id), Ok(slot));
                        prop_assert!(ledger.is_readable(slot));
                        lent.push(slot);
                        done.push(id);
                    }
                    Op::Complete(_) => {}
                    Op::Bogus(id) => {
                        let posted = nic.iter().position(|&(_, i)| i == id);
                        match posted {
                            Some(at) => {
                                let (slot, _) = nic.remove(at);
                                prop_assert_eq!(ledger.complete(id), Ok(slot));
                                lent.push(slot);
                                done.push(id);
                            }
                            None => prop_assert_eq!(
                                ledger.complete(id),
                                Err(Refused::NotPosted { wr_id: id })
                            ),
                        }
                    }
                    Op::Duplicate(k) if !done.is_empty() => {
                        let id = done[k % done.len()];
                        prop_assert_eq!(ledger.complete(id), Err(Refused::NotPosted { wr_id: id }));
                    }
                    Op::Duplicate(_) => {}
                    Op::Release(k) if !lent.is_empty() => {
                        let slot = lent.remove(k % lent.len());
                        prop_assert_eq!(ledger.release(slot), Ok(()));
                        prop_assert_eq!(ledger.release(slot), Err(Refused::NotLent { slot }));
                    }
                    Op::Release(_) => {}
                    Op::GiveBack(k) if !nic.is_empty() && !broken => {
                        let (slot, id) = nic.remove(k % nic.len());
                        ledger.give_back(slot);
                        prop_assert_eq!(ledger.complete(id), Err(Refused::NotPosted { wr_id: id }));
                    }
                    Op::GiveBack(_) => {}
                    Op::Break => {
                        ledger.break_down();
                        broken = true;
                    }
                }
                prop_assert_eq!(ledger.is_broken(), broken);
                prop_assert_eq!(ledger.at_nic(), nic.len());
                prop_assert_eq!(ledger.lent(), lent.len());
                prop_assert_eq!(ledger.free() + ledger.at_nic() + ledger.lent(), slots as usize);
            }
        }
    }

    #[test]
    fn a_receive_is_lent_from_its_completion_to_its_release_and_no_later_lap_is() {
        let mut ledger = SrqLedger::new(2, TAG);
        let (slot, first) = ledger.claim().unwrap();
        assert!(!ledger.is_lent(first), "at the NIC");
        assert_eq!(ledger.complete(first), Ok(slot));
        assert!(ledger.is_lent(first));
        assert!(!ledger.is_lent(first | 1 << 40), "another lap of the slot");
        assert!(!ledger.is_lent(first | 1 << 50), "a lap past the wrap");
        assert!(
            !ledger.is_lent(srq_recv(TAG + 1, 1, slot)),
            "another ring's receive into the same slot and lap"
        );
        ledger.release(slot).unwrap();
        assert!(!ledger.is_lent(first), "released");
        // The slot comes back (last freed, first claimed) in its next lap:
        // lent again, but not to the reader of the first receive.
        let (again, second) = ledger.claim().unwrap();
        assert_eq!(again, slot);
        assert_eq!(ledger.complete(second), Ok(slot));
        assert!(ledger.is_lent(second));
        assert!(
            !ledger.is_lent(first),
            "a stale receive of a slot lent again"
        );
    }

    #[test]
    fn laps_wrap_below_the_ledger_limit() {
        let mut ledger = SrqLedger::new(1, TAG);
        ledger.laps[0] = LAPS - 1;
        let (slot, id) = ledger.claim().unwrap();
        assert_eq!((slot, id), (0, srq_recv(TAG, 0, 0)), "lap 0 after the last");
        assert_eq!(ledger.complete(id), Ok(0));
        // An id with a lap past the wrap names nothing.
        let past = srq_recv(TAG, 0, 0) | 1 << 50;
        assert_eq!(
            ledger.complete(past),
            Err(Refused::NotPosted { wr_id: past })
        );
    }

    /// Two rings on one CQ: each takes only its own receives, even for
    /// the same slot in the same lap; a ledger's or a zeroed id is no
    /// ring's.
    #[test]
    fn a_ring_refuses_another_ring_s_receive_into_the_same_slot_and_lap() {
        let (mut one, mut two) = (SrqLedger::new(4, 1), SrqLedger::new(4, 2));
        let (slot_one, id_one) = one.claim().unwrap();
        let (slot_two, id_two) = two.claim().unwrap();
        assert_eq!(slot_one, slot_two, "the same slot, the same lap");
        assert_eq!(
            one.complete(id_two),
            Err(Refused::NotPosted { wr_id: id_two })
        );
        assert_eq!(
            two.complete(id_one),
            Err(Refused::NotPosted { wr_id: id_one })
        );
        for foreign in [0, 1, u64::from(slot_one), 1 << 32 | u64::from(slot_one)] {
            assert_eq!(
                one.complete(foreign),
                Err(Refused::NotPosted { wr_id: foreign })
            );
        }
        assert_eq!(one.at_nic(), 1, "nothing refused changed hands");
        assert_eq!(one.complete(id_one), Ok(slot_one));
        assert_eq!(two.complete(id_two), Ok(slot_two));
    }
}
