//! The end of a connection, and waiting for what is in flight: every
//! posted request completes (or flushes) before the rings can go.

use std::time::Duration;

use super::{Connection, Event, Stats};
use crate::error::{Error, Result};
use crate::sys::ledger::RequestKind;
use crate::wait::BoundedWait;

/// How long close waits for posted receives to come back flushed.
const RECV_FLUSH_GRACE: Duration = Duration::from_millis(500);

impl Connection {
    /// Polls until request `seq` retires, or the connection fails, or the
    /// completion timeout passes. `seq` (or a later request) must be signaled.
    pub fn wait_retired(&mut self, seq: u64) -> Result<()> {
        let mut wait = BoundedWait::new(self.completion_timeout, "a send completion");
        while !self.is_retired(seq) {
            if let Some(f) = self.failure {
                return Err(self.completion_error(f));
            }
            if self.reap()? == 0 {
                self.stats.wait_turns += 1;
            }
            if let Some(waited) = wait.tick()? {
                self.check_peer(waited)?;
            }
        }
        Ok(())
    }

    /// Makes sure a completion is coming for everything posted: when the
    /// newest requests are unsignaled, posts a signaled zero-length RDMA
    /// WRITE behind them (its completion retires them all) — also when an
    /// older signaled request is still in flight, whose completion would
    /// retire only the requests up to it. A full queue is reaped for room
    /// first: the events of what completes meanwhile are dropped.
    pub fn flush_tail(&mut self) -> Result<()> {
        self.sq.forget_leaked_batch();
        let ledger = self.sq.ledger();
        if ledger.outstanding() == 0 || ledger.tail_signaled() {
            return Ok(());
        }
        // Bounded: a device that stopped completing never makes room.
        let mut wait = BoundedWait::new(self.completion_timeout, "room for a flush marker");
        while self.sq.ledger().room() == 0 {
            if self.reap()? == 0 {
                wait.tick()?;
            }
        }
        self.post_marker()
    }

    /// Waits, up to the completion timeout, until every posted request has
    /// retired; completion events met meanwhile go to `on`, all of them.
    pub fn wait_idle(&mut self, mut on: impl FnMut(Event<'_>)) -> Result<()> {
        self.sq.forget_leaked_batch();
        let mut wait = BoundedWait::new(self.completion_timeout, "the send queue to drain");
        while self.outstanding() > 0 {
            // What flush_tail does, but a full queue makes room by polling
            // into `on` (flush_tail reaps, and reaping drops the events).
            let ledger = self.sq.ledger();
            if !ledger.tail_signaled() && ledger.room() > 0 {
                self.post_marker()?;
            }
            if self.poll_send(&mut on)? == 0 {
                self.stats.wait_turns += 1;
            }
            if let Some(waited) = wait.tick()? {
                self.check_peer(waited)?;
            }
        }
        Ok(())
    }

    /// Ends the connection gracefully. First every posted request
    /// completes, up to the completion timeout: a SEND or WRITE that
    /// completed was delivered (the peer's NIC acknowledged it), so
    /// `send(..)?; close()?` loses nothing. Then it disconnects (rdma_cm)
    /// or moves the QP to ERR, and polls until every posted receive came
    /// back flushed, so the NIC is done with every buffer before the QP,
    /// the rings and their registrations go. On a connection that already
    /// failed or ended nothing can be delivered: it ends at once.
    ///
    /// If the delivery fails or times out (a peer that stopped reposting
    /// receives holds a SEND in receiver-not-ready retries) the connection
    /// still ends, as [`abort`](Self::abort) does, and that error is
    /// returned: what was still queued may not have reached the peer.
    ///
    /// Dropping a connection does the same, ignoring errors: a drop may
    /// wait up to the completion timeout (a drop while a panic unwinds
    /// does not: it ends at once). [`abort`](Self::abort) never waits for
    /// delivery.
    pub fn close(mut self) -> Result<Stats> {
        self.end(true)?;
        Ok(self.stats())
    }

    /// Ends the connection at once: disconnects first, so whatever is still
    /// queued flushes and may never reach the peer, then waits (bounded)
    /// for the flushes as [`close`](Self::close) does, so no buffer is
    /// freed while the NIC may still use it.
    pub fn abort(mut self) -> Result<Stats> {
        self.end(false)?;
        Ok(self.stats())
    }

    /// Waits until every posted request has completed, unless the
    /// connection already failed or ended (then nothing more can be
    /// delivered). What did not complete is judged by [`end`](Self::end).
    fn deliver(&mut self) -> Result<()> {
        // A peer that closed first: only skips the wait.
        let _ = self.ep.peer_gone();
        if self.failure.is_some() || self.ep.was_disconnected() || self.outstanding() == 0 {
            return Ok(());
        }
        self.wait_idle(|_| {})
    }

    /// Ends the connection, delivering first when `graceful`; then a
    /// request of the caller's that failed or flushed during the end is an
    /// error (what ended the connection). The first error is returned;
    /// the connection ends whatever happened.
    fn end(&mut self, graceful: bool) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        let span = self.span.clone();
        let _in = span.enter();
        // A leaked batch's requests never went: nothing waits for them.
        self.sq.forget_leaked_batch();
        let undelivered_before = self.stats.undelivered;
        // Before `closing`: a failure while delivering is a failure, not
        // an expected flush.
        let delivered = if graceful { self.deliver() } else { Ok(()) };
        if let Err(e) = &delivered {
            tracing::debug!(error = %e, "the wait for delivery ended before everything completed");
        }
        self.closing = true;
        let disconnected = self.ep.disconnect();
        self.settle_sends()?;
        self.settle_receives()?;
        // What was lost decides, not how the wait for delivery ended: a
        // wait that timed out on the close's own marker (a peer gone
        // without a word) lost nothing of the caller's.
        let lost = self.stats.undelivered - undelivered_before;
        if graceful && (self.sq.ledger().is_unwound() || self.rq.is_unwound()) {
            // Whether the requests of that poll were delivered is unknown,
            // or receives were consumed unseen.
            delivered?;
            return Err(Error::CallbackPanicked);
        }
        if !graceful || lost == 0 {
            return disconnected;
        }
        tracing::debug!(lost, "requests of the caller's ended undelivered at close");
        delivered?;
        Err(match self.failure {
            Some(f) => self.completion_error(f),
            None => self.ep.end_error(),
        })
    }

    /// Polls until every posted send has retired, after the QP left RTS.
    fn settle_sends(&mut self) -> Result<()> {
        // Unsignaled requests that completed before the QP went to ERR make
        // no completion, and flushed ones make one each, in order. A
        // signaled marker posted now (to the ERR QP: it flushes at once)
        // therefore retires exactly the requests that completed silently.
        // One deadline for both: a device that stopped completing neither
        // makes room for the marker nor retires what is queued.
        let mut wait =
            BoundedWait::new(self.completion_timeout, "the send queue to flush at close");
        if self.outstanding() > 0 {
            while self.sq.ledger().room() == 0 {
                if self.poll(|_| {})? == 0 {
                    if let Err(e) = wait.tick() {
                        tracing::warn!(
                            sends = self.outstanding(),
                            "no room for the close's marker"
                        );
                        return Err(e);
                    }
                }
            }
            self.post_marker()?;
        }
        while self.outstanding() > 0 {
            if self.poll(|_| {})? == 0 {
                self.stats.wait_turns += 1;
                if let Err(e) = wait.tick() {
                    tracing::warn!(sends = self.outstanding(), "sends still posted at close");
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Gives the posted receives a short grace to come back flushed.
    fn settle_receives(&mut self) -> Result<()> {
        // Posted receives flush too, but rxe (Linux 6.1) flushes a receive
        // queue only when a packet arrives for it: give them a short grace.
        // What is left is released when the QP is destroyed — before the
        // rings are deregistered, so the NIC can no longer write into them.
        let mut grace = BoundedWait::new(RECV_FLUSH_GRACE, "receives to flush at close");
        while self.receives_outstanding() > 0 {
            if self.poll(|_| {})? > 0 {
                continue;
            }
            self.stats.wait_turns += 1;
            if grace.tick().is_err() {
                tracing::debug!(
                    receives = self.receives_outstanding(),
                    "receives not flushed at close; destroying the QP releases them"
                );
                break;
            }
        }
        Ok(())
    }

    /// For the engine's worker, as soon as it knows the connection ended
    /// under it: the connection is closing (its flushes are no news, no
    /// heartbeat or receive is posted any more). Unlike `end`, nothing is
    /// torn down: the worker still hands on what arrived or flushed.
    #[cfg(feature = "engine")]
    pub(crate) fn expect_flushes(&mut self) {
        self.closing = true;
    }

    /// For the engine's worker, once the connection ended under it: a
    /// signaled marker retires the requests that completed unsignaled
    /// before the end, which make no completion of their own.
    #[cfg(feature = "engine")]
    pub(crate) fn retire_after_end(&mut self) -> Result<()> {
        self.expect_flushes();
        self.sq.forget_leaked_batch();
        let ledger = self.sq.ledger();
        if ledger.outstanding() > 0 && !ledger.tail_signaled() && ledger.room() > 0 {
            self.post_marker()?;
        }
        Ok(())
    }

    #[cfg(feature = "engine")]
    /// Ends the connection at once, in place: for the engine's worker,
    /// whose drain already gave up waiting (its drop then does nothing).
    pub(crate) fn abort_in_place(&mut self) -> Result<()> {
        self.end(false)
    }

    /// A signaled zero-length RDMA WRITE, posted even after a failure.
    fn post_marker(&mut self) -> Result<()> {
        self.sq
            .post_marker(self.ep.qp(), self.peer, RequestKind::Marker)?;
        self.stats.doorbells += 1;
        Ok(())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Unwinding from a panic: end at once, deliver nothing more.
        if let Err(e) = self.end(!std::thread::panicking()) {
            tracing::warn!(error = %e, "connection did not drain cleanly at close");
        }
    }
}
