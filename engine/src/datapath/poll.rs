//! Send completions: polling the send CQ, retiring what completed, and
//! turning it into [`Event`]s — or, for [`Connection::reap`], into
//! bookkeeping only.

use super::{Connection, Event, Stats};
use crate::error::Result;
use crate::status::{WcError, WcStatus};
use crate::sys::ledger::RequestKind;
use crate::sys::send_queue::Retired;

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
    ///
    /// Should `on` panic while it is handed send completions, the requests
    /// the poll took are retired (their memory is free again) but get no
    /// verdict: the connection then takes no more requests
    /// ([`Error::CallbackPanicked`](crate::Error::CallbackPanicked), also
    /// from `close`). Should it panic while handed receives, the receives
    /// that poll took after that one are consumed unseen: from then on
    /// every call that would hand on a receive (`poll`, `recv`, `try_recv`)
    /// returns `CallbackPanicked`, and so does `close`.
    #[inline]
    pub fn poll(&mut self, mut on: impl FnMut(Event<'_>)) -> Result<usize> {
        // Before anything is handed on: a refused poll hands on nothing.
        self.check_receiving()?;
        let sent = self.poll_send(&mut on)?;
        let received = self.poll_recv(&mut on)?;
        Ok(sent + received)
    }

    #[cfg(feature = "engine")]
    /// The most events the next [`poll`](Connection::poll) can hand on:
    /// one per request retired (every outstanding one, at most) and one
    /// per receive completion.
    #[inline]
    pub(crate) fn events_per_poll(&self) -> usize {
        self.outstanding() as usize + crate::sys::send_queue::POLL_BATCH
    }

    #[inline]
    pub(super) fn poll_send(&mut self, on: &mut impl FnMut(Event<'_>)) -> Result<usize> {
        let mut verdict = Verdict::new(
            &mut self.failure,
            &mut self.send_failed,
            self.closing,
            &mut self.stats,
        );
        self.sq.poll(|retired| verdict.judge(retired, on))
    }
}

/// How a retired request is reported, given the connection's state (a
/// [`Connection`]'s, or a pooled connection's).
pub(crate) struct Verdict<'a> {
    failure: &'a mut Option<WcError>,
    /// A send completion named an error: from then on the send queue
    /// flushes, and a request retired unnamed was not delivered. (A
    /// receive failure alone says nothing about sends already retired.)
    /// A copy, read per request: read through the reference, it made the
    /// compiler store the ledger's counters on every request.
    send_failed: bool,
    /// The connection's flag, written when a send completion fails.
    send_failed_flag: &'a mut bool,
    closing: bool,
    stats: &'a mut Stats,
}

impl<'a> Verdict<'a> {
    /// The verdicts of a connection whose state is `failure`,
    /// `send_failed`, `closing` and `stats`.
    #[inline(always)]
    pub(crate) fn new(
        failure: &'a mut Option<WcError>,
        send_failed: &'a mut bool,
        closing: bool,
        stats: &'a mut Stats,
    ) -> Verdict<'a> {
        Verdict {
            failure,
            send_failed: *send_failed,
            send_failed_flag: send_failed,
            closing,
            stats,
        }
    }

    #[inline(always)]
    pub(crate) fn judge(&mut self, r: Retired<'_>, on: &mut impl FnMut(Event<'_>)) {
        // Requests retired with a later completion completed silently,
        // unless the send queue failed before (then they were flushed).
        if r.status == WcStatus::SUCCESS || (!r.named && !self.send_failed) {
            self.stats.completed += 1;
            if r.named && r.request.signaled && !r.request.kind.is_internal() {
                let opcode = r.request.kind.completion_opcode();
                match r.read {
                    Some(data) => on(Event::ReadCompleted { seq: r.seq, data }),
                    None => on(Event::Completed { seq: r.seq, opcode }),
                }
            }
        } else {
            // Inline, as all of the walk: a call in the loop, even on this
            // path, made the compiler keep the ledger's counters in memory.
            self.undelivered(r.seq, r.named, r.request.kind, r.status, r.vendor_err, on);
        }
    }

    /// A request that failed, or flushed after a failure.
    #[inline(always)]
    fn undelivered(
        &mut self,
        seq: u64,
        named: bool,
        kind: RequestKind,
        status: WcStatus,
        vendor_err: u32,
        on: &mut impl FnMut(Event<'_>),
    ) {
        let internal = kind.is_internal();
        let opcode = kind.completion_opcode();
        if named {
            self.send_failed = true;
            *self.send_failed_flag = true;
        }
        if self.failure.is_none() && named && !(self.closing && status == WcStatus::WR_FLUSH_ERR) {
            // The caller never had an internal request's seq; reporting
            // it would name whichever request an id table last kept there.
            let err = WcError {
                wr_id: if internal { WcError::INTERNAL } else { seq },
                opcode: Some(opcode),
                status,
                vendor_err,
            };
            *self.failure = Some(err);
            self.stats.failed += 1;
            self.stats.undelivered += u64::from(!internal);
            on(Event::Failed(err));
        } else {
            // After the failure every request completes, flushed; only
            // the caller's own are news to the caller.
            self.stats.flushed += 1;
            if !internal {
                self.stats.undelivered += 1;
                on(Event::Flushed {
                    seq,
                    opcode: Some(opcode),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::WcOpcode;
    use crate::sys::ledger::Request;

    /// What a run of retirements made of the connection's state.
    #[derive(Default)]
    struct Judged {
        failure: Option<WcError>,
        send_failed: bool,
        stats: Stats,
        events: Vec<String>,
    }

    impl Judged {
        fn retire(&mut self, seq: u64, kind: RequestKind, named: bool, status: WcStatus) {
            let mut verdict = Verdict::new(
                &mut self.failure,
                &mut self.send_failed,
                false,
                &mut self.stats,
            );
            let request = Request {
                kind,
                signaled: named,
                ..Request::default()
            };
            let retired = Retired {
                seq,
                request,
                named,
                status,
                vendor_err: 0,
                read: None,
            };
            let events = &mut self.events;
            verdict.judge(retired, &mut |ev| events.push(format!("{ev:?}")));
        }
    }

    #[test]
    fn the_engines_own_requests_fail_under_no_callers_id_and_flush_unreported() {
        let mut j = Judged::default();
        j.retire(7, RequestKind::Heartbeat, true, WcStatus::RETRY_EXC_ERR);
        j.retire(8, RequestKind::Send, true, WcStatus::WR_FLUSH_ERR);
        j.retire(9, RequestKind::Marker, true, WcStatus::WR_FLUSH_ERR);
        let failure = j
            .failure
            .expect("the heartbeat's failure is the connection's");
        assert_eq!(failure.wr_id, WcError::INTERNAL);
        assert_eq!(failure.opcode, Some(WcOpcode::RDMA_WRITE));
        assert_eq!(j.events.len(), 2, "{:?}", j.events);
        assert!(j.events[0].starts_with("Failed"), "{:?}", j.events);
        assert!(
            j.events[0].contains(&u64::MAX.to_string()),
            "{:?}",
            j.events
        );
        assert_eq!(j.events[1], "Flushed { seq: 8, opcode: Some(SEND) }");
        // Counted, but only the caller's send is undelivered.
        assert_eq!((j.stats.failed, j.stats.flushed), (1, 2));
        assert_eq!(j.stats.undelivered, 1);
    }

    #[test]
    fn sends_retired_silently_after_a_receive_failure_were_delivered() {
        // A receive failure: the connection failed, its send queue did not.
        let mut j = Judged {
            failure: Some(WcError {
                wr_id: 0,
                opcode: Some(WcOpcode::RECV),
                status: WcStatus::LOC_LEN_ERR,
                vendor_err: 0,
            }),
            ..Judged::default()
        };
        // Unsignaled sends the peer acknowledged, retired by the flush of
        // the request after them.
        for seq in 0..3 {
            j.retire(seq, RequestKind::Send, false, WcStatus::WR_FLUSH_ERR);
        }
        j.retire(3, RequestKind::Send, true, WcStatus::WR_FLUSH_ERR);
        // Once the send queue flushed, silent retirements were flushed too.
        j.retire(4, RequestKind::Send, false, WcStatus::WR_FLUSH_ERR);
        j.retire(5, RequestKind::Send, true, WcStatus::WR_FLUSH_ERR);
        assert_eq!(j.stats.completed, 3, "{:?}", j.events);
        assert_eq!((j.stats.flushed, j.stats.undelivered), (3, 3));
        let flushed: Vec<_> = j
            .events
            .iter()
            .filter(|e| e.starts_with("Flushed"))
            .collect();
        assert_eq!(flushed.len(), 3, "{:?}", j.events);
    }
}
