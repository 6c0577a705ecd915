//! One poller for many connections (issue 25, S3.3): their send queues
//! complete on one send CQ, their receives come from one shared receive
//! queue and complete on one receive CQ, and one thread polls both and
//! hands each completion to the connection it is about. See
//! `docs/design/many-peers-per-core.md`.
//!
//! A completion names its queue pair; the [`QpnTable`] says which slot of
//! the [`Slab`] holds that connection. A send completion is then believed
//! only if its wr_id carries that slot and the tenant's generation
//! ([`PooledIds`]), so one of a closed connection, still arriving, never
//! retires its successor's requests. A receive's slot is settled first,
//! whatever it is about: the SRQ ring is the poller's, not a connection's.
//!
//! Not yet for peers that may be hostile to each other (hostile read
//! 39b, `docs/design/many-peers-per-core.md` §6): every connection's
//! target ring is in the poller's one protection domain, so a peer that
//! guesses another connection's rkey reaches that ring; a join that fails
//! after its queue pair could receive destroys the queue pair at once,
//! which may strand a receive of the shared queue; and a join blocks the
//! poller while its peer takes its time.

use std::net::TcpStream;
use std::sync::Arc;

use super::budget::CqBudget;
use super::qpn_table::QpnTable;
use super::slab::{ConnId, Slab};
use crate::config::{bad_setting, EngineConfig};
use crate::connect::oob::Prepared;
use crate::datapath::{Event, Stats, Verdict};
use crate::endpoint::Endpoint;
use crate::error::{Error, Misuse, Result};
use crate::status::{WcError, WcOpcode, WcStatus};
use crate::sys::cq::{CompletionQueue, Polled, Reaper, WorkCompletion, POLL_BATCH};
use crate::sys::device::Context;
use crate::sys::layout::SlotLayout;
use crate::sys::mr::{Access, RemoteSlice};
use crate::sys::pd::ProtectionDomain;
use crate::sys::qp::Queues;
use crate::sys::region::SharedRegion;
use crate::sys::send_names::PooledIds;
use crate::sys::send_queue::{Outbound, SendQueue};
use crate::sys::srq_ring::{SrqRing, SrqSlot};
use crate::sys::wr_id::POOLED_INDEX_BITS;

/// How many connections a poller takes, and its shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolConfig {
    /// Connections at once (at most 2^16: a pooled wr_id's slot bits).
    pub max_connections: u32,
    /// Receives posted to the shared queue: what every peer's SENDs
    /// share, each of the engine's `slot_size` bytes.
    pub srq_depth: u32,
    /// Receives posted with one doorbell when the queue is topped up.
    pub srq_batch: usize,
}

/// What the poller refused or passed over, for tests and accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolStats {
    /// Completions of no live connection of this poller (of one that
    /// ended, or naming another tenant of its slot): counted, never
    /// believed.
    pub stale: u64,
    /// Joins refused because the poller was full.
    pub refused: u64,
}

/// One connection of the poller, in drop order: its queue pair goes
/// before the rings its requests name and the ring its peer writes.
struct Pooled {
    ep: Endpoint,
    sq: SendQueue<PooledIds>,
    target: SharedRegion,
    peer: RemoteSlice,
    failure: Option<WcError>,
    send_failed: bool,
    stats: Stats,
}

/// Many connections polled by one thread. `Send`, not `Sync`: the SRQ's
/// poster, the CQs' pollers and the queue pairs on them have one owner
/// (row 2 of the unsafe contract).
pub(crate) struct Poller {
    // Field order is drop order: the queue pairs (in the slab) go before
    // the SRQ ring their receives land in (which is parked with the SRQ
    // until the SRQ, held by every queue pair, is destroyed), and before
    // the CQs they complete on.
    slab: Slab<Pooled>,
    qpns: QpnTable<u32>,
    ring: SrqRing,
    send: Reaper,
    recv: Reaper,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    budget: CqBudget,
    pd: Arc<ProtectionDomain>,
    cfg: EngineConfig,
    stats: PoolStats,
    /// A callback panicked while handed completions: the poller's events
    /// since are incomplete, so it hands on no more.
    unwound: bool,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("connections", &self.slab.len())
            .field("ring", &self.ring)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Poller {
    /// A poller on `device` (the first with an active port when `None`)
    /// for connections configured by `cfg` (each has its own send queue,
    /// send ring, read ring and target ring, as a `Connection` does; its
    /// receives come from the shared queue), sized by `pool`. Everything
    /// is checked before any verb; the shared queue is filled at once.
    pub(crate) fn new(
        device: Option<&str>,
        cfg: &EngineConfig,
        pool: PoolConfig,
    ) -> Result<Poller> {
        cfg.validate()?;
        check(pool)?;
        let ctx = Context::open(device)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let send_depth = pool
            .max_connections
            .checked_mul(cfg.qp.max_send_wr)
            .ok_or_else(|| {
                bad_setting(
                    "max_connections",
                    pool.max_connections,
                    "times the send queue depth must fit in 32 bits",
                )
            })?;
        let (send_cq, send) = CompletionQueue::new(&ctx, send_depth)?;
        let (recv_cq, recv) = CompletionQueue::new(&ctx, pool.srq_depth)?;
        crate::sys::mem::check_memlock(u64::from(pool.srq_depth) * u64::from(cfg.slot_size))?;
        let ring = SrqRing::new(
            &pd,
            &recv_cq,
            pool.srq_depth,
            cfg.slot_size as usize,
            pool.srq_batch,
            cfg.pages,
        )?;
        let mut poller = Poller {
            slab: Slab::with_capacity(pool.max_connections),
            qpns: QpnTable::with_capacity(pool.max_connections as usize),
            ring,
            send: Reaper::new(send),
            recv: Reaper::new(recv),
            send_cq,
            recv_cq,
            budget: CqBudget::new(send_depth),
            pd,
            cfg: cfg.clone(),
            stats: PoolStats::default(),
            unwound: false,
        };
        while poller.ring.free() > 0 {
            poller.ring.refill()?;
        }
        Ok(poller)
    }

    /// Connections joined and not ended.
    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Receives posted to the shared queue, not yet completed.
    pub(crate) fn receives_posted(&self) -> usize {
        self.ring.at_nic()
    }

    /// Requests of connection `id` not yet retired, also once the poller
    /// refuses `conn` (a test of the panic guards).
    #[cfg(test)]
    pub(crate) fn outstanding_of(&self, id: ConnId) -> Option<u64> {
        self.slab.get(id).map(|conn| conn.sq.ledger().outstanding())
    }

    /// Slots of the shared queue free to post again (none is posted while
    /// its completion's data is handed on).
    #[cfg(test)]
    pub(crate) fn free_slots(&self) -> usize {
        self.ring.free()
    }

    /// Joins a peer over `stream`'s out-of-band exchange (blocking, within
    /// the QP configuration's `connect_timeout`), as
    /// [`Connection::over_tcp`](crate::Connection) does on the other side,
    /// the peer allowed `remote_access` to this connection's target ring.
    /// Refused before any verb when the poller is full
    /// ([`Error::PoolFull`]).
    pub(crate) fn over_tcp(
        &mut self,
        stream: &mut TcpStream,
        remote_access: Access,
    ) -> Result<ConnId> {
        let Some(id) = self.slab.vacant() else {
            self.stats.refused += 1;
            return Err(Error::PoolFull {
                what: "connections",
                limit: self.slab.capacity() as u64,
            });
        };
        let depth = self.cfg.qp.max_send_wr;
        // Not reached while every connection has the same depth (the CQ
        // holds max_connections of them): the slots refuse first.
        if let Err(over) = self.budget.book(depth) {
            self.stats.refused += 1;
            return Err(Error::PoolFull {
                what: "send completion queue entries",
                limit: u64::from(over.left + self.budget.booked()),
            });
        }
        let joined = self.join(id, stream, remote_access);
        if joined.is_err() {
            // Its queue pair, if it was made, is destroyed already.
            self.budget.release(depth);
        }
        joined
    }

    fn join(
        &mut self,
        id: ConnId,
        stream: &mut TcpStream,
        remote_access: Access,
    ) -> Result<ConnId> {
        let cfg = &self.cfg;
        let layout = SlotLayout::new(cfg.slot_size as usize, cfg.slot_count as usize)?;
        crate::sys::mem::check_memlock(3 * layout.bytes() as u64)?;
        let queues = Queues {
            send_cq: &self.send_cq,
            recv_cq: &self.recv_cq,
            srq: Some(self.ring.srq()),
        };
        let ep = Endpoint::create_shared(&self.pd, queues, &cfg.qp)?;
        let send = ep.register_raw(layout.bytes(), cfg.pages, Access::LOCAL_READ)?;
        let read = ep.register_raw(layout.bytes(), cfg.pages, Access::LOCAL_WRITE)?;
        let target = SharedRegion::new(ep.register_raw(
            layout.bytes(),
            cfg.pages,
            Access::LOCAL_WRITE | remote_access,
        )?);
        let inline_threshold = cfg.inline_threshold.min(ep.max_inline()) as usize;
        let descriptor = target.remote(0..target.len())?;
        // A failed handshake drops the queue pair inside, before the rings.
        let ep = Prepared::with_endpoint(ep, &cfg.qp, remote_access)?
            .handshake(stream, Some(descriptor))?;
        let peer = ep
            .remote_region()
            .ok_or_else(|| Error::BadRecord("the peer exposed no target ring".into()))?;
        let sq = SendQueue::named(
            self.send_cq.id(),
            PooledIds::new(id.index, id.gen),
            (send, read, layout),
            cfg.qp.max_send_wr,
            cfg.signal_interval,
            cfg.batch_size.max(1) as usize,
            inline_threshold,
        );
        let qpn = ep.qp_num();
        let pooled = Pooled {
            ep,
            sq,
            target,
            peer,
            failure: None,
            send_failed: false,
            stats: Stats::default(),
        };
        // A live queue pair's number is unique, and the table holds as
        // many as the slab: neither refusal can come.
        if self.qpns.insert(qpn, id.index).is_err() {
            return Err(Error::PoolFull {
                what: "queue pair numbers",
                limit: self.slab.capacity() as u64,
            });
        }
        let refused = match self.slab.insert(pooled) {
            Ok(got) if got == id => return Ok(id),
            // Named for another slot: taken out again, its queue pair
            // destroyed before its booking is given back.
            Ok(got) => self.slab.remove(got),
            Err(pooled) => Some(pooled),
        };
        self.qpns.remove(qpn);
        drop(refused);
        Err(Error::PoolFull {
            what: "connections",
            limit: self.slab.capacity() as u64,
        })
    }

    /// The connection `id` names, to post on; refused once it ended
    /// ([`Misuse::StaleConnection`]), never routed to a later tenant of
    /// its slot.
    pub(crate) fn conn(&mut self, id: ConnId) -> Result<PooledConn<'_>> {
        // The turn a callback panicked in retired other connections'
        // requests unseen: a failure among them was never recorded.
        if self.unwound {
            return Err(Error::CallbackPanicked);
        }
        match self.slab.get_mut(id) {
            Some(conn) => Ok(PooledConn { conn }),
            None => Err(Misuse::StaleConnection.into()),
        }
    }

    /// One turn: polls the send CQ and the receive CQ once each, hands
    /// every event to `on` with its connection, and tops the shared queue
    /// up. Returns how many completions were taken.
    ///
    /// Should `on` panic, every completion the turn took is still settled
    /// (each send request retired, each receive's slot freed), and the
    /// poller hands on nothing more: every later `poll` and `conn` returns
    /// [`Error::CallbackPanicked`].
    pub(crate) fn poll(&mut self, mut on: impl FnMut(ConnId, Event<'_>)) -> Result<usize> {
        if self.unwound {
            return Err(Error::CallbackPanicked);
        }
        let sent = self.poll_sends(&mut on)?;
        let received = self.poll_receives(&mut on)?;
        self.top_up()?;
        Ok(sent + received)
    }

    /// Posts the shared queue's free slots again, a batch at a time.
    fn top_up(&mut self) -> Result<()> {
        while self.ring.free() >= self.ring.batch() {
            self.ring.refill()?;
        }
        Ok(())
    }

    fn poll_sends(&mut self, on: &mut impl FnMut(ConnId, Event<'_>)) -> Result<usize> {
        let reaped = self.send.reap(POLL_BATCH)?;
        let mut walk = SendPoolWalk {
            slab: &mut self.slab,
            qpns: &self.qpns,
            stats: &mut self.stats,
            unwound: &mut self.unwound,
            rest: reaped.each(),
        };
        while let Some(polled) = walk.rest.next() {
            let Some((id, conn)) = walk.find(polled.wc()) else {
                continue;
            };
            let mut verdict = Verdict::new(
                &mut conn.failure,
                &mut conn.send_failed,
                false,
                &mut conn.stats,
            );
            let judged = conn.sq.retire(polled.alone(), |retired| {
                verdict.judge(retired, &mut |ev| on(id, ev))
            });
            // Refused (another tenant's id, or not outstanding): never
            // believed, counted.
            if judged.is_err() {
                walk.stats.stale += 1;
            }
        }
        std::mem::forget(walk);
        Ok(reaped.wcs().len())
    }

    fn poll_receives(&mut self, on: &mut impl FnMut(ConnId, Event<'_>)) -> Result<usize> {
        let reaped = self.recv.reap(POLL_BATCH)?;
        let mut walk = RecvPoolWalk {
            ring: &mut self.ring,
            unwound: &mut self.unwound,
            rest: reaped.each(),
            lent: None,
        };
        for polled in walk.rest.by_ref() {
            let wc = polled.wc();
            // Settled first, whoever it is about: the slot is the CPU's.
            let Ok(slot) = walk.ring.settle(polled) else {
                self.stats.stale += 1;
                continue;
            };
            let lent = walk.lent.insert(slot);
            match self
                .qpns
                .get(wc.qp_num())
                .and_then(|index| self.slab.at_mut(index))
            {
                Some((id, conn)) => {
                    let data = walk.ring.data(lent, wc.byte_len() as usize).unwrap_or(&[]);
                    deliver(conn, wc, data, &mut |ev| on(id, ev));
                }
                None => self.stats.stale += 1,
            }
            if let Some(slot) = walk.lent.take() {
                let _ = walk.ring.release(slot);
            }
        }
        std::mem::forget(walk);
        Ok(reaped.wcs().len())
    }
}

/// A receive's completion, reported to its connection.
fn deliver(conn: &mut Pooled, wc: &WorkCompletion, data: &[u8], on: &mut impl FnMut(Event<'_>)) {
    let status = wc.status();
    if status == WcStatus::SUCCESS {
        conn.stats.received += 1;
        on(match wc.imm() {
            Some(imm) if wc.opcode() == WcOpcode::RECV_RDMA_WITH_IMM => Event::WriteImm {
                imm,
                len: wc.byte_len(),
            },
            _ => Event::Received { data },
        });
    } else if status == WcStatus::WR_FLUSH_ERR || conn.failure.is_some() {
        conn.stats.recv_flushed += 1;
        on(Event::RecvFlushed);
    } else {
        let err = WcError {
            wr_id: WcError::INTERNAL,
            opcode: Some(WcOpcode::RECV),
            status,
            vendor_err: wc.vendor_err(),
        };
        conn.failure = Some(err);
        conn.stats.failed += 1;
        on(Event::Failed(err));
    }
}

/// Where `poll_sends` is in the completions it took. Dropped only by a
/// panic in the caller's callback, it retires the
/// rest silently, so no connection's ledger lags the NIC, and marks the
/// poller unwound: their events were never handed on.
struct SendPoolWalk<'a, I: Iterator<Item = Polled<'a>>> {
    slab: &'a mut Slab<Pooled>,
    qpns: &'a QpnTable<u32>,
    stats: &'a mut PoolStats,
    unwound: &'a mut bool,
    rest: I,
}

impl<'a, I: Iterator<Item = Polled<'a>>> SendPoolWalk<'a, I> {
    /// The live connection `wc` is about, or `None` (counted stale).
    fn find(&mut self, wc: &WorkCompletion) -> Option<(ConnId, &mut Pooled)> {
        let found = self
            .qpns
            .get(wc.qp_num())
            .and_then(|index| self.slab.at_mut(index));
        if found.is_none() {
            self.stats.stale += 1;
        }
        found
    }

    /// Retires what the rest of the completions name, handing nothing on.
    #[cold]
    fn settle_rest(&mut self) {
        while let Some(polled) = self.rest.next() {
            if let Some((_, conn)) = self.find(polled.wc()) {
                let _ = conn.sq.retire(polled.alone(), |_| {});
            }
        }
    }
}

impl<'a, I: Iterator<Item = Polled<'a>>> Drop for SendPoolWalk<'a, I> {
    #[cold]
    fn drop(&mut self) {
        self.settle_rest();
        *self.unwound = true;
    }
}

/// Where `poll_receives` is in the completions it took, and the slot lent
/// while `on` runs. Dropped only by a panic in the caller's callback, it
/// releases that slot and settles and releases the rest, so no slot of
/// the shared queue is lost, and marks the poller unwound.
struct RecvPoolWalk<'a, I: Iterator<Item = Polled<'a>>> {
    ring: &'a mut SrqRing,
    unwound: &'a mut bool,
    rest: I,
    lent: Option<SrqSlot>,
}

impl<'a, I: Iterator<Item = Polled<'a>>> Drop for RecvPoolWalk<'a, I> {
    #[cold]
    fn drop(&mut self) {
        if let Some(slot) = self.lent.take() {
            let _ = self.ring.release(slot);
        }
        for polled in self.rest.by_ref() {
            if let Ok(slot) = self.ring.settle(polled) {
                let _ = self.ring.release(slot);
            }
        }
        *self.unwound = true;
    }
}

/// A pooled connection, borrowed from its poller to post on.
#[derive(Debug)]
pub(crate) struct PooledConn<'p> {
    conn: &'p mut Pooled,
}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("qp", &self.ep.qp_num())
            .field("sq", &self.sq)
            .finish()
    }
}

impl PooledConn<'_> {
    /// SEND of `data` (inline when small, else through the send ring).
    pub(crate) fn try_send(&mut self, data: &[u8]) -> Result<u64> {
        self.post(Outbound::Send, data)
    }

    /// RDMA WRITE of `data` to `remote_offset` of the peer's target ring,
    /// with an immediate if given.
    pub(crate) fn try_write(
        &mut self,
        data: &[u8],
        remote_offset: u64,
        imm: Option<u32>,
    ) -> Result<u64> {
        let remote = self.conn.peer.sub(remote_offset, data.len() as u64)?;
        self.post(Outbound::Write { remote, imm }, data)
    }

    /// RDMA READ of `len` bytes at `remote_offset` of the peer's target
    /// ring; its data comes with its completion ([`Event::ReadCompleted`]).
    pub(crate) fn try_read(&mut self, remote_offset: u64, len: usize) -> Result<u64> {
        self.check_failure()?;
        let remote = self.conn.peer.sub(remote_offset, len as u64)?;
        let ticket = self.conn.sq.post_read(self.conn.ep.qp(), remote, len)?;
        self.conn.stats.doorbells += 1;
        Ok(ticket.seq)
    }

    /// This side's target ring, which the peer writes.
    pub(crate) fn target(&self) -> &SharedRegion {
        &self.conn.target
    }

    /// Requests posted and not yet retired.
    pub(crate) fn outstanding(&self) -> u64 {
        self.conn.sq.ledger().outstanding()
    }

    pub(crate) fn stats(&self) -> Stats {
        self.conn.stats
    }

    fn post(&mut self, op: Outbound, data: &[u8]) -> Result<u64> {
        self.check_failure()?;
        let seq = self
            .conn
            .sq
            .post_bytes(self.conn.ep.qp(), op, data, false)?;
        self.conn.stats.doorbells += 1;
        Ok(seq)
    }

    fn check_failure(&self) -> Result<()> {
        match self.conn.failure {
            Some(f) => Err(f.into()),
            None => Ok(()),
        }
    }
}

/// The pool's own settings, checked before any verb.
fn check(pool: PoolConfig) -> Result<()> {
    if pool.max_connections == 0 || pool.max_connections > 1 << POOLED_INDEX_BITS {
        return Err(bad_setting(
            "max_connections",
            pool.max_connections,
            "must be 1 to 65536 (a pooled work request names its connection's slot in 16 bits)",
        ));
    }
    if pool.srq_depth == 0 {
        return Err(bad_setting(
            "srq_depth",
            pool.srq_depth,
            "must be at least 1",
        ));
    }
    if pool.srq_batch == 0 || pool.srq_batch > pool.srq_depth as usize {
        return Err(bad_setting(
            "srq_batch",
            pool.srq_batch,
            "must be 1 to srq_depth",
        ));
    }
    Ok(())
}
