//! Whether the peer is still there, and what a failure is reported as:
//! heartbeats on an idle connection, rdma_cm and device events noticed
//! from the slow turns of every wait, and the cause named behind a flush.

use std::time::{Duration, Instant};

use super::Connection;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::status::{WcError, WcStatus};
use crate::sys::ledger::RequestKind;
use crate::wait::BoundedWait;

/// A wait this long also asks rdma_cm whether the peer disconnected (a
/// system call, so never on a wait that is about to succeed).
const PEER_CHECK_AFTER: Duration = Duration::from_millis(1);
/// How long an error completion that a departing peer causes waits for
/// that peer's disconnect to arrive and name the cause.
const PEER_LEFT_GRACE: Duration = Duration::from_millis(200);
/// How long a flush whose cause is not known yet waits for it. A queue
/// pair flushes only after an end (a disconnect, a device event) or a
/// failure; the event that names the end can reach rdma_cm's channel
/// after the first flushed completion. Paid once per connection (with
/// [`PEER_LEFT_GRACE`]: whichever comes first).
const FLUSH_CAUSE_GRACE: Duration = Duration::from_secs(1);

/// Heartbeat state of an idle connection.
#[derive(Debug)]
pub(super) struct Heartbeat {
    interval: Option<Duration>,
    misses: u32,
    last_activity: Instant,
    /// Completions + receives when last looked at: a change is activity.
    seen_activity: u64,
    /// The heartbeat in flight.
    outstanding: Option<InFlight>,
}

/// A heartbeat posted and not yet answered.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    seq: u64,
    sent: Instant,
}

impl Heartbeat {
    pub(super) fn new(cfg: &EngineConfig) -> Heartbeat {
        Heartbeat {
            interval: cfg.heartbeat_interval,
            misses: cfg.heartbeat_misses,
            last_activity: Instant::now(),
            seen_activity: 0,
            outstanding: None,
        }
    }
}

impl Connection {
    /// Called from the slow path of every wait (when the clock is read):
    /// notices an rdma_cm disconnect, after which the QP flushes.
    #[inline(never)]
    pub(super) fn check_peer(&mut self, waited: Duration) -> Result<()> {
        if waited >= PEER_CHECK_AFTER {
            self.ep.peer_gone()?;
            self.keepalive()?;
        }
        Ok(())
    }

    /// Asks rdma_cm and the device's asynchronous events (without
    /// blocking) whether the peer disconnected or the port failed; if so
    /// this side disconnects too and the QP flushes. Returns whether it did.
    pub fn peer_gone(&mut self) -> Result<bool> {
        self.ep.peer_gone()
    }

    /// Heartbeats for idle connections (slow path: reads the clock). When
    /// nothing completed for `heartbeat_interval`, posts a signaled
    /// zero-length RDMA WRITE; if that stays unanswered for
    /// `heartbeat_interval × heartbeat_misses`, the peer is declared dead
    /// and the connection is ended. Called by the waits and the worker.
    pub fn keepalive(&mut self) -> Result<()> {
        let Some(interval) = self.heartbeat.interval else {
            return Ok(());
        };
        if self.failure.is_some() || self.closing {
            return Ok(());
        }
        let now = Instant::now();
        let activity = self.stats.completed + self.stats.received;
        let hb = &mut self.heartbeat;
        if activity != hb.seen_activity {
            hb.seen_activity = activity;
            hb.last_activity = now;
            hb.outstanding = None;
            return Ok(());
        }
        match hb.outstanding {
            Some(beat) if beat.seq < self.sq.ledger().retired() => {
                hb.outstanding = None;
                hb.last_activity = now;
            }
            Some(beat) => {
                let waited = now - beat.sent;
                if waited >= interval * hb.misses {
                    let _ = self.ep.disconnect();
                    return Err(Error::PeerUnresponsive { waited });
                }
            }
            None if now - hb.last_activity >= interval && self.sq.ledger().room() > 0 => {
                let seq = self
                    .sq
                    .post_marker(self.ep.qp(), self.peer, RequestKind::Heartbeat)?;
                self.stats.doorbells += 1;
                self.heartbeat.outstanding = Some(InFlight { seq, sent: now });
            }
            None => {}
        }
        Ok(())
    }

    /// The error for a failed work completion. A flush after the
    /// connection ended under this side — the peer left, or a device event
    /// (port error, device removal) — is reported as that end: the flush
    /// is only its consequence. Pending rdma_cm and device events are read
    /// first, so the cause is known even if no wait has looked yet.
    #[cold]
    #[inline(never)]
    pub(super) fn completion_error(&mut self, wc: WcError) -> Error {
        let span = self.span.clone();
        let _in = span.enter();
        if wc.status == WcStatus::WR_FLUSH_ERR {
            // A device that went away, or a peer that left, is why the QP
            // flushes — also when a post failed meanwhile because of it.
            if self.end_seen(Duration::ZERO) {
                return self.ep.end_error();
            }
            // Otherwise a post that failed without naming what it refused
            // moved the QP to ERR: that, not the flush, is what happened.
            if let Some(broken) = self.sq.broken().or(self.rq.broken()) {
                return broken.error();
            }
            // Or the end is on its way: a QP flushes only after one.
            if !self.closing && !self.end_awaited && self.end_seen(FLUSH_CAUSE_GRACE) {
                return self.ep.end_error();
            }
        }
        if matches!(
            wc.status,
            WcStatus::REM_ACCESS_ERR
                | WcStatus::REM_OP_ERR
                | WcStatus::REM_INV_REQ_ERR
                | WcStatus::RETRY_EXC_ERR
        ) && self.end_seen(PEER_LEFT_GRACE)
        {
            // What a peer process that dies leaves behind (its kernel tears
            // down its regions and QP while its disconnect is on the way)
            // fails like this. A disconnect close behind names the cause;
            // the status stays in the error.
            return match self.ep.end_error() {
                Error::Disconnected => Error::PeerLeft(wc),
                other => other,
            };
        }
        Error::Completion(wc)
    }

    /// Whether the connection's end (a disconnect, a device event) is
    /// known, reading rdma_cm's and the device's pending events, for up to
    /// `grace` if it is not yet. Only the first wait of a connection waits:
    /// later reports of the same failure only look, once (two polls).
    fn end_seen(&mut self, grace: Duration) -> bool {
        let limit = if self.end_awaited {
            Duration::ZERO
        } else {
            grace
        };
        self.end_awaited |= !grace.is_zero();
        let _ = self.ep.peer_gone();
        if self.ep.was_disconnected() {
            return true;
        }
        if limit.is_zero() {
            return false;
        }
        // Events are looked for each time the wait reads its clock.
        let mut wait = BoundedWait::new(limit, "the connection's end");
        loop {
            match wait.tick() {
                Ok(None) => {}
                Ok(Some(_)) => {
                    let _ = self.ep.peer_gone();
                    if self.ep.was_disconnected() {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// [`completion_error`](Self::completion_error) for any error.
    pub(super) fn ended_error(&mut self, err: Error) -> Error {
        match err {
            Error::Completion(wc) => self.completion_error(wc),
            err => err,
        }
    }
}
