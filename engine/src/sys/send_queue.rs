//! A connection's send queue: posting (one request or a batch, one
//! doorbell), and polling its completions — the only code that moves a
//! send-ring or read-ring slot between the CPU and the NIC.
//!
//! A slot is the CPU's until the request that claimed it is posted, and
//! the NIC's until that request retires ([`Ledger`]); retirement happens
//! only here, for a completion polled from this queue's CQ that names one
//! of its requests (its wr_ids: [`super::send_names`]). So a
//! send-ring slot is written only before its post, and a read-ring slot
//! is read only after its READ completed and before a later READ takes it.
//! A caller's own [`MemoryRegion`] that a request sends from is moved
//! into the queue ([`LentRegions`]) and handed back only once that
//! request retired.

use std::marker::PhantomData;

use super::cq::{Reaped, Reaper, WorkCompletion};
use super::layout::SlotLayout;
use super::ledger::{Admitted, Ledger, Request, RequestKind};
use super::lent::LentRegions;
use super::mr::{LocalSlice, Registration, RemoteSlice};
use super::qp::QueuePair;
use super::region::{MemoryRegion, RegionRefused};
use super::send_names::{Naming, OwnCq};
use super::wr::{Indeterminate, Payload, PostFailed, SendChain, SendOpcode, SendRequest};
use crate::error::{Error, Remedy, Result};
use crate::status::WcStatus;

pub(crate) use super::cq::POLL_BATCH;

/// A SEND or an RDMA WRITE, the operations that carry a payload out.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outbound {
    Send,
    Write {
        remote: RemoteSlice,
        imm: Option<u32>,
    },
}

impl Outbound {
    #[inline(always)]
    fn parts(self) -> (SendOpcode, RemoteSlice, RequestKind) {
        match self {
            Outbound::Send => (SendOpcode::Send, RemoteSlice::default(), RequestKind::Send),
            Outbound::Write { remote, imm } => (
                imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm),
                remote,
                RequestKind::Write,
            ),
        }
    }
}

/// A posted READ: where its data will be readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadTicket {
    pub seq: u64,
    pos: u64,
    len: u32,
}

/// One request retired by a completion.
#[derive(Debug)]
pub(crate) struct Retired<'a> {
    pub seq: u64,
    pub request: Request,
    /// This request is the one the completion names (the others before it
    /// retired with it, completed silently or flushed).
    pub named: bool,
    pub status: WcStatus,
    pub vendor_err: u32,
    /// A READ's data, when this is its own successful completion.
    pub read: Option<&'a [u8]>,
}

/// The send queue of one connection: on a CQ of its own (`OwnCq`, a
/// [`Connection`](crate::Connection)'s) or on one it shares with the other
/// connections of a poller (`PooledIds`).
pub(crate) struct SendQueue<N: Naming = OwnCq> {
    chain: SendChain,
    ledger: Ledger,
    send_ring: Registration,
    read_ring: Registration,
    layout: SlotLayout,
    inline_threshold: usize,
    /// What the queue holds of the CQ its completions arrive on: its
    /// poller, when the CQ is its own (what it reaps needs no check that it
    /// is this queue's), or the brand of a CQ it shares.
    cq: N::Cq,
    /// How its requests are named in their wr_ids.
    names: N,
    /// Regions requests send from, until those requests retire.
    lent: LentRegions,
    /// A post failed without saying which request it refused: every
    /// request of it counts as posted, the QP is in ERR, and the ledger
    /// admits no more (but the markers that retire what is left).
    broken: Option<Indeterminate>,
}

impl<N: Naming> std::fmt::Debug for SendQueue<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue")
            .field("ledger", &self.ledger)
            .field("layout", &self.layout)
            .finish()
    }
}

impl SendQueue<OwnCq> {
    /// `depth` requests, signaled at least every `interval`, batches of up
    /// to `batch` requests; payloads up to `inline_threshold` go inline,
    /// larger ones through `send_ring`; READs land in `read_ring`. Both
    /// rings have `layout`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cq: Reaper,
        send_ring: Registration,
        read_ring: Registration,
        layout: SlotLayout,
        depth: u32,
        interval: u32,
        batch: usize,
        inline_threshold: usize,
    ) -> SendQueue {
        let rings = (send_ring, read_ring, layout);
        SendQueue::named(cq, OwnCq, rings, depth, interval, batch, inline_threshold)
    }

    /// Polls this queue's own CQ once and retires what completed: see
    /// [`retire`](Self::retire). No check: the queue owns its CQ's poller,
    /// so every completion it reaps is of this queue's CQ.
    #[inline]
    pub(crate) fn poll(&mut self, on: impl FnMut(Retired<'_>)) -> Result<usize> {
        let reaped = self.cq.reap(POLL_BATCH)?;
        retire_walk(
            &mut self.ledger,
            self.names,
            &self.read_ring,
            self.layout,
            reaped.wcs(),
            on,
        )
    }
}

impl<N: Naming> SendQueue<N> {
    /// [`new`](SendQueue::new), on `cq`, its requests named by `names`;
    /// `rings` are the send ring, the read ring and their layout.
    pub(crate) fn named(
        cq: N::Cq,
        names: N,
        rings: (Registration, Registration, SlotLayout),
        depth: u32,
        interval: u32,
        batch: usize,
        inline_threshold: usize,
    ) -> SendQueue<N> {
        let (send_ring, read_ring, layout) = rings;
        assert!(send_ring.len() >= layout.bytes() && read_ring.len() >= layout.bytes());
        SendQueue {
            chain: SendChain::new(batch),
            ledger: Ledger::new(depth, interval, layout.count()),
            send_ring,
            read_ring,
            layout,
            inline_threshold,
            cq,
            names,
            // Every outstanding request may send from a lent region, and
            // as many again may wait, rolled back, to be reclaimed.
            lent: LentRegions::new((depth as usize).saturating_mul(2)),
            broken: None,
        }
    }

    /// The post that broke the queue, if one did.
    pub(crate) fn broken(&self) -> Option<Indeterminate> {
        self.broken
    }

    #[inline]
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// See [`Ledger::forget_leaked_batch`].
    #[inline]
    pub(crate) fn forget_leaked_batch(&mut self) {
        self.ledger.forget_leaked_batch();
    }

    #[cfg(feature = "engine")]
    /// The most requests one batch (one doorbell) can carry.
    pub(crate) fn batch_capacity(&self) -> usize {
        self.chain.capacity()
    }

    #[inline]
    pub(crate) fn layout(&self) -> SlotLayout {
        self.layout
    }

    #[inline]
    pub(crate) fn inline_threshold(&self) -> usize {
        self.inline_threshold
    }

    /// The oldest lent region whose request retired (or never went).
    #[inline]
    pub(crate) fn reclaim(&mut self) -> Option<MemoryRegion> {
        self.lent
            .pop_returned(self.ledger.retired(), self.ledger.committed())
    }

    /// Regions lent and not yet reclaimed.
    #[inline]
    pub(crate) fn lent(&self) -> usize {
        self.lent.len()
    }

    #[inline(always)]
    fn admit(&mut self, kind: RequestKind, must_signal: bool) -> Result<Admitted> {
        match self.ledger.admit(kind, must_signal) {
            Some(a) => Ok(a),
            None => Err(self.refusal()),
        }
    }

    /// Why the ledger admits nothing: the queue is full, or broken.
    #[cold]
    #[inline(never)]
    fn refusal(&self) -> Error {
        match self.broken {
            Some(broken) => broken.error(),
            None if self.ledger.is_unwound() => Error::CallbackPanicked,
            None => full("the send queue"),
        }
    }

    /// `data` as `seq`'s payload: inline up to the threshold, else copied
    /// into a send-ring slot.
    #[inline(always)]
    fn stage_bytes<'d>(&mut self, seq: u64, data: &'d [u8]) -> Result<Payload<'d>> {
        if data.len() <= self.inline_threshold {
            return Ok(Payload::Inline(data));
        }
        self.stage_filled(seq, data.len(), |slot| {
            slot.copy_from_slice(data);
            Ok(())
        })
    }

    /// Claims a send-ring slot for `seq` and lets `fill` write its `len`
    /// bytes — registered memory, so the NIC reads them from there.
    #[inline(always)]
    fn stage_filled(
        &mut self,
        seq: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<Payload<'static>> {
        if len > self.layout.size() {
            return Err(too_big(len, self.layout.size()));
        }
        let Some(pos) = self.ledger.claim_send_slot(seq) else {
            return Err(full("the send ring"));
        };
        let range = self.layout.range(pos, len);
        // SAFETY: the ledger just gave slot `pos` to request `seq`: the
        // request that used it before retired, so the NIC no longer reads
        // it, and no other view of the send ring exists (views are made
        // only here, for the duration of `fill`). The range is inside the
        // ring (layout.bytes() <= its length, checked in `new`).
        let slot = unsafe { std::slice::from_raw_parts_mut(self.send_ring.at(range.start), len) };
        // Should `fill` panic, the request never existed.
        let unwinding = ForgetOnUnwind {
            ledger: &mut self.ledger,
            seq,
        };
        let filled = fill(slot);
        std::mem::forget(unwinding);
        filled.map_err(|source| Error::SlotFill { source })?;
        Ok(Payload::Registered(LocalSlice {
            // Never wraps: the range is inside the ring's mapping.
            addr: self.send_ring.addr().wrapping_add(range.start as u64),
            len: len as u32,
            lkey: self.send_ring.lkey(),
        }))
    }

    /// Posts admitted request `a` alone from chain entry 0; a refusal gives
    /// the request and its slots back.
    #[inline(always)]
    fn post_alone(
        &mut self,
        qp: &mut QueuePair,
        a: Admitted,
        opcode: SendOpcode,
        payload: Payload<'_>,
        remote: RemoteSlice,
    ) -> Result<u64> {
        self.chain.patch(
            0,
            &SendRequest {
                wr_id: self.names.wr_id(a.seq),
                opcode,
                payload,
                remote,
                signaled: a.signaled,
            },
        );
        // SAFETY: the payload is inline bytes borrowed for this call, or a
        // slot the ledger handed to this request, which becomes the NIC's
        // now and comes back only when the request retires.
        match unsafe { self.chain.post(qp, 1) } {
            Ok(()) => Ok(a.seq),
            Err(failed) => Err(self.post_failed(qp, a.seq, failed)),
        }
    }

    /// Forgets requests from `seq` on and their slots; returns `err`.
    #[cold]
    #[inline(never)]
    fn give_back(&mut self, seq: u64, err: Error) -> Error {
        self.ledger.rollback_to(seq);
        err
    }

    /// After a failed post of the requests from `first` on: those the
    /// provider refused are given back; when it did not say which it
    /// refused, none is — every one may be queued, so each keeps its slots
    /// and regions until its completion, the QP goes to ERR so that they
    /// all complete, and the queue takes no more requests.
    #[cold]
    #[inline(never)]
    fn post_failed(&mut self, qp: &mut QueuePair, first: u64, failed: PostFailed) -> Error {
        match failed {
            // Never wraps: sequence numbers are below 2^62.
            PostFailed::Refused { posted, error } => {
                self.give_back(first.wrapping_add(posted as u64), error)
            }
            PostFailed::Unknown(unknown) => {
                qp.fail();
                self.ledger.close();
                self.broken.get_or_insert(unknown).error()
            }
        }
    }

    /// SEND or WRITE of `data` on its own: inline when small, else copied
    /// into a send-ring slot. Returns the request's sequence number.
    #[inline(always)]
    pub(crate) fn post_bytes(
        &mut self,
        qp: &mut QueuePair,
        op: Outbound,
        data: &[u8],
        must_signal: bool,
    ) -> Result<u64> {
        self.ledger.forget_leaked_batch();
        let (opcode, remote, kind) = op.parts();
        let a = self.admit(kind, must_signal)?;
        match self.stage_bytes(a.seq, data) {
            Ok(payload) => self.post_alone(qp, a, opcode, payload, remote),
            Err(e) => Err(self.give_back(a.seq, e)),
        }
    }

    /// SEND or WRITE of `len` bytes that `fill` writes into a send-ring
    /// slot, on its own. An error from `fill` posts nothing.
    #[inline(always)]
    pub(crate) fn post_filled(
        &mut self,
        qp: &mut QueuePair,
        op: Outbound,
        len: usize,
        must_signal: bool,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        self.ledger.forget_leaked_batch();
        let (opcode, remote, kind) = op.parts();
        let a = self.admit(kind, must_signal)?;
        match self.stage_filled(a.seq, len, fill) {
            Ok(payload) => self.post_alone(qp, a, opcode, payload, remote),
            Err(e) => Err(self.give_back(a.seq, e)),
        }
    }

    /// Claims a read-ring slot for READ `seq` of `len` bytes.
    #[inline(always)]
    fn stage_read(&mut self, seq: u64, len: usize) -> Result<(Payload<'static>, u64)> {
        if len > self.layout.size() {
            return Err(too_big(len, self.layout.size()));
        }
        let Some(pos) = self.ledger.claim_read_slot(seq, len as u32) else {
            return Err(full("the read ring"));
        };
        let range = self.layout.range(pos, len);
        let local = LocalSlice {
            // Never wraps: the range is inside the ring's mapping.
            addr: self.read_ring.addr().wrapping_add(range.start as u64),
            len: len as u32,
            lkey: self.read_ring.lkey(),
        };
        Ok((Payload::Registered(local), pos))
    }

    /// RDMA READ of `len` bytes at `remote` into a read-ring slot, on its
    /// own and always signaled (its completion says the data are there).
    #[inline(always)]
    pub(crate) fn post_read(
        &mut self,
        qp: &mut QueuePair,
        remote: RemoteSlice,
        len: usize,
    ) -> Result<ReadTicket> {
        self.ledger.forget_leaked_batch();
        let a = self.admit(RequestKind::Read, true)?;
        let (payload, pos) = match self.stage_read(a.seq, len) {
            Ok(staged) => staged,
            Err(e) => return Err(self.give_back(a.seq, e)),
        };
        let seq = self.post_alone(qp, a, SendOpcode::Read, payload, remote)?;
        Ok(ReadTicket {
            seq,
            pos,
            len: len as u32,
        })
    }

    /// A signaled zero-length RDMA WRITE to `remote` (a heartbeat or a
    /// marker): its completion retires every request before it.
    pub(crate) fn post_marker(
        &mut self,
        qp: &mut QueuePair,
        remote: RemoteSlice,
        kind: RequestKind,
    ) -> Result<u64> {
        debug_assert!(kind.is_internal());
        self.ledger.forget_leaked_batch();
        let a = self
            .ledger
            .admit_marker(kind)
            .ok_or_else(|| self.refusal())?;
        let remote = RemoteSlice { len: 0, ..remote };
        // Zero bytes, but at a real address that lives for ever: a
        // provider that reads the gather entry as given (not inline) sees
        // no dangling pointer, and no request outlives it.
        static MARKER_BYTE: [u8; 1] = [0];
        let payload = Payload::Inline(&MARKER_BYTE[..0]);
        self.post_alone(qp, a, SendOpcode::Write, payload, remote)
    }

    /// The data of a READ that has retired, while no later READ has taken
    /// its slot; `None` otherwise.
    pub(crate) fn read_data(&self, ticket: ReadTicket) -> Option<&[u8]> {
        if ticket.seq >= self.ledger.retired() || !self.ledger.read_slot_is_readable(ticket.pos) {
            return None;
        }
        let range = self.layout.range(ticket.pos, ticket.len as usize);
        // SAFETY: the READ retired, so the NIC is done with its slot (it
        // wrote the data, or, for a READ that failed or flushed, whatever it
        // wrote before: stale bytes, never a race; callers check the READ's
        // outcome before they read), and the ledger says no later READ
        // claimed the slot; claiming one needs &mut self, which this borrow
        // excludes.
        Some(unsafe { std::slice::from_raw_parts(self.read_ring.at(range.start), range.len()) })
    }

    /// Starts a batch: up to the chain's capacity of requests, one doorbell.
    #[inline]
    pub(crate) fn batch<'q, 'd>(&'q mut self, qp: &'q mut QueuePair) -> SendBatch<'q, 'd, N> {
        let first = self.ledger.open_batch();
        SendBatch {
            sq: self,
            qp,
            first,
            len: 0,
            posted: false,
            _data: PhantomData,
        }
    }

    /// Retires what `reaped` names, handing each retired request to `on`,
    /// oldest first. Returns how many completions there were; a
    /// completion that names no outstanding request (another poster's) is
    /// passed over, and reported as [`Error::ForeignCompletion`] once the
    /// others were handed on. Completions polled from another CQ than this
    /// queue's are refused whole, none believed: their ids are another
    /// queue's, and a READ's slot named by one may still be the NIC's.
    ///
    /// On a CQ of the queue's own, every completion of that CQ is of its
    /// queue pair. On a CQ that several queue pairs share (`PooledIds`),
    /// whoever hands completions here checks their queue pair first (issue
    /// 25's poller); the queue still believes only ids of its own slot and
    /// generation, within what it has outstanding, so a completion of
    /// another connection — or of the one before it in its slot — is
    /// refused as foreign.
    ///
    /// Should `on` panic, the walk's guard still retires and releases
    /// every request the completions name: no completion goes
    /// unaccounted, and no request stays retired with its slots held;
    /// and it closes the queue, their verdicts never given.
    #[inline]
    pub(crate) fn retire(
        &mut self,
        reaped: Reaped<'_>,
        on: impl FnMut(Retired<'_>),
    ) -> Result<usize> {
        if reaped.cq() != N::cq_id(&self.cq) {
            return Err(other_queues_completions());
        }
        retire_walk(
            &mut self.ledger,
            self.names,
            &self.read_ring,
            self.layout,
            reaped.wcs(),
            on,
        )
    }
}

/// [`SendQueue::retire`]'s walk over completions known to be of the
/// queue's CQ, whose requests are named by `names`; `read_ring` (of
/// `layout`) holds its READs' data. A function of the queue's parts, not
/// a method, so that `poll` can walk what its own poller reaped while
/// that poller stays borrowed. Its callers (`poll`, `retire`) must pass:
/// `wcs` polled from the CQ of the queue pair that `ledger`'s requests
/// were posted to; the read ring whose slots `ledger` hands out; and
/// parts of a queue they hold `&mut` until it returns.
#[inline(always)]
fn retire_walk<N: Naming>(
    ledger: &mut Ledger,
    names: N,
    read_ring: &Registration,
    layout: SlotLayout,
    wcs: &[WorkCompletion],
    mut on: impl FnMut(Retired<'_>),
) -> Result<usize> {
    let n = wcs.len();
    let mut walk = SendWalk {
        ledger,
        names,
        rest: wcs,
        range: 0..0,
    };
    let mut foreign = None;
    while let Some((wc, rest)) = walk.rest.split_first() {
        walk.rest = rest;
        match names.retire_through(walk.ledger, wc.wr_id()) {
            Ok(range) => walk.range = range,
            Err(e) => {
                foreign.get_or_insert(e);
                continue;
            }
        }
        let (status, vendor_err) = (wc.status(), wc.vendor_err());
        for seq in walk.range.by_ref() {
            let released = walk.ledger.release(seq);
            // On a CQ of its own, `seq == wc.wr_id()`: as it always was.
            let named = names.wr_id(seq) == wc.wr_id();
            let read = match released.read_pos {
                Some(pos) if named && status == WcStatus::SUCCESS => {
                    let r = layout.range(pos, released.request.read_len as usize);
                    // SAFETY: this READ's own successful completion: the
                    // NIC wrote the data and is done with the slot, which
                    // was just released; a later READ could claim it only
                    // through `&mut Ledger`, which this walk holds (borrowed
                    // from its caller's &mut of the queue) until it returns,
                    // and `on` cannot keep the slice. The range is inside
                    // the ring (`SendQueue::named` checked its size).
                    Some(unsafe { std::slice::from_raw_parts(read_ring.at(r.start), r.len()) })
                }
                _ => None,
            };
            on(Retired {
                seq,
                request: released.request,
                named,
                status,
                vendor_err,
                read,
            });
        }
    }
    std::mem::forget(walk);
    match foreign {
        None => Ok(n),
        Some(e) => Err(e.into()),
    }
}

#[cold]
#[inline(never)]
pub(crate) fn other_queues_completions() -> Error {
    crate::error::Misuse::OtherQueuesCompletions.into()
}

/// Where `SendQueue::poll` is in the completions it took: the rest, and
/// the requests of the current one not yet released. Dropped only by a
/// panic in the caller's callback (the walk forgets it otherwise), it
/// retires and releases them all, so the ledger never lags the NIC, and
/// closes the queue: their verdicts were never given. (Keeping the lost
/// verdicts instead — a field more in the walk, more work in this drop —
/// made the compiler store the ledger's counters on every request
/// retired: +3.6 instructions a request.)
struct SendWalk<'a, N: Naming> {
    ledger: &'a mut Ledger,
    names: N,
    rest: &'a [WorkCompletion],
    range: std::ops::Range<u64>,
}

impl<N: Naming> Drop for SendWalk<'_, N> {
    #[cold]
    fn drop(&mut self) {
        for seq in self.range.clone() {
            self.ledger.release(seq);
        }
        for wc in self.rest {
            if let Ok(range) = self.names.retire_through(self.ledger, wc.wr_id()) {
                for seq in range {
                    self.ledger.release(seq);
                }
            }
        }
        // Their verdicts were never given: a failure among them would be
        // lost, and the next flush named the cause. The queue takes no
        // more, and the connection says why.
        self.ledger.unwound();
    }
}

/// Requests gathered for one `ibv_post_send`. Dropped unposted, it
/// forgets them: nothing reached the NIC.
#[must_use = "a batch posts nothing until .post() is called"]
pub(crate) struct SendBatch<'q, 'd, N: Naming = OwnCq> {
    sq: &'q mut SendQueue<N>,
    qp: &'q mut QueuePair,
    first: u64,
    len: usize,
    posted: bool,
    // Inline payloads are borrowed until the post.
    _data: PhantomData<&'d [u8]>,
}

impl<N: Naming> std::fmt::Debug for SendBatch<'_, '_, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch").field("len", &self.len).finish()
    }
}

impl<'d, N: Naming> SendBatch<'_, 'd, N> {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.len == self.sq.chain.capacity()
    }

    #[inline(always)]
    fn admit(&mut self, kind: RequestKind, must_signal: bool) -> Result<Admitted> {
        if self.is_full() {
            return Err(Error::BatchFull {
                capacity: self.sq.chain.capacity(),
            });
        }
        match self.sq.admit(kind, must_signal) {
            Ok(a) => Ok(a),
            Err(e) => Err(in_batch(e)),
        }
    }

    /// Patches admitted request `a` into the next chain entry.
    #[inline(always)]
    fn add(
        &mut self,
        a: Admitted,
        opcode: SendOpcode,
        payload: Payload<'d>,
        remote: RemoteSlice,
    ) -> u64 {
        self.sq.chain.patch(
            self.len,
            &SendRequest {
                wr_id: self.sq.names.wr_id(a.seq),
                opcode,
                payload,
                remote,
                signaled: a.signaled,
            },
        );
        self.len = self.len.wrapping_add(1); // at most the chain's capacity
        a.seq
    }

    /// Adds a SEND or WRITE of `data` (inline when small, else copied into
    /// a send-ring slot).
    #[inline]
    pub(crate) fn push_bytes(
        &mut self,
        op: Outbound,
        data: &'d [u8],
        must_signal: bool,
    ) -> Result<u64> {
        let (opcode, remote, kind) = op.parts();
        let a = self.admit(kind, must_signal)?;
        match self.sq.stage_bytes(a.seq, data) {
            Ok(payload) => Ok(self.add(a, opcode, payload, remote)),
            Err(e) => Err(self.sq.give_back(a.seq, in_batch(e))),
        }
    }

    /// Adds a SEND or WRITE of `len` bytes that `fill` writes into a
    /// send-ring slot. An error from `fill` adds nothing.
    #[inline]
    pub(crate) fn push_filled(
        &mut self,
        op: Outbound,
        len: usize,
        must_signal: bool,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        let (opcode, remote, kind) = op.parts();
        let a = self.admit(kind, must_signal)?;
        match self.sq.stage_filled(a.seq, len, fill) {
            Ok(payload) => Ok(self.add(a, opcode, payload, remote)),
            Err(e) => Err(self.sq.give_back(a.seq, in_batch(e))),
        }
    }

    /// Adds a SEND or WRITE of the first `len` bytes of `region`, sent
    /// from the region itself; the queue keeps it until the request
    /// retires ([`SendQueue::reclaim`]). A refusal gives it back.
    // The region comes back in the error unboxed: a refusal for lack of
    // room is ordinary back-pressure, and must not allocate.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub(crate) fn push_region(
        &mut self,
        op: Outbound,
        region: MemoryRegion,
        len: usize,
        must_signal: bool,
    ) -> std::result::Result<u64, RegionRefused> {
        let (opcode, remote, kind) = op.parts();
        let admitted = region
            .local_slice(0..len)
            .and_then(|local| Ok((local, self.admit(kind, must_signal)?)));
        let (local, a) = match admitted {
            Ok(admitted) => admitted,
            Err(error) => return Err(RegionRefused { error, region }),
        };
        if let Err(region) = self.sq.lent.push(a.seq, region) {
            let error = self.sq.give_back(
                a.seq,
                Error::Full {
                    what: "the lent regions",
                    remedy: Remedy::Reclaim,
                },
            );
            return Err(RegionRefused { error, region });
        }
        Ok(self.add(a, opcode, Payload::Registered(local), remote))
    }

    /// Adds an RDMA READ into a read-ring slot (always signaled).
    #[inline]
    pub(crate) fn push_read(&mut self, remote: RemoteSlice, len: usize) -> Result<u64> {
        let a = self.admit(RequestKind::Read, true)?;
        match self.sq.stage_read(a.seq, len) {
            Ok((payload, _)) => Ok(self.add(a, SendOpcode::Read, payload, remote)),
            Err(e) => Err(self.sq.give_back(a.seq, in_batch(e))),
        }
    }

    /// Posts every request added with one `ibv_post_send` (none: no
    /// doorbell). Returns how many went. When the provider refuses one,
    /// the requests before it stay posted and it and the rest are given
    /// back; the error says how many went. When it fails without saying
    /// which it refused, all stay posted and the queue breaks (see
    /// [`SendQueue::post_failed`]).
    #[inline]
    pub(crate) fn post(mut self) -> Result<usize> {
        self.posted = true;
        self.sq.ledger.close_batch();
        if self.len == 0 {
            return Ok(0);
        }
        // SAFETY: every entry's payload is inline bytes borrowed for 'd
        // (which outlives the batch), a slot the ledger handed to its
        // request, or a region lent to the queue (moved in, so nothing
        // else can reach it); they become the NIC's now, back at
        // retirement.
        match unsafe { self.sq.chain.post(self.qp, self.len) } {
            Ok(()) => Ok(self.len),
            Err(failed) => Err(self.sq.post_failed(self.qp, self.first, failed)),
        }
    }
}

impl<N: Naming> Drop for SendBatch<'_, '_, N> {
    fn drop(&mut self) {
        // Never posted, whatever was admitted (also a request whose payload
        // was being staged when a panic unwound through the batch): the NIC
        // saw none of it.
        if !self.posted && self.sq.ledger.posted() != self.first {
            self.sq.ledger.rollback_to(self.first);
        }
        self.sq.ledger.close_batch();
    }
}

/// Forgets request `seq` (and every later one) when dropped — which only
/// a panic does: the code that admitted it forgets this guard once the
/// caller's closure returned.
struct ForgetOnUnwind<'l> {
    ledger: &'l mut Ledger,
    seq: u64,
}

impl Drop for ForgetOnUnwind<'_> {
    #[cold]
    fn drop(&mut self) {
        self.ledger.rollback_to(self.seq);
    }
}

#[cold]
#[inline(never)]
fn full(what: &'static str) -> Error {
    Error::Full {
        what,
        remedy: Remedy::Poll,
    }
}

/// A refusal inside a batch: the batch holds the connection, so polling
/// cannot make room until it is posted.
#[cold]
#[inline(never)]
fn in_batch(error: Error) -> Error {
    match error {
        Error::Full {
            what,
            remedy: Remedy::Poll,
        } => Error::Full {
            what,
            remedy: Remedy::PostBatch,
        },
        other => other,
    }
}

#[cold]
#[inline(never)]
fn too_big(len: usize, slot_size: usize) -> Error {
    Error::TooLarge {
        len,
        limit: slot_size,
    }
}
