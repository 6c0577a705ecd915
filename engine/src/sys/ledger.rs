//! The accounting behind the queues, as pure data: which send-queue
//! requests are posted and retired, which are signaled, what each one
//! holds, and which ring slots belong to the CPU or to the NIC. Nothing
//! here touches a device, so every rule is unit-tested on any machine.
//!
//! Every send-queue request gets a sequence number (its wr_id). Only some
//! are signaled; on RC a completion for `s` means every request through
//! `s` is done (completions arrive in order, and a flush completes every
//! request), so it retires them all and hands their ring slots back to the
//! CPU. Slots are claimed and released in order, so a ring's owner is
//! told by two positions: `[tail, head)` belongs to the NIC (posted) or to
//! a request being built, the rest to the CPU.
//!
//! The queue never overflows: a request is admitted only while fewer than
//! `depth` are outstanding, and a signal falls at least every `interval`
//! requests, so with `batch_size + interval <= depth` a full queue always
//! holds a signaled request whose completion frees it.
//!
//! Arithmetic: sequence numbers and receive positions stay below
//! [`LEDGER_LIMIT`] (2^61, checked at admission), and every other counter
//! here (slot cursors, retired, done) is at most one of them, so sums of
//! them and the small depths, and differences of a counter and one it
//! never passes, are plain counting: written `wrapping_`, they never wrap.

use std::ops::Range;

use super::wr_id::LEDGER_LIMIT;
use crate::status::WcOpcode;

/// What a request is, for its completion event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum RequestKind {
    #[default]
    Send,
    Write,
    Read,
    /// A zero-length WRITE the engine posts to see whether the peer lives.
    Heartbeat,
    /// A zero-length WRITE posted at close or flush, so a completion
    /// retires the unsignaled requests before it.
    Marker,
}

impl RequestKind {
    /// The opcode its completion reports.
    #[inline]
    pub(crate) fn completion_opcode(self) -> WcOpcode {
        match self {
            RequestKind::Send => WcOpcode::SEND,
            RequestKind::Read => WcOpcode::RDMA_READ,
            RequestKind::Write | RequestKind::Heartbeat | RequestKind::Marker => {
                WcOpcode::RDMA_WRITE
            }
        }
    }

    /// Posted by the engine itself: its completion is bookkeeping.
    #[inline]
    pub(crate) fn is_internal(self) -> bool {
        matches!(self, RequestKind::Heartbeat | RequestKind::Marker)
    }
}

/// What one posted request holds until it retires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Request {
    pub kind: RequestKind,
    pub signaled: bool,
    /// It reads its payload from a send-ring slot.
    pub send_slot: bool,
    /// A READ's data land in a read-ring slot.
    pub read_slot: bool,
    pub read_len: u32,
}

/// A retired request and where its READ data are, if it was a READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    pub request: Request,
    pub read_pos: Option<u64>,
}

/// A request admitted to the send queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub seq: u64,
    pub signaled: bool,
}

/// A completion that names no outstanding request of this queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotOutstanding {
    pub wr_id: u64,
    pub retired: u64,
    pub posted: u64,
}

impl From<NotOutstanding> for crate::error::Error {
    #[cold]
    #[inline(never)]
    fn from(e: NotOutstanding) -> Self {
        crate::error::Error::ForeignCompletion {
            wr_id: e.wr_id,
            retired: e.retired,
            posted: e.posted,
        }
    }
}

/// Slots claimed in order and released in order: `[tail, head)` are taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlotCursor {
    head: u64,
    tail: u64,
}

impl SlotCursor {
    #[inline]
    fn claim(&mut self, count: u64) -> Option<u64> {
        if self.head.wrapping_sub(self.tail) >= count {
            return None;
        }
        let pos = self.head;
        self.head = pos.wrapping_add(1);
        Some(pos)
    }

    /// Whether position `pos` was released and not claimed again since.
    #[inline]
    pub(crate) fn is_free_and_unclaimed(&self, pos: u64, count: u64) -> bool {
        pos < self.tail && pos.wrapping_add(count) >= self.head
    }
}

/// Send-queue accounting: sequence numbers, signaling, per-request
/// records, and the send and read rings' slot cursors.
#[derive(Debug)]
pub(crate) struct Ledger {
    depth: u64,
    interval: u64,
    posted: u64,
    retired: u64,
    /// The sequence number at which the next signal falls by itself.
    next_auto_signal: u64,
    /// A power of two of at least twice the depth: the records of every
    /// outstanding request and of the `interval` before them survive.
    requests: Box<[Request]>,
    slot_count: u64,
    send_slots: SlotCursor,
    read_slots: SlotCursor,
    /// Sequence numbers end below this: [`LEDGER_LIMIT`], or the next one
    /// once the queue is closed to new requests.
    limit: u64,
    /// The first request of the batch being gathered, while one is. A
    /// batch found still open by anything but itself was leaked
    /// (`mem::forget`): its requests never reached the NIC.
    open: Option<u64>,
    /// A poll's callback panicked: the completions that poll had taken
    /// were retired without a verdict, so what they delivered is unknown.
    /// The ledger then admits no more (but markers), and the connection
    /// says why.
    unwound: bool,
}

impl Ledger {
    /// A queue of `depth` requests signaling at least every `interval`,
    /// over rings of `slot_count` slots.
    pub(crate) fn new(depth: u32, interval: u32, slot_count: usize) -> Ledger {
        assert!(depth > 0 && interval > 0 && interval <= depth);
        let table = (depth as usize).saturating_mul(2).next_power_of_two();
        Ledger {
            depth: depth.into(),
            interval: interval.into(),
            posted: 0,
            retired: 0,
            next_auto_signal: u64::from(interval).wrapping_sub(1),
            requests: vec![Request::default(); table].into_boxed_slice(),
            slot_count: slot_count as u64,
            send_slots: SlotCursor::default(),
            read_slots: SlotCursor::default(),
            limit: LEDGER_LIMIT,
            open: None,
            unwound: false,
        }
    }

    /// Starts gathering a batch (forgetting a leaked one first); returns
    /// its first sequence number.
    #[inline]
    pub(crate) fn open_batch(&mut self) -> u64 {
        self.forget_leaked_batch();
        self.open = Some(self.posted);
        self.posted
    }

    /// The batch was posted, or dropped and rolled back.
    #[inline]
    pub(crate) fn close_batch(&mut self) {
        self.open = None;
    }

    /// Rolls back a batch that was leaked instead of posted or dropped, so
    /// its requests hold no room, no slot and no place in a wait: they
    /// never reached the NIC. Called wherever the queue is used outside a
    /// batch, which a live batch's borrow rules out.
    #[inline(always)]
    pub(crate) fn forget_leaked_batch(&mut self) {
        if self.open.is_some() {
            self.forget_leaked_batch_now();
        }
    }

    #[cold]
    #[inline(never)]
    fn forget_leaked_batch_now(&mut self) {
        if let Some(first) = self.open.take() {
            self.rollback_to(first);
        }
    }

    /// Requests handed to the NIC: those admitted, but a leaked batch's.
    #[inline]
    pub(crate) fn committed(&self) -> u64 {
        self.open.unwrap_or(self.posted)
    }

    /// Requests handed to the NIC and not yet retired (what the caller
    /// sees as outstanding; a leaked batch's do not count).
    #[inline]
    pub(crate) fn in_flight(&self) -> u64 {
        self.committed().wrapping_sub(self.retired)
    }

    /// Admits no more requests but markers ([`Ledger::admit_marker`]).
    pub(crate) fn close(&mut self) {
        self.limit = 0;
    }

    #[inline]
    fn record(&mut self, seq: u64) -> &mut Request {
        let mask = self.requests.len().wrapping_sub(1);
        &mut self.requests[seq as usize & mask]
    }

    /// The record of `seq` (valid while it is outstanding).
    #[inline]
    pub(crate) fn request(&self, seq: u64) -> Request {
        self.requests[seq as usize & self.requests.len().wrapping_sub(1)]
    }

    #[inline]
    pub(crate) fn outstanding(&self) -> u64 {
        self.posted.wrapping_sub(self.retired)
    }

    #[inline]
    pub(crate) fn room(&self) -> u64 {
        // Never wraps: at most `depth` are outstanding.
        self.depth.wrapping_sub(self.outstanding())
    }

    #[inline]
    pub(crate) fn posted(&self) -> u64 {
        self.posted
    }

    #[cfg(feature = "engine")]
    /// The most requests outstanding at once (the send queue's depth).
    pub(crate) fn depth(&self) -> u64 {
        self.depth
    }

    #[inline]
    pub(crate) fn retired(&self) -> u64 {
        self.retired
    }

    /// The newest signaled request, if any was admitted.
    #[inline]
    fn last_signaled(&self) -> Option<u64> {
        self.next_auto_signal.checked_sub(self.interval)
    }

    /// Whether a completion is still coming that retires every request
    /// before it (a signaled request is outstanding): what keeps a full
    /// queue from deadlocking, which the tests check.
    #[cfg(test)]
    pub(crate) fn signal_in_flight(&self) -> bool {
        self.last_signaled().is_some_and(|s| s >= self.retired)
    }

    /// Whether a completion is coming that retires every outstanding
    /// request: the newest one is signaled. (A signal in flight behind
    /// unsignaled requests retires only those before it.)
    #[inline]
    pub(crate) fn tail_signaled(&self) -> bool {
        self.outstanding() > 0 && self.last_signaled() == self.posted.checked_sub(1)
    }

    /// Admits one more request of `kind`: its sequence number and whether
    /// it is signaled (forced, or the interval's turn). `None` when the
    /// queue is full: reap completions, then retry. Sequence numbers stay
    /// below [`LEDGER_LIMIT`] (2^61 requests: centuries at any rate), so
    /// no tagged id is ever taken for one.
    #[inline]
    pub(crate) fn admit(&mut self, kind: RequestKind, must_signal: bool) -> Option<Admitted> {
        self.admit_below(self.limit, kind, must_signal)
    }

    /// Admits a signaled marker (a heartbeat, or the WRITE whose completion
    /// retires the requests before it), also once the queue is closed.
    pub(crate) fn admit_marker(&mut self, kind: RequestKind) -> Option<Admitted> {
        debug_assert!(kind.is_internal());
        self.admit_below(LEDGER_LIMIT, kind, true)
    }

    #[inline(always)]
    fn admit_below(
        &mut self,
        limit: u64,
        kind: RequestKind,
        must_signal: bool,
    ) -> Option<Admitted> {
        if self.outstanding() >= self.depth || self.posted >= limit {
            return None;
        }
        let seq = self.posted;
        let signaled = must_signal || seq >= self.next_auto_signal;
        if signaled {
            self.next_auto_signal = seq.wrapping_add(self.interval);
        }
        self.posted = seq.wrapping_add(1);
        *self.record(seq) = Request {
            kind,
            signaled,
            ..Request::default()
        };
        Some(Admitted { seq, signaled })
    }

    /// Claims the next send-ring slot for admitted request `seq`: its
    /// position, or `None` when every slot is the NIC's.
    /// Slots are claimed for the newest request only, so in order of
    /// sequence numbers.
    #[inline]
    pub(crate) fn claim_send_slot(&mut self, seq: u64) -> Option<u64> {
        debug_assert_eq!(seq.wrapping_add(1), self.posted, "claims follow admission");
        let pos = self.send_slots.claim(self.slot_count)?;
        self.record(seq).send_slot = true;
        Some(pos)
    }

    /// Claims the next read-ring slot for admitted READ `seq` of `len` bytes
    /// (the newest request, as for [`Ledger::claim_send_slot`]).
    #[inline]
    pub(crate) fn claim_read_slot(&mut self, seq: u64, len: u32) -> Option<u64> {
        debug_assert_eq!(seq.wrapping_add(1), self.posted, "claims follow admission");
        let pos = self.read_slots.claim(self.slot_count)?;
        let record = self.record(seq);
        record.read_slot = true;
        record.read_len = len;
        Some(pos)
    }

    /// Forgets every request from `seq` on — admitted but never posted, or
    /// refused by the provider — and gives their slots back (they are the
    /// newest claims, so this is exact).
    pub(crate) fn rollback_to(&mut self, seq: u64) {
        assert!(
            seq >= self.retired && seq <= self.posted,
            "rollback to {seq} outside [{}, {}]",
            self.retired,
            self.posted
        );
        for s in seq..self.posted {
            let r = self.request(s);
            // Each rolled-back claim was counted in its head.
            self.send_slots.head = self.send_slots.head.wrapping_sub(u64::from(r.send_slot));
            self.read_slots.head = self.read_slots.head.wrapping_sub(u64::from(r.read_slot));
        }
        self.posted = seq;
        // The newest signaled request left, within one interval back.
        let floor = seq.saturating_sub(self.interval);
        self.next_auto_signal = (floor..seq)
            .rev()
            .find(|s| self.request(*s).signaled)
            .map_or(
                if seq < self.interval {
                    self.interval.wrapping_sub(1)
                } else {
                    seq
                },
                |s| s.wrapping_add(self.interval),
            );
    }

    /// A completion for `seq` arrived: every request through it is done.
    /// Returns the sequence numbers newly retired, which the caller must
    /// [`release`](Ledger::release) in order — all of them, also when it
    /// is interrupted (see `retire_walk` and `SendWalk` in
    /// `send_queue.rs`). A sequence number outside the outstanding ones
    /// (not this queue's, or retired already) changes nothing.
    #[inline]
    pub(crate) fn retire_through(&mut self, seq: u64) -> Result<Range<u64>, NotOutstanding> {
        if seq < self.retired || seq >= self.posted {
            return Err(NotOutstanding {
                wr_id: seq,
                retired: self.retired,
                posted: self.posted,
            });
        }
        let from = self.retired;
        self.retired = seq.wrapping_add(1);
        Ok(from..self.retired)
    }

    /// A poll's callback panicked (see the `unwound` field).
    #[cold]
    pub(crate) fn unwound(&mut self) {
        self.unwound = true;
        self.close();
    }

    /// Whether a poll's callback panicked.
    pub(crate) fn is_unwound(&self) -> bool {
        self.unwound
    }

    /// Hands the slots of retired request `seq` back to the CPU; called for
    /// each retired sequence number, oldest first.
    #[inline]
    pub(crate) fn release(&mut self, seq: u64) -> Released {
        debug_assert!(seq < self.retired);
        let request = self.request(seq);
        // Neither wraps: the tails count released claims, at most the heads.
        let send_tail = self
            .send_slots
            .tail
            .wrapping_add(u64::from(request.send_slot));
        self.send_slots.tail = send_tail;
        let read_pos = request.read_slot.then_some(self.read_slots.tail);
        let read_tail = self
            .read_slots
            .tail
            .wrapping_add(u64::from(request.read_slot));
        self.read_slots.tail = read_tail;
        Released { request, read_pos }
    }

    /// Whether read-ring position `pos` holds finished data that no later
    /// READ has claimed.
    #[inline]
    pub(crate) fn read_slot_is_readable(&self, pos: u64) -> bool {
        self.read_slots.is_free_and_unclaimed(pos, self.slot_count)
    }

    /// Send-ring and read-ring slots taken (claimed and not released).
    #[cfg(test)]
    pub(crate) fn slots_in_use(&self) -> (u64, u64) {
        (
            self.send_slots.head.wrapping_sub(self.send_slots.tail),
            self.read_slots.head.wrapping_sub(self.read_slots.tail),
        )
    }
}

/// Receive-queue accounting: receives are posted at positions in order
/// (position = wr_id, slot = position mod depth) and complete in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvLedger {
    depth: u64,
    posted: u64,
    done: u64,
    /// A poll's callback panicked while receives were handed on: the
    /// receives that poll took after it were completed unseen, so the
    /// queue hands on nothing more (what comes next would hide the gap).
    unwound: bool,
}

impl RecvLedger {
    pub(crate) fn new(depth: usize) -> RecvLedger {
        RecvLedger {
            depth: depth as u64,
            posted: 0,
            done: 0,
            unwound: false,
        }
    }

    /// A poll's callback panicked (see the `unwound` field).
    #[cold]
    pub(crate) fn unwound(&mut self) {
        self.unwound = true;
    }

    /// Whether a poll's callback panicked while handed receives.
    #[inline]
    pub(crate) fn is_unwound(&self) -> bool {
        self.unwound
    }

    /// Positions to post so that `depth` receives are outstanding; never
    /// [`LEDGER_LIMIT`] or above, so no tagged id is taken for one.
    #[inline]
    pub(crate) fn wanted(&self) -> Range<u64> {
        self.posted..self.done.wrapping_add(self.depth).min(LEDGER_LIMIT)
    }

    #[inline]
    pub(crate) fn outstanding(&self) -> u64 {
        self.posted.wrapping_sub(self.done)
    }

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.outstanding() == self.depth
    }

    /// `n` receives from [`wanted`](RecvLedger::wanted)'s start reached
    /// the queue (a partial post counts only those the provider took).
    #[inline]
    pub(crate) fn posted(&mut self, n: u64) {
        debug_assert!(self.posted.wrapping_add(n) <= self.wanted().end);
        self.posted = self.posted.wrapping_add(n);
    }

    /// A receive completion named `wr_id`: the oldest outstanding receive
    /// (RC receive queues complete in order), or not ours.
    #[inline]
    pub(crate) fn complete(&mut self, wr_id: u64) -> Result<u64, NotOutstanding> {
        if wr_id != self.done || self.done == self.posted {
            return Err(self.refusal(wr_id));
        }
        self.done = self.done.wrapping_add(1);
        Ok(wr_id)
    }

    /// How a completion naming `wr_id` is refused: not an outstanding
    /// receive of this queue.
    pub(crate) fn refusal(&self, wr_id: u64) -> NotOutstanding {
        NotOutstanding {
            wr_id,
            retired: self.done,
            posted: self.posted,
        }
    }

    /// Whether the slot of completed position `pos` is still the CPU's:
    /// its receive completed and no later receive was posted into it.
    #[inline]
    pub(crate) fn is_readable(&self, pos: u64) -> bool {
        pos < self.done && pos.wrapping_add(self.depth) >= self.posted
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    fn admit_n(l: &mut Ledger, n: u64) -> Vec<Admitted> {
        (0..n)
            .map(|_| l.admit(RequestKind::Write, false).unwrap())
            .collect()
    }

    #[test]
    fn every_kth_request_is_signaled_and_a_forced_one_restarts_the_count() {
        let mut l = Ledger::new(64, 4, 8);
        let signals: Vec<bool> = admit_n(&mut l, 8).iter().map(|a| a.signaled).collect();
        assert_eq!(
            signals,
            [false, false, false, true, false, false, false, true]
        );
        assert!(l.admit(RequestKind::Send, true).unwrap().signaled);
        let next: Vec<bool> = admit_n(&mut l, 4).iter().map(|a| a.signaled).collect();
        assert_eq!(
            next,
            [false, false, false, true],
            "counted from the forced one"
        );
    }

    #[test]
    fn the_queue_never_overflows_and_a_completion_retires_everything_before_it() {
        let mut l = Ledger::new(8, 4, 8);
        admit_n(&mut l, 8);
        assert_eq!(l.admit(RequestKind::Write, false), None, "full");
        assert_eq!(l.retire_through(3), Ok(0..4));
        assert_eq!(l.room(), 4);
        assert!(l.retire_through(3).is_err(), "nothing twice");
        assert_eq!(l.retire_through(7), Ok(4..8));
        assert_eq!(l.outstanding(), 0);
    }

    #[test]
    fn a_leaked_batch_holds_no_room_and_no_slot_once_the_queue_is_used_again() {
        let mut l = Ledger::new(8, 4, 8);
        admit_n(&mut l, 2);
        // A batch fills the queue, claims a slot, and is leaked.
        assert_eq!(l.open_batch(), 2);
        let leaked = admit_n(&mut l, 6);
        assert!(l.claim_send_slot(leaked[5].seq).is_some());
        assert_eq!(l.room(), 0);
        assert_eq!((l.in_flight(), l.committed()), (2, 2), "never handed over");
        l.forget_leaked_batch();
        assert_eq!((l.outstanding(), l.room(), l.posted()), (2, 6, 2));
        assert_eq!(l.slots_in_use().0, 0, "its slot came back");
        // The next batch starts where the leaked one did, and closes.
        assert_eq!(l.open_batch(), 2);
        admit_n(&mut l, 1);
        l.close_batch();
        l.forget_leaked_batch();
        assert_eq!(l.outstanding(), 3, "a posted batch is never forgotten");
    }

    #[test]
    fn a_completion_that_is_not_outstanding_retires_nothing() {
        let mut l = Ledger::new(8, 4, 8);
        admit_n(&mut l, 3);
        // A wr_id beyond what was posted (another queue's, a low-level
        // post's) must not retire — and so free the slots of — requests
        // the NIC still owns.
        let err = l.retire_through(1 << 63).unwrap_err();
        assert_eq!((err.retired, err.posted), (0, 3));
        assert_eq!(l.outstanding(), 3);
    }

    #[test]
    fn a_full_queue_always_holds_a_signaled_request() {
        let (depth, k, batch) = (16u32, 4u32, 12u64);
        let mut l = Ledger::new(depth, k, 8);
        for round in 0..1000u64 {
            let n = 1 + (round % batch);
            if l.room() < n {
                assert!(
                    l.signal_in_flight(),
                    "round {round}: a full queue with no signaled request would deadlock"
                );
                let newest = (l.retired()..l.posted())
                    .rev()
                    .find(|s| l.request(*s).signaled)
                    .unwrap();
                l.retire_through(newest).unwrap();
                continue;
            }
            admit_n(&mut l, n);
        }
    }

    #[test]
    fn slots_go_back_to_the_cpu_only_when_their_request_retires() {
        let mut l = Ledger::new(8, 8, 2);
        let a = l.admit(RequestKind::Write, false).unwrap();
        assert_eq!(l.claim_send_slot(a.seq), Some(0));
        let b = l.admit(RequestKind::Read, true).unwrap();
        assert_eq!(l.claim_read_slot(b.seq, 100), Some(0));
        let c = l.admit(RequestKind::Write, false).unwrap();
        assert_eq!(l.claim_send_slot(c.seq), Some(1));
        let d = l.admit(RequestKind::Write, false).unwrap();
        assert_eq!(
            l.claim_send_slot(d.seq),
            None,
            "both send slots are the NIC's"
        );
        l.rollback_to(d.seq);
        assert!(!l.read_slot_is_readable(0), "the READ is in flight");
        let retired = l.retire_through(b.seq).unwrap();
        let released: Vec<Released> = retired.map(|s| l.release(s)).collect();
        assert_eq!(released[1].read_pos, Some(0));
        assert_eq!(released[1].request.read_len, 100);
        assert!(l.read_slot_is_readable(0));
        assert_eq!(l.slots_in_use(), (1, 0));
        // A later READ takes the slot: its old data are no longer readable.
        let e = l.admit(RequestKind::Read, true).unwrap();
        assert_eq!(l.claim_read_slot(e.seq, 8), Some(1));
        let f = l.admit(RequestKind::Read, true).unwrap();
        assert_eq!(l.claim_read_slot(f.seq, 8), Some(2));
        assert!(!l.read_slot_is_readable(0), "position 2 reuses slot 0");
    }

    #[test]
    fn a_batch_refused_part_way_keeps_exactly_what_was_posted() {
        // A batch of five: a SEND from a slot, a READ, three WRITEs from
        // slots; the provider takes the first two and refuses the third.
        let mut l = Ledger::new(16, 4, 8);
        let first = l.posted();
        let s = l.admit(RequestKind::Send, false).unwrap();
        l.claim_send_slot(s.seq).unwrap();
        let r = l.admit(RequestKind::Read, true).unwrap();
        l.claim_read_slot(r.seq, 64).unwrap();
        for _ in 0..3 {
            let w = l.admit(RequestKind::Write, false).unwrap();
            l.claim_send_slot(w.seq).unwrap();
        }
        assert_eq!(l.slots_in_use(), (4, 1));
        let posted_by_provider = 2;
        l.rollback_to(first + posted_by_provider);
        assert_eq!(l.posted(), 2);
        assert_eq!(
            l.slots_in_use(),
            (1, 1),
            "the refused WRITEs' slots came back"
        );
        // The next request gets the next sequence number and the freed slot.
        let next = l.admit(RequestKind::Write, false).unwrap();
        assert_eq!(next.seq, 2);
        assert_eq!(l.claim_send_slot(next.seq), Some(1));
    }

    #[test]
    fn a_rollback_restores_the_signal_rhythm() {
        let mut l = Ledger::new(32, 4, 8);
        admit_n(&mut l, 6); // signaled: 3
        l.rollback_to(5);
        // Signals continue at 3 + 4 = 7 as if 5 had never been admitted.
        let signals: Vec<(u64, bool)> = admit_n(&mut l, 3)
            .iter()
            .map(|a| (a.seq, a.signaled))
            .collect();
        assert_eq!(signals, [(5, false), (6, false), (7, true)]);
        // Rolled back to before any signal: the first K-1 stay unsignaled.
        let mut l = Ledger::new(32, 4, 8);
        admit_n(&mut l, 5);
        l.rollback_to(1);
        let signals: Vec<bool> = admit_n(&mut l, 3).iter().map(|a| a.signaled).collect();
        assert_eq!(signals, [false, false, true]);
        // A rolled-back signal leaves an unsignaled tail that needs one.
        let mut l = Ledger::new(32, 4, 8);
        admit_n(&mut l, 4);
        l.rollback_to(3);
        assert!(!l.signal_in_flight());
    }

    #[test]
    fn only_a_signaled_newest_request_covers_the_tail() {
        let mut l = Ledger::new(16, 4, 8);
        assert!(!l.tail_signaled(), "nothing outstanding");
        l.admit(RequestKind::Read, true).unwrap();
        assert!(l.tail_signaled());
        admit_n(&mut l, 2);
        // The READ's completion is coming, but it retires only the READ:
        // the two behind it need a signal of their own.
        assert!(l.signal_in_flight());
        assert!(!l.tail_signaled());
        // The interval's own signal (seq 4) covers them again.
        admit_n(&mut l, 2);
        assert!(l.tail_signaled());
        l.retire_through(4).unwrap();
        assert!(!l.tail_signaled(), "nothing outstanding");
    }

    #[test]
    fn receives_refused_part_way_are_posted_again_into_the_same_slots() {
        let mut r = RecvLedger::new(4);
        assert_eq!(r.wanted(), 0..4);
        // The provider takes 2 of 4: positions 2 and 3 are still wanted,
        // so no two receives ever share a slot.
        r.posted(2);
        assert_eq!(r.wanted(), 2..4);
        r.posted(2);
        assert!(r.is_full());
        assert_eq!(r.complete(0), Ok(0));
        assert!(r.is_readable(0));
        assert_eq!(r.wanted(), 4..5);
        r.posted(1);
        assert!(!r.is_readable(0), "position 4 is slot 0 again");
    }

    #[test]
    fn receive_completions_must_come_in_order_and_be_ours() {
        let mut r = RecvLedger::new(4);
        r.posted(3);
        assert!(r.complete(1).is_err(), "out of order");
        assert!(r.complete(u64::MAX).is_err(), "not a position of ours");
        assert_eq!(r.complete(0), Ok(0));
        assert_eq!(r.complete(1), Ok(1));
        assert_eq!(r.complete(2), Ok(2));
        assert!(r.complete(3).is_err(), "nothing outstanding");
        assert_eq!(r.outstanding(), 0);
    }
}
