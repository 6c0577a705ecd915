//! One poller for many connections (issue 25): their send queues
//! complete on one send CQ, their receives come from one shared receive
//! queue and complete on one receive CQ, and one thread polls both and
//! hands each completion to the connection it is about. See
//! `docs/design/many-peers-per-core.md`.
//!
//! A completion names its queue pair; the [`QpnTable`] says which slot of
//! the [`Slab`] holds that connection, or which ending record holds it
//! once it ended. A send completion is then believed only if its wr_id
//! carries that slot and the tenant's generation ([`PooledIds`]), so one
//! of a closed connection never retires its successor's requests. A
//! receive's slot is settled first, whatever it is about: the SRQ ring is
//! the poller's, not a connection's.
//!
//! One connection's end leaves the others untouched (`ends.rs`): it
//! leaves the slab at once, and its queue pair and rings stay until the
//! NIC is proven done with them.
//!
//! Not yet for peers that may be hostile to each other (hostile read
//! 39b, `docs/design/many-peers-per-core.md` §6): every connection's
//! target ring is in the poller's one protection domain, so a peer that
//! guesses another connection's rkey reaches that ring; and a join blocks
//! the poller while its peer takes its time.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::budget::CqBudget;
use super::cm_joins::CmRead;
use super::ends::EndingConn;
use super::event::PoolEvent;
use super::fair::Fair;
use super::pooled::{deliver, Pooled, PooledConn};
use super::qpn_table::QpnTable;
use super::slab::{ConnId, Slab};
use super::walks::{find, Found, RecvPoolWalk, SendPoolWalk};
use crate::config::{bad_setting, EngineConfig};
use crate::connect::oob::{HandshakeFailed, Prepared};
use crate::datapath::{Stats, Verdict};
use crate::endpoint::Endpoint;
use crate::error::{Error, Misuse, Result};
use crate::status::WcStatus;
use crate::sys::cm::{CmId, EventChannel};
use crate::sys::cq::{CompletionQueue, Reaper, WorkCompletion, POLL_BATCH};
use crate::sys::device::Context;
use crate::sys::layout::SlotLayout;
use crate::sys::mr::{Access, Registration, RemoteSlice};
use crate::sys::pd::ProtectionDomain;
use crate::sys::qp::Queues;
use crate::sys::region::SharedRegion;
use crate::sys::send_names::PooledIds;
use crate::sys::send_queue::SendQueue;
use crate::sys::srq_ring::{SrqRing, SrqSlot};
use crate::sys::wr_id::POOLED_INDEX_BITS;

/// How many connections a poller takes, its shared receive queue, and
/// how long an ending connection's receive side is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolConfig {
    /// Connections at once, live or ending (at most 2^16: a pooled
    /// wr_id's slot bits).
    pub max_connections: u32,
    /// Receives posted to the shared queue: what every peer's SENDs
    /// share, each of the engine's `slot_size` bytes.
    pub srq_depth: u32,
    /// Receives posted with one doorbell when the queue is topped up.
    pub srq_batch: usize,
    /// Arrivals (SENDs, WRITE_WITH_IMMs) handed on per connection a turn
    /// (at least 1); the rest wait, in order, holding their slots of the
    /// shared queue, so a peer that floods cannot starve the others.
    pub per_conn_budget: u32,
    /// How long an ending connection's queue pair, its send queue proven
    /// empty, is kept in ERR before it is destroyed (at the first turn
    /// after it that empties the receive CQ): a receive of the shared
    /// queue it held mid-message then completes (flushed) while its owner
    /// can still be told. Every device takes it for now: rxe on Linux 6.1
    /// sends no `QP_LAST_WQE_REACHED`, and the poller does not read the
    /// device's async events yet (S5), where ConnectX's would end it
    /// sooner.
    pub srq_grace: Duration,
}

/// What the poller refused or passed over, for tests and accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolStats {
    /// Completions of no connection of this poller, live or ending (of
    /// one destroyed, or naming another tenant of its slot): counted,
    /// never believed.
    pub stale: u64,
    /// Joins refused because the poller was full.
    pub refused: u64,
    /// Joins that failed after their queue pair could receive: ended
    /// through ERR like a connection, never handed out.
    pub joins_ended: u64,
    /// Arrivals dropped because their connection had ended: those still
    /// waiting for their turn at an abort (a failure or a close hands
    /// them on first), and those that completed after the end.
    pub dropped_at_end: u64,
    /// Ended connections destroyed at their deadline without their send
    /// queue proven empty: their send-CQ entries stay booked for good.
    pub unproven_sends: u64,
    /// Ended connections destroyed after the grace, without the device's
    /// `QP_LAST_WQE_REACHED` (every one on rxe 6.1): a receive of the
    /// shared queue one held mid-message stays the NIC's (sound, lost).
    pub unproven_receives: u64,
}

/// A joining connection's send ring, READ ring, target ring, and their
/// slots' layout.
pub(super) type Rings = (Registration, Registration, SharedRegion, SlotLayout);

/// Where a queue pair number's connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Where {
    /// In the slab, at this slot.
    Live(u32),
    /// Ending, at this place of the endings.
    Ending(u32),
}

/// Many connections polled by one thread. `Send`, not `Sync`: the SRQ's
/// poster, the CQs' pollers and the queue pairs on them have one owner
/// (row 2 of the unsafe contract).
pub(crate) struct Poller {
    // Field order is drop order: the queue pairs (in the slab and the
    // endings) go before the SRQ ring their receives land in (which is
    // parked with the SRQ until the SRQ, held by every queue pair, is
    // destroyed), and before the CQs they complete on.
    pub(super) slab: Slab<Pooled>,
    /// Ended connections whose queue pairs the NIC may still use; as many
    /// as the send CQ's bookings allow, reserved up front.
    pub(super) endings: Vec<EndingConn>,
    pub(super) qpns: QpnTable<Where>,
    pub(super) ring: SrqRing,
    /// Arrivals past their connection's budget this turn, in order,
    /// holding their slots (declared after the ring: a slot is a token,
    /// not memory, and the ring outlives nothing by it).
    pub(super) fair: Fair<Arrival>,
    send: Reaper,
    recv: Reaper,
    pub(super) send_cq: Arc<CompletionQueue>,
    pub(super) recv_cq: Arc<CompletionQueue>,
    pub(super) budget: CqBudget,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) cfg: EngineConfig,
    pub(super) pool: PoolConfig,
    pub(super) stats: PoolStats,
    /// Connections to end at the end of this turn (reserved up front).
    pub(super) to_end: Vec<ConnId>,
    /// Connections `close` was called on, until they end (reserved).
    pub(super) closing: Vec<ConnId>,
    /// Accepted rdma_cm connections not yet established (reserved).
    pub(super) handshaking: Vec<ConnId>,
    /// The one event channel of every accepted connection's rdma_cm id
    /// (`None`: the device was opened without rdma_cm, which then takes
    /// only joins over TCP).
    pub(super) cm: Option<Arc<EventChannel>>,
    /// Turns until the channel is looked at again (a system call: not
    /// every turn of a busy poller).
    pub(super) cm_countdown: u32,
    /// A callback panicked while handed completions: the poller's events
    /// since are incomplete, so it hands on no more.
    pub(super) unwound: bool,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("connections", &self.slab.len())
            .field("ending", &self.endings.len())
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
        // librdmacm's own context of the device, so that rdma_cm joins
        // can make their queue pairs in this PD; without rdma_cm (no
        // `rdma_ucm` module), a context of our own, for joins over TCP.
        let (ctx, cm) = match Context::open_of_rdma_cm(device) {
            Ok(ctx) => (ctx, EventChannel::new().ok()),
            Err(e) => {
                tracing::debug!(error = %e, "no rdma_cm: the poller takes joins over TCP only");
                (Context::open(device)?, None)
            }
        };
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
        let max = pool.max_connections as usize;
        let mut poller = Poller {
            slab: Slab::with_capacity(pool.max_connections),
            endings: Vec::with_capacity(max),
            qpns: QpnTable::with_capacity(max),
            ring,
            fair: Fair::new(
                pool.max_connections,
                pool.srq_depth as usize,
                pool.per_conn_budget,
            ),
            send: Reaper::new(send),
            recv: Reaper::new(recv),
            send_cq,
            recv_cq,
            budget: CqBudget::new(send_depth),
            pd,
            cfg: cfg.clone(),
            pool,
            stats: PoolStats::default(),
            // One entry per live connection, plus one per slot whose
            // tenant ended in `finish_closing` after a waiting arrival
            // marked it (popped, stale, by the next turn's `end_marked`).
            to_end: Vec::with_capacity(2 * max),
            closing: Vec::with_capacity(max),
            handshaking: Vec::with_capacity(max),
            cm,
            cm_countdown: 0,
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

    /// Connections ended whose queue pairs are not yet destroyed.
    pub(crate) fn endings(&self) -> usize {
        self.endings.len()
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Requests not yet retired of each ending connection.
    #[cfg(test)]
    pub(crate) fn ending_outstanding(&self) -> Vec<u64> {
        self.endings
            .iter()
            .map(|e| e.conn.sq.ledger().outstanding())
            .collect()
    }

    /// Send-CQ entries booked by live and ending connections.
    #[cfg(test)]
    pub(crate) fn booked(&self) -> u32 {
        self.budget.booked()
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
    /// ([`Error::PoolFull`]). A join that fails after its queue pair could
    /// receive ends through ERR like a connection (it may hold a receive
    /// of the shared queue), never handed out.
    pub(crate) fn over_tcp(
        &mut self,
        stream: &mut TcpStream,
        remote_access: Access,
    ) -> Result<ConnId> {
        let id = self.reserve()?;
        let joined = self.join(id, stream, remote_access);
        self.settle_join(joined)
    }

    /// The slot the next join takes, its send-CQ entries booked; refused,
    /// nothing booked, when the poller is full (its slots, or its send CQ
    /// while connections are ending: each keeps its booking until its
    /// queue pair is destroyed).
    pub(super) fn reserve(&mut self) -> Result<ConnId> {
        self.check_not_unwound()?;
        let Some(id) = self.slab.vacant() else {
            self.stats.refused += 1;
            return Err(full("connections", &self.slab));
        };
        if let Err(over) = self.budget.book(self.cfg.qp.max_send_wr) {
            self.stats.refused += 1;
            return Err(Error::PoolFull {
                what: "send completion queue entries",
                limit: u64::from(over.left + self.budget.booked()),
            });
        }
        Ok(id)
    }

    /// Accounts for how a join on a [`reserve`](Self::reserve)d slot
    /// went: an ended one keeps its booking until its destroy, a failed
    /// one (its queue pair, if made, destroyed already) gives it back.
    pub(super) fn settle_join(
        &mut self,
        joined: std::result::Result<ConnId, Joining>,
    ) -> Result<ConnId> {
        match joined {
            Ok(id) => Ok(id),
            Err(Joining::Ended(error)) => {
                self.stats.joins_ended += 1;
                Err(error)
            }
            Err(Joining::Failed(error)) => {
                self.budget.release(self.cfg.qp.max_send_wr);
                Err(error)
            }
        }
    }

    /// The queue pair of a join on the shared queues (on rdma_cm id
    /// `cm_id`, if given), and its rings: send, READ, and the target ring
    /// the peer is allowed `remote_access` to.
    pub(super) fn endpoint_and_rings(
        &self,
        cm_id: Option<Arc<CmId>>,
        remote_access: Access,
    ) -> Result<(Endpoint, Rings)> {
        let cfg = &self.cfg;
        let layout = SlotLayout::new(cfg.slot_size as usize, cfg.slot_count as usize)?;
        crate::sys::mem::check_memlock(3 * layout.bytes() as u64)?;
        let queues = Queues {
            send_cq: &self.send_cq,
            recv_cq: &self.recv_cq,
            srq: Some(self.ring.srq()),
        };
        let ep = match cm_id {
            Some(id) => Endpoint::create_shared_on_cm(&self.pd, queues, id, &cfg.qp)?,
            None => Endpoint::create_shared(&self.pd, queues, &cfg.qp)?,
        };
        let send = ep.register_raw(layout.bytes(), cfg.pages, Access::LOCAL_READ)?;
        let read = ep.register_raw(layout.bytes(), cfg.pages, Access::LOCAL_WRITE)?;
        let target = SharedRegion::new(ep.register_raw(
            layout.bytes(),
            cfg.pages,
            Access::LOCAL_WRITE | remote_access,
        )?);
        Ok((ep, (send, read, target, layout)))
    }

    fn join(
        &mut self,
        id: ConnId,
        stream: &mut TcpStream,
        remote_access: Access,
    ) -> std::result::Result<ConnId, Joining> {
        let (ep, rings) = self.endpoint_and_rings(None, remote_access)?;
        let descriptor = rings.2.remote(0..rings.2.len())?;
        let cfg = &self.cfg;
        // Checked before the queue pair can receive: a record the poller
        // cannot use ends the join with nothing to drain.
        let handshake = Prepared::with_endpoint(ep, &cfg.qp, remote_access)?.handshake_keeping(
            stream,
            Some(descriptor),
            |peer| match peer.region {
                Some(_) => Ok(()),
                None => Err(Error::BadRecord("the peer exposed no target ring".into())),
            },
        );
        let (ep, peer) = match handshake {
            Ok(ep) => {
                let peer = ep.remote_region();
                (ep, peer)
            }
            Err(HandshakeFailed { error, at_rtr }) => {
                let Some(kept) = at_rtr else {
                    // Dropped inside, before the rings.
                    return Err(Joining::Failed(error));
                };
                let (ep, peer) = *kept;
                let conn = self.pooled(id, ep, rings, peer);
                self.end_join(id, conn);
                return Err(Joining::Ended(error));
            }
        };
        let conn = self.pooled(id, ep, rings, peer);
        self.admit(id, conn)
    }

    /// Puts joined connection `conn` into slot `id` (the slot `vacant`
    /// named) and its queue pair number into the table; should either
    /// refuse, the connection ends through ERR.
    pub(super) fn admit(
        &mut self,
        id: ConnId,
        conn: Pooled,
    ) -> std::result::Result<ConnId, Joining> {
        let qpn = conn.ep.qp_num();
        // A live queue pair's number is unique, and the table holds as
        // many as live and ending connections, whose bookings of the send
        // CQ (max_connections of them) bound them: neither refusal can
        // come.
        if self.qpns.insert(qpn, Where::Live(id.index)).is_err() {
            self.end_join(id, conn);
            return Err(Joining::Ended(full("queue pair numbers", &self.slab)));
        }
        match self.slab.insert(conn) {
            Ok(got) if got == id => Ok(id),
            // Named for another slot (never: `vacant` said which comes):
            // taken out again and ended.
            Ok(got) => {
                if let Some(conn) = self.slab.remove(got) {
                    self.end_join(got, conn);
                }
                Err(Joining::Ended(full("connections", &self.slab)))
            }
            Err(conn) => {
                self.end_join(id, conn);
                Err(Joining::Ended(full("connections", &self.slab)))
            }
        }
    }

    /// A connection of `ep` in slot `id`, on the rings `rings`, writing
    /// to `peer` (the peer's record had one: checked before RTR).
    pub(super) fn pooled(
        &self,
        id: ConnId,
        ep: Endpoint,
        rings: Rings,
        peer: Option<RemoteSlice>,
    ) -> Pooled {
        let cfg = &self.cfg;
        let (send, read, target, layout) = rings;
        let inline_threshold = cfg.inline_threshold.min(ep.max_inline()) as usize;
        let sq = SendQueue::named(
            self.send_cq.id(),
            PooledIds::new(id.index, id.gen),
            (send, read, layout),
            cfg.qp.max_send_wr,
            cfg.signal_interval,
            cfg.batch_size.max(1) as usize,
            inline_threshold,
        );
        Pooled {
            ep,
            sq,
            target,
            peer: peer.unwrap_or(RemoteSlice {
                addr: 0,
                len: 0,
                rkey: 0,
            }),
            failure: None,
            send_failed: false,
            stats: Stats::default(),
            is_closing: false,
            closing: None,
            end: None,
            handshaking: false,
            handshake: None,
        }
    }

    /// Ends a join that failed after its queue pair could receive: into
    /// ERR and the endings, unannounced.
    pub(super) fn end_join(&mut self, id: ConnId, mut conn: Pooled) {
        // The slot's id names no later tenant (none of this one's
        // requests was posted, but the generation argument holds anyway).
        self.slab.burn(id);
        if let Err(e) = conn.ep.disconnect_now() {
            tracing::warn!(error = %e, "moving a failed join's queue pair to ERR");
        }
        let ending = self.new_ending();
        self.park(EndingConn::new(id, conn, ending, false));
    }

    /// The connection `id` names, to post on; refused once it ended
    /// ([`Misuse::StaleConnection`]), never routed to a later tenant of
    /// its slot.
    pub(crate) fn conn(&mut self, id: ConnId) -> Result<PooledConn<'_>> {
        self.check_not_unwound()?;
        match self.slab.get_mut(id) {
            Some(conn) => Ok(PooledConn {
                id,
                conn,
                to_end: &mut self.to_end,
            }),
            None => Err(Misuse::StaleConnection.into()),
        }
    }

    /// Refuses everything once a callback panicked: the turn it panicked
    /// in retired other connections' requests unseen (a failure among
    /// them was never recorded), so nothing more is taken or handed out.
    pub(super) fn check_not_unwound(&self) -> Result<()> {
        if self.unwound {
            return Err(Error::CallbackPanicked);
        }
        Ok(())
    }

    /// One turn: polls the send CQ and the receive CQ once each, hands
    /// every event to `on` with its connection, ends the connections that
    /// failed or finished closing, moves every ending one step, and tops
    /// the shared queue up. Returns how many send completions were taken
    /// and arrivals handed on (those waiting from an earlier turn
    /// included): 0 means there was nothing to do.
    ///
    /// Should `on` panic, every completion the turn took is still settled
    /// (each send request retired, each receive's slot freed), and the
    /// poller hands on nothing more: every later `poll` and `conn` returns
    /// [`Error::CallbackPanicked`].
    pub(crate) fn poll(&mut self, mut on: impl FnMut(ConnId, PoolEvent<'_>)) -> Result<usize> {
        if self.unwound {
            return Err(Error::CallbackPanicked);
        }
        let sent = self.poll_sends(&mut on)?;
        let (handed, received) = self.poll_receives(&mut on)?;
        // Fewer than a batch: the receive CQ was emptied this turn.
        let drained = received < POLL_BATCH;
        // An error reading the CM channel is returned once the turn is
        // done: the endings still advance and the shared queue is refilled.
        let cm = self.poll_cm(sent + received == 0, &mut on);
        let timed =
            !self.closing.is_empty() || !self.endings.is_empty() || !self.handshaking.is_empty();
        let now = timed.then(Instant::now);
        if let (Some(now), Ok(CmRead::Emptied)) = (now, &cm) {
            // Only once every ESTABLISHED that came is taken: a busy
            // poller reads the channel seldom, and a client established in
            // time must not be taken for one that stalled.
            self.expire_handshakes(now);
        }
        self.end_marked(&mut on);
        if let Some(now) = now {
            self.finish_closing(now, &mut on);
            self.advance_endings(now, drained, &mut on);
        }
        self.top_up()?;
        cm?;
        Ok(sent + handed)
    }

    /// Posts the shared queue's free slots again, a batch at a time.
    fn top_up(&mut self) -> Result<()> {
        while self.ring.free() >= self.ring.batch() {
            self.ring.refill()?;
        }
        Ok(())
    }

    fn poll_sends(&mut self, on: &mut impl FnMut(ConnId, PoolEvent<'_>)) -> Result<usize> {
        let reaped = self.send.reap(POLL_BATCH)?;
        let mut walk = SendPoolWalk {
            slab: &mut self.slab,
            endings: &mut self.endings,
            qpns: &self.qpns,
            stats: &mut self.stats,
            to_end: &mut self.to_end,
            unwound: &mut self.unwound,
            rest: reaped.each(),
        };
        for polled in walk.rest.by_ref() {
            let qpn = polled.wc().qp_num();
            let judged = match find(walk.qpns, walk.slab, walk.endings, qpn) {
                None => {
                    walk.stats.stale += 1;
                    continue;
                }
                Some(Found::Live(id, conn)) => {
                    let mut verdict = Verdict::new(
                        &mut conn.failure,
                        &mut conn.send_failed,
                        false,
                        &mut conn.stats,
                    );
                    let judged = conn.sq.retire(polled.alone(), |retired| {
                        verdict.judge(retired, &mut |ev| on(id, PoolEvent::Conn(ev)))
                    });
                    conn.end_if_failed(id, walk.to_end);
                    judged
                }
                // Its flushes, counted, handed to no one.
                Some(Found::Ending(conn)) => {
                    let mut verdict = Verdict::new(
                        &mut conn.failure,
                        &mut conn.send_failed,
                        true,
                        &mut conn.stats,
                    );
                    conn.sq.retire(polled.alone(), |retired| {
                        verdict.judge(retired, &mut |_| {})
                    })
                }
            };
            // Refused (another tenant's id, or not outstanding): never
            // believed, counted.
            if judged.is_err() {
                walk.stats.stale += 1;
            }
        }
        std::mem::forget(walk);
        Ok(reaped.wcs().len())
    }

    /// Hands on the arrivals that waited for their turn, then takes the
    /// receive CQ's completions: each slot is settled first, whoever it
    /// is about; a live connection's arrival is handed on now, or waits
    /// if the connection used its budget this turn (or has arrivals
    /// waiting: its order holds).
    /// Returns the arrivals handed on (waiting ones included) and the
    /// completions taken.
    fn poll_receives(
        &mut self,
        on: &mut impl FnMut(ConnId, PoolEvent<'_>),
    ) -> Result<(usize, usize)> {
        self.fair.begin_turn();
        let mut handed = 0;
        while let Some((index, arrival)) = self.fair.next_waiting() {
            self.hand_on(index, arrival, on);
            handed += 1;
        }
        let reaped = self.recv.reap(POLL_BATCH)?;
        let mut walk = RecvPoolWalk {
            ring: &mut self.ring,
            unwound: &mut self.unwound,
            rest: reaped.each(),
            lent: None,
        };
        for polled in walk.rest.by_ref() {
            let wc = *polled.wc();
            let Ok(slot) = walk.ring.settle(polled) else {
                self.stats.stale += 1;
                continue;
            };
            match find(&self.qpns, &mut self.slab, &mut self.endings, wc.qp_num()) {
                Some(Found::Live(id, conn)) => {
                    let arrival = Arrival {
                        slot,
                        wc,
                        gen: id.gen,
                    };
                    // Full only if more slots were lent than the ring has.
                    let (Ok(Some(arrival)) | Err(arrival)) = self.fair.arrive(id.index, arrival)
                    else {
                        continue;
                    };
                    let lent = walk.lent.insert(arrival.slot);
                    let data = walk.ring.data(lent, wc.byte_len() as usize).unwrap_or(&[]);
                    deliver(conn, &wc, data, &mut |ev| on(id, PoolEvent::Conn(ev)));
                    conn.end_if_failed(id, &mut self.to_end);
                    handed += 1;
                }
                // Whatever an ended connection still receives is dropped.
                Some(Found::Ending(conn)) => {
                    walk.lent = Some(slot);
                    if wc.status() == WcStatus::SUCCESS {
                        self.stats.dropped_at_end += 1;
                    } else {
                        conn.stats.recv_flushed += 1;
                    }
                }
                None => {
                    walk.lent = Some(slot);
                    self.stats.stale += 1;
                }
            }
            if let Some(slot) = walk.lent.take() {
                let _ = walk.ring.release(slot);
            }
        }
        std::mem::forget(walk);
        Ok((handed, reaped.wcs().len()))
    }

    /// Hands `arrival`, which waited, to its connection in slot `index`
    /// (still the same tenant: a connection's waiting arrivals leave with
    /// it), then frees its slot; a panic in `on` frees it too.
    pub(super) fn hand_on(
        &mut self,
        index: u32,
        arrival: Arrival,
        on: &mut impl FnMut(ConnId, PoolEvent<'_>),
    ) {
        let Arrival { slot, wc, gen } = arrival;
        let mut walk = RecvPoolWalk {
            ring: &mut self.ring,
            unwound: &mut self.unwound,
            rest: std::iter::empty(),
            lent: Some(slot),
        };
        if let Some((id, conn)) = self.slab.at_mut(index).filter(|(id, _)| id.gen == gen) {
            if let Some(lent) = walk.lent.as_ref() {
                let data = walk.ring.data(lent, wc.byte_len() as usize).unwrap_or(&[]);
                deliver(conn, &wc, data, &mut |ev| on(id, PoolEvent::Conn(ev)));
                conn.end_if_failed(id, &mut self.to_end);
            }
        }
        if let Some(slot) = walk.lent.take() {
            let _ = walk.ring.release(slot);
        }
        std::mem::forget(walk);
    }
}

/// A receive's completion whose connection had used its budget for the
/// turn: its slot stays lent (the NIC is done with it, and it is not
/// posted again) until it is handed on.
#[derive(Debug)]
pub(crate) struct Arrival {
    slot: SrqSlot,
    wc: WorkCompletion,
    /// Its connection's generation (the slot index is the FIFO's key).
    gen: u32,
}

impl Arrival {
    /// Its slot, to free unread (its connection was aborted).
    pub(super) fn into_slot(self) -> SrqSlot {
        self.slot
    }
}

/// How a join failed: with nothing left to end, or with its queue pair
/// ending (it could receive).
pub(super) enum Joining {
    Failed(Error),
    Ended(Error),
}

impl From<Error> for Joining {
    fn from(error: Error) -> Joining {
        Joining::Failed(error)
    }
}

#[cold]
pub(super) fn full<T>(what: &'static str, slab: &Slab<T>) -> Error {
    Error::PoolFull {
        what,
        limit: slab.capacity() as u64,
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
