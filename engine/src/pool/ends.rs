//! How a connection of a poller ends while the others carry on (§1.5 of
//! `docs/design/many-peers-per-core.md`): it leaves the slab at once (its
//! id is stale, its slot free for the next join), its queue pair goes to
//! ERR, and an [`Ending`] record keeps the queue pair and its rings until
//! a last signaled request proves its send queue empty and the shared
//! receive queue's grace has passed. Only then is the queue pair
//! destroyed, its rings freed and its completion-queue entries given
//! back. Nothing here waits: each poll turn moves every ending one step.

use std::time::Instant;

use super::ending::{Ending, Proof, Seen, Step};
use super::event::{EndCause, PoolEvent};
use super::poller::{Poller, Where};
use super::pooled::Pooled;
use super::slab::ConnId;
use crate::error::{Misuse, Result};
use crate::sys::ledger::RequestKind;

/// A connection that ended, until its queue pair is destroyed.
#[derive(Debug)]
pub(super) struct EndingConn {
    /// The id it had (stale since it ended), for its `Closed` event.
    pub(super) id: ConnId,
    pub(super) conn: Pooled,
    ending: Ending,
    marker_posted: bool,
    /// Whether the caller knows the connection (a join that failed half
    /// way was never handed out: its end is not reported).
    announce: bool,
}

impl EndingConn {
    /// `conn`, its queue pair already in ERR, ending from `now`.
    pub(super) fn new(id: ConnId, conn: Pooled, ending: Ending, announce: bool) -> EndingConn {
        EndingConn {
            id,
            conn,
            ending,
            marker_posted: false,
            announce,
        }
    }

    /// What the poller sees of it this turn.
    fn seen(&self) -> Seen {
        let ledger = self.conn.sq.ledger();
        if !self.marker_posted {
            if ledger.room() > 0 {
                Seen::Room
            } else {
                Seen::Tick
            }
        } else if ledger.outstanding() == 0 {
            Seen::MarkerDone
        } else {
            Seen::Tick
        }
    }

    /// Posts the marker that proves the send queue empty, unless nothing
    /// is outstanding (then there is nothing to prove). A post refused
    /// before the NIC saw it leaves the proof to the requests' own
    /// completions, or to the deadline.
    fn post_marker(&mut self) {
        self.marker_posted = true;
        if self.conn.sq.ledger().outstanding() == 0 {
            return;
        }
        let peer = self.conn.peer;
        match self
            .conn
            .sq
            .post_marker(self.conn.ep.qp(), peer, RequestKind::Marker)
        {
            Ok(_) => self.conn.stats.doorbells += 1,
            Err(e) => tracing::warn!(error = %e, "the end's marker was not posted"),
        }
    }
}

impl Poller {
    /// Ends connection `id` gracefully: it takes no more posts
    /// ([`Misuse::ConnectionClosing`]), and once everything it had posted
    /// has completed (delivered to the peer's NIC), or the completion
    /// timeout has passed, a poll turn ends it
    /// ([`PoolEvent::Ended`] with [`EndCause::Closed`] or
    /// [`EndCause::CloseTimedOut`]). Calling it again changes nothing.
    pub(crate) fn close(&mut self, id: ConnId) -> Result<()> {
        self.check_not_unwound()?;
        // Too far to represent: no deadline (a `Duration::MAX` setting).
        let deadline = Instant::now().checked_add(self.cfg.completion_timeout);
        let conn = self.slab.get_mut(id).ok_or(Misuse::StaleConnection)?;
        if !conn.is_closing && conn.end.is_none() {
            conn.is_closing = true;
            conn.closing = deadline;
            debug_assert!(self.closing.len() < self.closing.capacity());
            self.closing.push(id);
        }
        Ok(())
    }

    /// Ends connection `id` at once: its queue pair goes to ERR, so what
    /// it had queued flushes and may never reach the peer, and its id is
    /// stale on return (its slot is the next join's). Its queue pair and
    /// rings stay until a poll turn has proven the NIC done with them
    /// ([`PoolEvent::Closed`]).
    pub(crate) fn abort(&mut self, id: ConnId) -> Result<()> {
        self.check_not_unwound()?;
        if self.end_now(id, EndCause::Aborted, true).is_none() {
            return Err(Misuse::StaleConnection.into());
        }
        Ok(())
    }

    /// Moves live connection `id` out of the slab, its queue pair to ERR,
    /// and into the endings; `None` for an id that names no live
    /// connection.
    pub(super) fn end_now(&mut self, id: ConnId, cause: EndCause, announce: bool) -> Option<()> {
        // Made before the connection leaves the slab: nothing after can
        // fail half way.
        let ending = self.new_ending();
        let mut conn = self.slab.remove(id)?;
        // Off the lists of connections being closed or accepted: a later
        // tenant of the slot may join them, and each holds one entry per
        // slot at most (their capacity).
        for list in [&mut self.closing, &mut self.handshaking] {
            if let Some(at) = list.iter().position(|listed| *listed == id) {
                list.swap_remove(at);
            }
        }
        // Arrivals still waiting (an abort's: the others were handed on
        // first) go unread; the slot's next tenant starts afresh.
        let (ring, stats) = (&mut self.ring, &mut self.stats);
        self.fair.forget(id.index, |arrival| {
            stats.dropped_at_end += 1;
            let _ = ring.release(arrival.into_slot());
        });
        conn.end = Some(cause);
        conn.closing = None;
        conn.is_closing = false;
        conn.sq.forget_leaked_batch();
        if let Err(e) = conn.ep.disconnect_now() {
            tracing::warn!(error = %e, "moving an ending connection's queue pair to ERR");
        }
        self.park(EndingConn::new(id, conn, ending, announce));
        Some(())
    }

    /// An ending's state machine, from now.
    pub(super) fn new_ending(&self) -> Ending {
        Ending::new(
            Instant::now(),
            self.cfg.completion_timeout,
            self.pool.srq_grace,
        )
    }

    /// Keeps `ending` until its queue pair can be destroyed; its queue
    /// pair number names it from now on.
    pub(super) fn park(&mut self, ending: EndingConn) {
        let qpn = ending.conn.ep.qp_num();
        let at = self.endings.len() as u32;
        // Never beyond its capacity: every live or ending connection
        // holds a booking of the send CQ, which holds max_connections.
        debug_assert!(self.endings.len() < self.endings.capacity());
        self.endings.push(ending);
        if self.qpns.replace(qpn, Where::Ending(at)).is_none() {
            // A join that failed half way was never in the table.
            let _ = self.qpns.insert(qpn, Where::Ending(at));
        }
    }

    /// Ends the connections marked to end this turn (a failure, a post
    /// that failed unnamed), telling the caller.
    pub(super) fn end_marked(&mut self, on: &mut impl FnMut(ConnId, PoolEvent<'_>)) {
        while let Some(id) = self.to_end.pop() {
            let Some(cause) = self.slab.get(id).and_then(|conn| conn.end) else {
                continue;
            };
            self.hand_on_all(id, on);
            self.end_now(id, cause, true);
            self.tell(id, PoolEvent::Ended(cause), on);
        }
    }

    /// Ends the closing connections whose requests have all retired, or
    /// whose deadline passed; posts a marker behind a closing connection's
    /// unsignaled tail, so that its completion retires them.
    pub(super) fn finish_closing(
        &mut self,
        now: Instant,
        on: &mut impl FnMut(ConnId, PoolEvent<'_>),
    ) {
        let mut i = 0;
        while i < self.closing.len() {
            let id = self.closing[i];
            let Some(conn) = self.slab.get_mut(id).filter(|c| c.end.is_none()) else {
                // Ended meanwhile (a failure, an abort): its cause stands.
                self.closing.swap_remove(i);
                continue;
            };
            let ledger = conn.sq.ledger();
            let cause = if ledger.outstanding() == 0 {
                EndCause::Closed
            } else if conn.closing.is_some_and(|deadline| now >= deadline) {
                EndCause::CloseTimedOut
            } else {
                if !ledger.tail_signaled() && ledger.room() > 0 {
                    let peer = conn.peer;
                    match conn.sq.post_marker(conn.ep.qp(), peer, RequestKind::Marker) {
                        Ok(_) => conn.stats.doorbells += 1,
                        // The queue pair is in ERR: what it held flushes,
                        // and the end says why (next turn).
                        Err(_) if conn.sq.broken().is_some() => {
                            conn.mark_end(id, EndCause::PostIndeterminate, &mut self.to_end)
                        }
                        Err(e) => tracing::warn!(error = %e, "a closing connection's marker"),
                    }
                }
                i += 1;
                continue;
            };
            self.closing.swap_remove(i);
            self.hand_on_all(id, on);
            self.end_now(id, cause, true);
            self.tell(id, PoolEvent::Ended(cause), on);
        }
    }

    /// Hands connection `id` every arrival it has waiting, whatever its
    /// budget: it received them before it ended.
    fn hand_on_all(&mut self, id: ConnId, on: &mut impl FnMut(ConnId, PoolEvent<'_>)) {
        while let Some(arrival) = self.fair.take_of(id.index) {
            self.hand_on(id.index, arrival, on);
        }
    }

    /// Moves every ending one step: posts its marker when there is room,
    /// and destroys its queue pair once proven (or past its deadline),
    /// then frees its rings and tells the caller.
    pub(super) fn advance_endings(
        &mut self,
        now: Instant,
        drained: bool,
        on: &mut impl FnMut(ConnId, PoolEvent<'_>),
    ) {
        let mut i = 0;
        while i < self.endings.len() {
            let ending = &mut self.endings[i];
            let mut step = ending.ending.on_turn(ending.seen(), now, drained);
            if step == Some(Step::PostMarker) {
                ending.post_marker();
                step = ending.ending.on_turn(ending.seen(), now, drained);
            }
            match step {
                Some(Step::Destroy(proof)) => self.destroy(i, proof, on),
                _ => i += 1,
            }
        }
    }

    /// Destroys ending `at`'s queue pair, then its rings; gives its
    /// completion-queue entries back only if its send queue was proven
    /// empty (else a flush could still be on its way: they stay booked).
    fn destroy(&mut self, at: usize, proof: Proof, on: &mut impl FnMut(ConnId, PoolEvent<'_>)) {
        let gone = self.endings.swap_remove(at);
        if let Some(moved) = self.endings.get(at) {
            let qpn = moved.conn.ep.qp_num();
            self.qpns.replace(qpn, Where::Ending(at as u32));
        }
        let EndingConn {
            id, conn, announce, ..
        } = gone;
        let qpn = conn.ep.qp_num();
        let stats = conn.stats;
        // The queue pair first, then the rings its requests named.
        drop(conn);
        // Only now: until the destroy, a completion of it could come.
        self.qpns.remove(qpn);
        if proof.send {
            self.budget.release(self.cfg.qp.max_send_wr);
        } else {
            self.stats.unproven_sends += 1;
        }
        if !proof.receive {
            self.stats.unproven_receives += 1;
        }
        if announce {
            self.tell(id, PoolEvent::Closed { stats, proof }, on);
        }
    }

    /// Hands `event` to the caller; a panic in it leaves the poller
    /// refusing (`unwound`), its state settled before the call.
    pub(super) fn tell(
        &mut self,
        id: ConnId,
        event: PoolEvent<'_>,
        on: &mut impl FnMut(ConnId, PoolEvent<'_>),
    ) {
        self.unwound = true;
        on(id, event);
        self.unwound = false;
    }
}
