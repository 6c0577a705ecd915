//! Send completions: polling the send CQ, retiring what completed, and
//! turning it into [`Event`]s — or, for [`Connection::reap`], into
//! bookkeeping only.

use super::{Connection, Event, Stats};
use crate::error::Result;
use crate::status::{WcError, WcStatus};
use crate::sys::send_queue::{Retired, POLL_BATCH};

impl Connection {
    /// Polls the send CQ once for bookkeeping only (retire, free slots);
    /// completion events are dropped, an error is returned.
    #[inline]
    pub fn reap(&mut self) -> Result<usize> {
        let mut failure = None;
        let n = self.poll_send(&mut |ev| {
            if let Event::Failed(e) = ev {
                failure = Some(e);
            }
        })?;
        match failure {
            Some(e) => Err(self.completion_error(e)),
            None => Ok(n),
        }
    }

    /// Polls both completion queues once and hands every event to `on`.
    /// Returns how many completions were taken.
    #[inline]
    pub fn poll(&mut self, mut on: impl FnMut(Event<'_>)) -> Result<usize> {
        let sent = self.poll_send(&mut on)?;
        let received = self.poll_recv(&mut on)?;
        Ok(sent + received)
    }

    /// The most events the next [`poll`](Connection::poll) can hand on:
    /// one per request retired (every outstanding one, at most) and one
    /// per receive completion.
    #[inline]
    pub(crate) fn events_per_poll(&self) -> usize {
        self.outstanding() as usize + POLL_BATCH
    }

    #[inline]
    pub(super) fn poll_send(&mut self, on: &mut impl FnMut(Event<'_>)) -> Result<usize> {
        let mut verdict = Verdict {
            failure: &mut self.failure,
            closing: self.closing,
            stats: &mut self.stats,
        };
        self.sq.poll(|retired| verdict.judge(retired, on))
    }
}

/// How a retired request is reported, given the connection's state.
struct Verdict<'a> {
    failure: &'a mut Option<WcError>,
    closing: bool,
    stats: &'a mut Stats,
}

impl Verdict<'_> {
    #[inline(always)]
    fn judge(&mut self, r: Retired<'_>, on: &mut impl FnMut(Event<'_>)) {
        // Requests retired with a later completion completed silently,
        // unless that completion is the failure (then they were flushed).
        let ok = r.status == WcStatus::SUCCESS || (!r.named && self.failure.is_none());
        let opcode = r.request.kind.completion_opcode();
        if ok {
            self.stats.completed += 1;
            if r.named && r.request.signaled && !r.request.kind.is_internal() {
                match r.read {
                    Some(data) => on(Event::ReadCompleted { seq: r.seq, data }),
                    None => on(Event::Completed { seq: r.seq, opcode }),
                }
            }
        } else if self.failure.is_none()
            && r.named
            && !(self.closing && r.status == WcStatus::WR_FLUSH_ERR)
        {
            let err = WcError {
                wr_id: r.seq,
                opcode: Some(opcode),
                status: r.status,
                vendor_err: r.vendor_err,
            };
            *self.failure = Some(err);
            self.stats.failed += 1;
            self.stats.undelivered += u64::from(!r.request.kind.is_internal());
            on(Event::Failed(err));
        } else {
            // After the failure every request completes, flushed.
            self.stats.flushed += 1;
            self.stats.undelivered += u64::from(!r.request.kind.is_internal());
            on(Event::Flushed {
                seq: r.seq,
                opcode: Some(opcode),
            });
        }
    }
}
