//! A connection's receive queue: a ring of receive slots, one posted
//! receive per slot, re-posted in batches — the only code that moves a
//! receive slot between the NIC and the CPU.
//!
//! A slot is the NIC's from the post of its receive until that receive's
//! completion; then it is the CPU's until the receive for the same slot
//! one lap later is posted. Views of a slot are made only in between, and
//! posting needs `&mut self`, so no view outlives its slot's turn.

use super::cq::{Reaped, Reaper, WorkCompletion, POLL_BATCH};
use super::layout::SlotLayout;
use super::ledger::RecvLedger;
use super::mr::{LocalSlice, Registration};
use super::qp::QueuePair;
use super::send_queue::other_queues_completions;
use super::wr::{Indeterminate, PostFailed, RecvChain};
use crate::error::Result;
use crate::status::{WcOpcode, WcStatus};

/// A receive completion, copied out of the CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The receive's position (its wr_id).
    pub pos: u64,
    pub status: WcStatus,
    pub vendor_err: u32,
    /// Bytes received (WRITE_WITH_IMM: bytes written to the target).
    pub len: u32,
    pub imm: Option<u32>,
    /// A WRITE_WITH_IMM, whose bytes went to the target ring, not here.
    pub write_imm: bool,
}

/// The receive queue of one connection.
pub(crate) struct RecvQueue {
    chain: RecvChain,
    ledger: RecvLedger,
    ring: Registration,
    layout: SlotLayout,
    /// The poller of the CQ this queue's completions arrive on, its own:
    /// what it reaps needs no check that it is this queue's.
    cq: Reaper,
    /// A post failed without saying which receive it refused: every one
    /// counts as posted, the QP is in ERR, and no more are posted.
    broken: Option<Indeterminate>,
}

impl std::fmt::Debug for RecvQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvQueue")
            .field("ledger", &self.ledger)
            .field("layout", &self.layout)
            .finish()
    }
}

impl RecvQueue {
    /// One receive per slot of `layout` in `ring`, posted in batches of up
    /// to `batch`.
    pub(crate) fn new(
        cq: Reaper,
        ring: Registration,
        layout: SlotLayout,
        batch: usize,
    ) -> RecvQueue {
        assert!(ring.len() >= layout.bytes());
        RecvQueue {
            chain: RecvChain::new(batch.min(layout.count())),
            ledger: RecvLedger::new(layout.count()),
            ring,
            layout,
            cq,
            broken: None,
        }
    }

    /// The ring, given up (its receives may still be queued).
    pub(crate) fn into_ring(self) -> Registration {
        self.ring
    }

    /// The post that broke the queue, if one did.
    pub(crate) fn broken(&self) -> Option<Indeterminate> {
        self.broken
    }

    /// Receives posted and not yet completed.
    #[inline]
    pub(crate) fn outstanding(&self) -> u64 {
        self.ledger.outstanding()
    }

    /// Receives posted since the start.
    #[cfg(test)]
    pub(crate) fn receives_posted(&self) -> u64 {
        self.ledger.wanted().start
    }

    /// Whether some completed receives wait to be posted again.
    #[inline]
    pub(crate) fn needs_refill(&self) -> bool {
        !self.ledger.is_full()
    }

    /// Posts receives until every slot has one, in batches. When the
    /// provider refuses part way, what it took counts as posted and the
    /// rest is posted again by the next call. When it fails without saying
    /// which it refused, every receive of the call counts as posted (each
    /// slot stays the NIC's until its receive completes), the QP goes to
    /// ERR so that they all complete, and no more receives are posted.
    pub(crate) fn refill(&mut self, qp: &mut QueuePair) -> Result<()> {
        if let Some(broken) = self.broken {
            return Err(broken.error());
        }
        loop {
            let wanted = self.ledger.wanted();
            // Never wraps: what is wanted is never less than what is posted.
            let n = wanted
                .end
                .wrapping_sub(wanted.start)
                .min(self.chain.capacity() as u64) as usize;
            if n == 0 {
                return Ok(());
            }
            for (i, pos) in (wanted.start..wanted.start.wrapping_add(n as u64)).enumerate() {
                let range = self.layout.range(pos, self.layout.size());
                let slot = LocalSlice {
                    // Never wraps: the range is inside the ring's mapping.
                    addr: self.ring.addr().wrapping_add(range.start as u64),
                    len: range.len() as u32,
                    lkey: self.ring.lkey(),
                };
                self.chain.patch(i, pos, Some(slot));
            }
            // SAFETY: each position's slot is the CPU's (its previous
            // receive completed, per the ledger) and becomes the NIC's now;
            // no view of it exists, as views borrow self and this takes
            // &mut self.
            match unsafe { self.chain.post(qp, n) } {
                Ok(()) => self.ledger.posted(n as u64),
                Err(PostFailed::Refused { posted, error }) => {
                    self.ledger.posted(posted as u64);
                    return Err(error);
                }
                Err(PostFailed::Unknown(unknown)) => {
                    self.ledger.posted(n as u64);
                    qp.fail();
                    return Err(self.broken.get_or_insert(unknown).error());
                }
            }
        }
    }

    /// Polls this queue's own CQ for up to `max` receive completions (at
    /// most [`POLL_BATCH`]): see [`settle`](Self::settle). No check: the
    /// queue owns its CQ's poller, so every completion it reaps is its CQ's.
    #[inline]
    pub(crate) fn poll(&mut self, max: usize, on: impl FnMut(Arrival, &[u8])) -> Result<usize> {
        let reaped = self.cq.reap(max.min(POLL_BATCH))?;
        settle_walk(&mut self.ledger, &self.ring, self.layout, reaped.wcs(), on)
    }

    /// [`poll`](Self::poll), showing the test what it reaped before the
    /// queue settles it: a test hands another queue these completions
    /// (which it must refuse) without taking them from this one.
    #[cfg(test)]
    pub(crate) fn poll_shown(
        &mut self,
        max: usize,
        show: impl FnOnce(Reaped<'_>),
        on: impl FnMut(Arrival, &[u8]),
    ) -> Result<usize> {
        let reaped = self.cq.reap(max.min(POLL_BATCH))?;
        show(reaped);
        settle_walk(&mut self.ledger, &self.ring, self.layout, reaped.wcs(), on)
    }

    /// Completes the receives `reaped` names and hands each to `on` with
    /// its bytes (empty for WRITE_WITH_IMM and failed receives). Returns
    /// how many completions there were; one that names no outstanding
    /// receive of this ring (another poster's) is passed over, and
    /// reported as [`crate::Error::ForeignCompletion`] once the others
    /// were handed on. Completions polled from another CQ than this
    /// queue's (which must be its alone) are refused whole, none believed.
    ///
    /// Should `on` panic, the walk's guard still completes every receive
    /// the completions name, so the ledger never waits for one that was
    /// polled already; those after the panicking one were never handed
    /// on, and the queue says so ([`is_unwound`](Self::is_unwound)).
    #[inline]
    #[expect(
        dead_code,
        reason = "issue 25's poller of many connections builds on it"
    )]
    pub(crate) fn settle(
        &mut self,
        reaped: Reaped<'_>,
        on: impl FnMut(Arrival, &[u8]),
    ) -> Result<usize> {
        if reaped.cq() != self.cq.id() {
            return Err(other_queues_completions());
        }
        settle_walk(&mut self.ledger, &self.ring, self.layout, reaped.wcs(), on)
    }

    /// Whether a poll's callback panicked while handed receives: the
    /// receives that poll took after the panicking one were consumed
    /// unseen.
    #[inline]
    pub(crate) fn is_unwound(&self) -> bool {
        self.ledger.is_unwound()
    }

    /// The bytes a successful SEND delivered into `arrival`'s slot, while
    /// that slot is still the CPU's (empty otherwise).
    #[inline]
    pub(crate) fn data(&self, arrival: &Arrival) -> &[u8] {
        if !self.ledger.is_readable(arrival.pos) {
            return &[];
        }
        bytes(&self.ring, self.layout, arrival)
    }
}

/// [`RecvQueue::settle`]'s walk over completions known to be of the
/// queue's CQ, whose receives land in `ring` (of `layout`). A function of
/// the queue's parts, not a method, so that `poll` can walk what its own
/// poller reaped while that poller stays borrowed. Its callers (`poll`,
/// `settle`) must pass: `wcs` polled from the CQ of the queue pair that
/// `ledger`'s receives were posted to; the ring whose slots `ledger`
/// numbers; and parts of a queue they hold `&mut` until it returns, so no
/// receive is posted again while `on` sees its slot.
#[inline(always)]
fn settle_walk(
    ledger: &mut RecvLedger,
    ring: &Registration,
    layout: SlotLayout,
    wcs: &[WorkCompletion],
    mut on: impl FnMut(Arrival, &[u8]),
) -> Result<usize> {
    let n = wcs.len();
    let mut walk = RecvWalk { ledger, rest: wcs };
    let mut foreign = None;
    while let Some((wc, rest)) = walk.rest.split_first() {
        walk.rest = rest;
        match walk.ledger.complete(wc.wr_id()) {
            Ok(pos) => {
                let arrival = describe(wc, pos);
                on(arrival, bytes(ring, layout, &arrival));
            }
            Err(e) => {
                foreign.get_or_insert(e);
            }
        }
    }
    std::mem::forget(walk);
    match foreign {
        None => Ok(n),
        Some(e) => Err(e.into()),
    }
}

/// The bytes a successful SEND delivered into `arrival`'s slot of `ring`
/// (empty otherwise). The caller makes sure the slot is the CPU's: its
/// receive completed and it is not posted again while the slice lives.
#[inline(always)]
fn bytes<'r>(ring: &'r Registration, layout: SlotLayout, arrival: &Arrival) -> &'r [u8] {
    if arrival.write_imm || arrival.status != WcStatus::SUCCESS {
        return &[];
    }
    let len = (arrival.len as usize).min(layout.size());
    let range = layout.range(arrival.pos, len);
    // SAFETY: the receive at `pos` completed (the ledger checked its
    // completion, or `data` checked is_readable), so the NIC is done
    // writing the slot, and its next receive is posted only by `refill`,
    // which needs &mut of the queue: `data` borrows the queue for the
    // slice's life, and `settle_walk`'s callers hold the queue's &mut
    // while `on`, which cannot keep the slice, runs. The range
    // is inside the ring (`new` checked its size).
    unsafe { std::slice::from_raw_parts(ring.at(range.start), range.len()) }
}

/// Where `RecvQueue::poll` is in the completions it took. Dropped only by
/// a panic in the caller's callback (the walk forgets it otherwise), it
/// completes the receives the rest name, so the ledger never lags the NIC,
/// and marks the queue unwound: they were consumed unseen.
struct RecvWalk<'a> {
    ledger: &'a mut RecvLedger,
    rest: &'a [WorkCompletion],
}

impl Drop for RecvWalk<'_> {
    #[cold]
    fn drop(&mut self) {
        for wc in self.rest {
            let _ = self.ledger.complete(wc.wr_id());
        }
        self.ledger.unwound();
    }
}

#[inline(always)]
fn describe(wc: &WorkCompletion, pos: u64) -> Arrival {
    let status = wc.status();
    let success = status == WcStatus::SUCCESS;
    Arrival {
        pos,
        status,
        vendor_err: wc.vendor_err(),
        len: wc.byte_len(),
        imm: if success { wc.imm() } else { None },
        write_imm: success && wc.opcode() == WcOpcode::RECV_RDMA_WITH_IMM,
    }
}
