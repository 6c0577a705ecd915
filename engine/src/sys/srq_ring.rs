//! The receive ring of a shared receive queue (issue 25): one registered
//! ring of slots, one receive per slot posted to the SRQ, and the
//! [`SrqLedger`] that says whose each slot is — the only code that moves
//! an SRQ slot between the NIC and the CPU.
//!
//! A slot is the NIC's from the post of its receive until that receive's
//! completion is settled here, whichever queue pair on the SRQ it landed
//! on; then the CPU's, lent to one [`SrqSlot`] until that is released,
//! then free to post again. Views of a slot borrow the ring and need the
//! slot lent; posting and releasing need `&mut` of the ring, so no view
//! outlives its slot's return to the NIC (row 6 of the unsafe contract).
//!
//! The ring holds the SRQ's one [`SrqPoster`], so it is `Send` but not
//! `Sync`; the poller that owns it also polls the receive CQ and destroys
//! the queue pairs on the SRQ (row 2). Its memory outlives the SRQ: on
//! drop it is parked with the SRQ, freed only once the SRQ is destroyed,
//! after the last queue pair on it, and leaked if that fails (row 3).

use std::sync::Arc;

use super::cq::{CompletionQueue, CqId, Polled};
use super::mr::{Access, LocalSlice, Registration};
use super::pd::ProtectionDomain;
use super::srq::{SharedReceiveQueue, SrqPoster};
use super::srq_ledger::{Refused, SrqLedger, MAX_SLOTS};
use super::wr::{Indeterminate, PostFailed, RecvChain};
use crate::config::{bad_setting, PageSize};
use crate::error::{errno, Error, Result};

/// A lent slot: the one right to read what its receive delivered, handed
/// out once per completion by [`SrqRing::settle`] and given back by
/// [`SrqRing::release`]. Neither `Clone` nor constructible outside this
/// module, so a slot has at most one reader and none after its release.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a slot dropped unreleased stays lent for the ring's life: the SRQ has one receive fewer"]
pub(crate) struct SrqSlot {
    /// The completed receive's id: the ring's tag, the slot and its lap.
    wr_id: u64,
    slot: u32,
}

impl SrqSlot {
    /// The slot's index in the ring.
    pub(crate) fn index(&self) -> u32 {
        self.slot
    }
}

/// An SRQ, the registered ring its receives land in, and who owns each
/// slot. Allocated once by [`new`](SrqRing::new); refilling, settling,
/// viewing and releasing allocate nothing.
pub(crate) struct SrqRing {
    poster: SrqPoster,
    ledger: SrqLedger,
    /// The CQ its receives complete on (every queue pair on the SRQ has
    /// it as its receive CQ): completions polled elsewhere are refused.
    cq: CqId,
    chain: RecvChain,
    /// The slots of the chain being posted, in its order: what a partial
    /// refusal gives back is found here.
    claimed: Box<[u32]>,
    /// `None` only while dropping, when it goes to the SRQ's parking lot.
    ring: Option<Registration>,
    slot_size: usize,
    /// A post failed without naming the receive it refused: why the ring
    /// takes no more.
    broken: Option<Indeterminate>,
}

impl std::fmt::Debug for SrqRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrqRing")
            .field("ledger", &self.ledger)
            .field("slot_size", &self.slot_size)
            .field("broken", &self.broken)
            .finish()
    }
}

impl SrqRing {
    /// An SRQ of `depth` receives in `pd` (the device granting fewer is an
    /// error), a ring of `depth` slots of `slot_size` bytes on `pages`,
    /// registered for the NIC to write locally only, and a chain of
    /// `batch` receives (at most `depth`). Every queue pair on the SRQ
    /// must have `cq` as its receive CQ: the ring takes its tag from it,
    /// and settles only completions polled from it. Nothing is posted yet.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        depth: u32,
        slot_size: usize,
        batch: usize,
        pages: PageSize,
    ) -> Result<SrqRing> {
        let bytes = ring_bytes(depth, slot_size, batch)?;
        let (_, poster) = SharedReceiveQueue::new(pd, cq, depth)?;
        // Freed at once if this fails: nothing is posted yet.
        let ring = Registration::new(pd, bytes, pages, Access::LOCAL_WRITE)?;
        // Last: a ring that was not made uses up no tag.
        let tag = cq.ring_tag()?;
        Ok(SrqRing {
            poster,
            ledger: SrqLedger::new(depth, tag),
            cq: cq.id(),
            chain: RecvChain::new(batch),
            claimed: vec![0; batch].into(),
            ring: Some(ring),
            slot_size,
            broken: None,
        })
    }

    /// The SRQ, for creating the queue pairs that take receives from it.
    pub(crate) fn srq(&self) -> &Arc<SharedReceiveQueue> {
        self.poster.srq()
    }

    /// Slots free to post (a broken ring still counts its released ones,
    /// though `refill` posts none: check [`Self::is_broken`] before
    /// refilling on this count).
    pub(crate) fn free(&self) -> usize {
        self.ledger.free()
    }

    /// Whether a post failed without naming what it refused: the ring
    /// posts nothing more ([`Error::SrqBroken`]).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Slots whose receives are posted (or, after an unnamed failure, may
    /// be).
    pub(crate) fn at_nic(&self) -> usize {
        self.ledger.at_nic()
    }

    /// Slots lent to readers.
    pub(crate) fn lent(&self) -> usize {
        self.ledger.lent()
    }

    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// The largest chain one [`refill`](Self::refill) posts.
    pub(crate) fn batch(&self) -> usize {
        self.chain.capacity()
    }

    /// The SRQ's poster, for tests that post beside the ring.
    #[cfg(test)]
    pub(super) fn poster_mut(&mut self) -> &mut SrqPoster {
        &mut self.poster
    }

    /// Arms the SRQ's one-shot limit event (0 disarms): see
    /// [`SharedReceiveQueue::arm_limit`].
    pub(crate) fn arm_limit(&self, limit: u32) -> Result<()> {
        self.srq().arm_limit(limit)
    }

    /// Posts up to a batch of free slots' receives as one chain; returns
    /// how many the SRQ took (0 when no slot is free).
    ///
    /// When the provider refuses part way, naming the receive it refused,
    /// that receive and those after it are given back (free, posted by a
    /// later call) and its error returned. When it fails without naming
    /// one, every receive of the chain counts as posted — an SRQ has no
    /// error state to flush them, so each stays the NIC's until it
    /// completes — and the ring takes no more: this call and every later
    /// one return [`Error::SrqBroken`].
    pub(crate) fn refill(&mut self) -> Result<usize> {
        if let Some(broken) = self.broken {
            return Err(srq_broken(broken));
        }
        let ring = self.ring.as_ref().expect("the ring goes only when dropped");
        let mut n = 0;
        while n < self.claimed.len() {
            let Some((slot, wr_id)) = self.ledger.claim() else {
                break;
            };
            self.claimed[n] = slot;
            self.chain.patch(
                n,
                wr_id,
                Some(LocalSlice {
                    // Never wraps: the slot lies inside the ring (`new`
                    // checked depth × slot_size).
                    addr: ring
                        .addr()
                        .wrapping_add(slot_offset(slot, self.slot_size) as u64),
                    len: self.slot_size as u32,
                    lkey: ring.lkey(),
                }),
            );
            n = n.wrapping_add(1); // below claimed.len()
        }
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: each slot of the chain was free (the CPU's, no lent
        // SrqSlot names it) and the ledger now holds it as the NIC's; no
        // view of it exists, as views borrow self and this takes &mut self.
        // The ring outlives every receive posted here: it is parked with
        // the SRQ on drop and freed only once the SRQ is destroyed.
        let outcome = unsafe { self.chain.post_shared(&mut self.poster, n) };
        match account(&mut self.ledger, &self.claimed[..n], outcome) {
            Ok(posted) => Ok(posted),
            Err(PostFailed::Refused { error, .. }) => Err(error),
            Err(PostFailed::Unknown(unknown)) => Err(srq_broken(*self.broken.insert(unknown))),
        }
    }

    /// The completion of a receive, polled from the CQ this ring's
    /// receives complete on: its slot, now lent to the caller. Settled
    /// before anything else is done with the completion (whatever its
    /// status or queue pair), so the slot is the CPU's again whoever it
    /// landed on. A completion polled from another CQ, another ring's (the
    /// tag in its id), a duplicate or an earlier lap's is refused, and no
    /// slot changes hands: only a receive this ring posted and the NIC
    /// completed is ever lent.
    #[inline]
    pub(crate) fn settle(&mut self, polled: Polled<'_>) -> Result<SrqSlot, Refused> {
        let wr_id = polled.wc().wr_id();
        if polled.cq() != self.cq {
            return Err(Refused::NotPosted { wr_id });
        }
        let slot = self.ledger.complete(wr_id)?;
        Ok(SrqSlot { wr_id, slot })
    }

    /// The first `len` bytes of `slot` (what its receive delivered, as its
    /// completion's byte count says), clamped to the slot: a receive that
    /// completes successfully never holds more than its one slot-sized
    /// entry (a longer message fails it with a length error), so a larger
    /// `len` is a caller's error that must not reach past the slot, and
    /// clamping keeps the data path free of a check that cannot fail for
    /// a true count. Refused for a slot this ring has not lent (another
    /// ring's).
    #[inline]
    pub(crate) fn data(&self, slot: &SrqSlot, len: usize) -> Result<&[u8], Refused> {
        if !self.ledger.is_lent(slot.wr_id) {
            return Err(Refused::NotLent { slot: slot.index() });
        }
        let ring = self.ring.as_ref().expect("the ring goes only when dropped");
        let start = slot_offset(slot.index(), self.slot_size);
        // SAFETY: the slot is lent (checked above), so its receive has
        // completed and the NIC is done writing it; it is posted again only
        // by `refill` after `release`, both of which need &mut self while
        // the slice borrows self. The span lies inside the ring: the slot's
        // index is below depth (the ledger holds no other) and `new`
        // checked depth × slot_size against the registration.
        Ok(unsafe { std::slice::from_raw_parts(ring.at(start), len.min(self.slot_size)) })
    }

    /// The reader of `slot` is done: the slot is free, and the next
    /// [`refill`](Self::refill) posts it again. Refused for a slot this
    /// ring has not lent.
    #[inline]
    pub(crate) fn release(&mut self, slot: SrqSlot) -> Result<(), Refused> {
        if !self.ledger.is_lent(slot.wr_id) {
            return Err(Refused::NotLent { slot: slot.index() });
        }
        self.ledger.release(slot.index())
    }
}

impl Drop for SrqRing {
    fn drop(&mut self) {
        // Posted receives name the ring until the SRQ is destroyed, which
        // the queue pairs on it may put off past this drop: the ring goes
        // with the SRQ (freed when it is destroyed, leaked if that fails).
        if let Some(ring) = self.ring.take() {
            self.poster.srq().lot().park(None, ring);
        }
    }
}

/// The bytes of a ring of `depth` slots of `slot_size` with a chain of
/// `batch`, or why not.
fn ring_bytes(depth: u32, slot_size: usize, batch: usize) -> Result<usize> {
    if depth == 0 || depth > MAX_SLOTS {
        return Err(bad_setting(
            "srq_depth",
            depth,
            format!("must be 1 to {MAX_SLOTS} receives"),
        ));
    }
    if slot_size == 0 || u32::try_from(slot_size).is_err() {
        return Err(bad_setting(
            "slot_size",
            slot_size,
            "must be 1 byte to 4 GiB - 1 (one scatter/gather entry)",
        ));
    }
    if batch == 0 || batch > depth as usize {
        return Err(bad_setting(
            "srq_batch",
            batch,
            format!("must be 1 to the SRQ's depth ({depth})"),
        ));
    }
    match slot_size.checked_mul(depth as usize) {
        Some(bytes) if isize::try_from(bytes).is_ok() => Ok(bytes),
        _ => Err(bad_setting(
            "srq_depth",
            depth,
            format!("slots of {slot_size} bytes: more than one mapping can hold"),
        )),
    }
}

/// Where slot `slot` starts in the ring.
#[inline(always)]
fn slot_offset(slot: u32, slot_size: usize) -> usize {
    // Never wraps: slot < depth, and `ring_bytes` checked depth × size.
    (slot as usize).wrapping_mul(slot_size)
}

/// What a post of the slots `claimed` (in chain order) left in `ledger`:
/// on a refusal that names a receive, it and those after it are given
/// back; on a failure that names none, every one stays the NIC's and the
/// ledger breaks down. Returns the outcome, with how many were posted.
fn account(
    ledger: &mut SrqLedger,
    claimed: &[u32],
    outcome: Result<(), PostFailed>,
) -> Result<usize, PostFailed> {
    match outcome {
        Ok(()) => Ok(claimed.len()),
        Err(PostFailed::Refused { posted, error }) => {
            for &slot in claimed.get(posted..).unwrap_or_default() {
                ledger.give_back(slot);
            }
            Err(PostFailed::Refused { posted, error })
        }
        Err(PostFailed::Unknown(unknown)) => {
            ledger.break_down();
            Err(PostFailed::Unknown(unknown))
        }
    }
}

#[cold]
#[inline(never)]
fn srq_broken(unknown: Indeterminate) -> Error {
    Error::SrqBroken {
        requests: unknown.requests,
        source: errno(unknown.errno),
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    /// A ledger of `slots` with `n` claimed, as a chain about to be
    /// posted: (slot, id) in chain order.
    fn claimed(ledger: &mut SrqLedger, n: usize) -> Vec<(u32, u64)> {
        (0..n)
            .map(|_| ledger.claim().expect("a free slot"))
            .collect()
    }

    fn slots(chain: &[(u32, u64)]) -> Vec<u32> {
        chain.iter().map(|&(s, _)| s).collect()
    }

    #[test]
    fn a_chain_the_srq_took_whole_stays_at_the_nic() {
        let mut ledger = SrqLedger::new(8, 1);
        let chain = claimed(&mut ledger, 5);
        assert_eq!(account(&mut ledger, &slots(&chain), Ok(())).unwrap(), 5);
        assert_eq!((ledger.free(), ledger.at_nic()), (3, 5));
        for (slot, id) in chain {
            assert_eq!(ledger.complete(id), Ok(slot));
        }
    }

    /// The refused receive and those after it are free again, and their
    /// ids never complete; those before it are the NIC's.
    #[test]
    fn a_refusal_naming_a_receive_gives_back_it_and_those_after_it() {
        let mut ledger = SrqLedger::new(8, 1);
        let chain = claimed(&mut ledger, 5);
        let refused = PostFailed::Refused {
            posted: 2,
            error: Error::PostRecv {
                wr_id: chain[2].1,
                posted: 2,
                source: errno(libc::ENOMEM),
            },
        };
        match account(&mut ledger, &slots(&chain), Err(refused)) {
            Err(PostFailed::Refused {
                posted: 2,
                error: Error::PostRecv { wr_id, .. },
            }) => assert_eq!(wr_id, chain[2].1),
            other => panic!("expected the refusal back, got {other:?}"),
        }
        assert_eq!((ledger.free(), ledger.at_nic()), (6, 2));
        for &(slot, id) in &chain[2..] {
            assert_eq!(
                ledger.complete(id),
                Err(Refused::NotPosted { wr_id: id }),
                "slot {slot} was given back"
            );
        }
        for &(slot, id) in &chain[..2] {
            assert_eq!(ledger.complete(id), Ok(slot));
        }
        // The given-back slots are claimed again, in a new lap.
        let again = claimed(&mut ledger, 6);
        for &(slot, id) in &chain[2..] {
            let (_, new_id) = again
                .iter()
                .find(|&&(s, _)| s == slot)
                .expect("a given-back slot is free");
            assert_ne!(*new_id, id, "the same id twice for slot {slot}");
        }
    }

    #[test]
    fn a_refusal_of_the_first_receive_gives_back_the_whole_chain() {
        let mut ledger = SrqLedger::new(4, 1);
        let chain = claimed(&mut ledger, 4);
        let refused = PostFailed::Refused {
            posted: 0,
            error: Error::PostRecv {
                wr_id: chain[0].1,
                posted: 0,
                source: errno(libc::ENOMEM),
            },
        };
        assert!(account(&mut ledger, &slots(&chain), Err(refused)).is_err());
        assert_eq!((ledger.free(), ledger.at_nic()), (4, 0));
    }

    /// A failure naming no receive may have queued all of them: every one
    /// stays the NIC's (its completion still settles it) and nothing more
    /// is claimed.
    #[test]
    fn a_failure_naming_no_receive_keeps_every_one_posted_and_breaks_the_ledger() {
        let mut ledger = SrqLedger::new(8, 1);
        let chain = claimed(&mut ledger, 3);
        let unknown = Indeterminate {
            call: "ibv_post_srq_recv",
            requests: 3,
            errno: libc::EIO,
        };
        match account(
            &mut ledger,
            &slots(&chain),
            Err(PostFailed::Unknown(unknown)),
        ) {
            Err(PostFailed::Unknown(u)) => assert_eq!(u, unknown),
            other => panic!("expected the unknown outcome back, got {other:?}"),
        }
        assert_eq!((ledger.free(), ledger.at_nic()), (5, 3));
        assert!(ledger.is_broken());
        assert_eq!(ledger.claim(), None, "a broken ledger claims nothing");
        for (slot, id) in chain {
            assert_eq!(ledger.complete(id), Ok(slot));
            ledger.release(slot).unwrap();
        }
        assert_eq!(ledger.claim(), None, "released slots stay unposted");
    }

    #[test]
    fn a_broken_ring_says_why_and_that_its_connections_must_move() {
        let err = srq_broken(Indeterminate {
            call: "ibv_post_srq_recv",
            requests: 7,
            errno: libc::EIO,
        });
        assert!(
            matches!(&err, Error::SrqBroken { requests: 7, source } if source.raw_os_error() == Some(libc::EIO)),
            "{err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::ConnectionLost);
        let text = err.to_string();
        assert!(
            text.contains("7 receive(s)") && text.contains("no error state"),
            "{text}"
        );
    }

    #[test]
    fn a_ring_geometry_is_checked_before_any_verb() {
        assert_eq!(ring_bytes(16, 4096, 4).unwrap(), 65536);
        assert_eq!(
            ring_bytes(3, 100, 3).unwrap(),
            300,
            "any depth, not only powers of two"
        );
        let refused = |depth, size, batch| match ring_bytes(depth, size, batch) {
            Err(Error::Setting { .. }) => {}
            other => panic!("({depth}, {size}, {batch}): expected a setting error, got {other:?}"),
        };
        refused(0, 4096, 1);
        refused(16, 0, 1);
        refused(16, 4096, 0);
        refused(16, 4096, 17);
        #[cfg(target_pointer_width = "64")]
        {
            refused(16, 1 << 32, 1);
            refused(u32::MAX, u32::MAX as usize, 1 << 20);
        }
        // The last slot ends at the ring's end.
        assert_eq!(
            slot_offset(15, 4096) + 4096,
            ring_bytes(16, 4096, 4).unwrap()
        );
    }

    /// Compile-time: `SrqRing` is `Send`, and not `Sync` (were it, the
    /// two blanket impls below would both apply and the path be
    /// ambiguous), so one thread at a time posts to its SRQ.
    #[test]
    fn the_ring_moves_to_another_thread_but_is_never_shared() {
        fn send<T: Send>() {}
        send::<SrqRing>();
        trait AmbiguousIfSync<A> {
            fn check() {}
        }
        impl<T: ?Sized> AmbiguousIfSync<()> for T {}
        impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
        <SrqRing as AmbiguousIfSync<_>>::check();
    }
}
