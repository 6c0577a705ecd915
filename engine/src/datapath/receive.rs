//! Receive completions: messages and immediates, one at a time
//! ([`Connection::recv`], [`Connection::try_recv`]) or as events
//! ([`Connection::poll`]), with the receives re-posted behind them.

use super::{Connection, Event, Incoming};
use crate::error::{Error, Result};
use crate::status::{WcError, WcOpcode, WcStatus};
use crate::sys::recv_queue::Arrival;
use crate::wait::BoundedWait;

impl Connection {
    /// Waits for the next SEND or WRITE_WITH_IMM, up to the completion
    /// timeout. While it waits longer than a few polls it also reaps send
    /// completions (bookkeeping, and to surface a failed send).
    #[inline]
    pub fn recv(&mut self) -> Result<Incoming<'_>> {
        let mut wait = BoundedWait::new(self.completion_timeout, "a message from the peer");
        loop {
            match self.poll_one_recv() {
                Ok(Some(arrival)) => return Ok(self.incoming(arrival)),
                Ok(None) => self.stats.wait_turns += 1,
                Err(e) => return Err(self.ended_error(e)),
            }
            if let Some(waited) = wait.tick()? {
                if self.outstanding() > 0 {
                    self.reap()?;
                }
                self.check_peer(waited)?;
            }
        }
    }

    /// The next SEND or WRITE_WITH_IMM if one has arrived: one poll of the
    /// receive CQ, no waiting. Send completions are left for [`reap`].
    ///
    /// [`reap`]: Connection::reap
    #[inline]
    pub fn try_recv(&mut self) -> Result<Option<Incoming<'_>>> {
        Ok(self.poll_one_recv()?.map(|arrival| self.incoming(arrival)))
    }

    /// Polls the receive CQ for one completion, after re-posting the
    /// receives that earlier calls consumed. An error completion fails the
    /// connection (a flushed one reports its cause).
    #[inline]
    fn poll_one_recv(&mut self) -> Result<Option<Arrival>> {
        self.check_failure()?;
        self.check_receiving()?;
        if self.rq.needs_refill() {
            self.rq.refill(self.ep.qp())?;
        }
        let mut got = None;
        self.rq.poll(1, |arrival, _| got = Some(arrival))?;
        match got {
            Some(arrival) if arrival.status == WcStatus::SUCCESS => {
                self.stats.received += 1;
                Ok(Some(arrival))
            }
            Some(arrival) => Err(self.recv_failed(arrival)),
            None => Ok(None),
        }
    }

    /// The error for a failed receive completion.
    #[cold]
    #[inline(never)]
    fn recv_failed(&mut self, arrival: Arrival) -> Error {
        let err = receive_error(&arrival);
        if err.status == WcStatus::WR_FLUSH_ERR {
            // A flushed receive is a consequence; the cause (a send that
            // failed) may still sit in the send CQ. That send may itself
            // have been flushed by the end of the connection (the peer
            // left, the device went): the end, read from rdma_cm and the
            // device, is named before any request it flushed.
            self.stats.recv_flushed += 1;
            if self.failure.is_none() {
                if let Err(e) = self.poll_send(&mut |_| {}) {
                    return e;
                }
            }
            return self.completion_error(self.failure.unwrap_or(err));
        }
        if self.failure.is_none() {
            self.failure = Some(err);
            self.stats.failed += 1;
        }
        Error::Completion(err)
    }

    /// What a receive completion delivered, as a borrow of the ring.
    #[inline]
    fn incoming(&self, arrival: Arrival) -> Incoming<'_> {
        Incoming {
            data: self.rq.data(&arrival),
            imm: arrival.imm,
            len: arrival.len,
        }
    }

    /// Polls the receive CQ for every completion there is, as events, and
    /// re-posts the receives behind them.
    #[inline]
    pub(super) fn poll_recv(&mut self, on: &mut impl FnMut(Event<'_>)) -> Result<usize> {
        let (failure, stats) = (&mut self.failure, &mut self.stats);
        let n = self.rq.poll(usize::MAX, |arrival, data| {
            if arrival.status == WcStatus::SUCCESS {
                stats.received += 1;
                on(match arrival.imm {
                    Some(imm) if arrival.write_imm => Event::WriteImm {
                        imm,
                        len: arrival.len,
                    },
                    _ => Event::Received { data },
                });
            } else if arrival.status == WcStatus::WR_FLUSH_ERR || failure.is_some() {
                stats.recv_flushed += 1;
                on(Event::RecvFlushed);
            } else {
                let err = receive_error(&arrival);
                *failure = Some(err);
                stats.failed += 1;
                on(Event::Failed(err));
            }
        })?;
        if n > 0 && self.failure.is_none() && !self.closing {
            self.rq.refill(self.ep.qp())?;
        }
        Ok(n)
    }

    /// Refuses to hand on receives once a poll's callback panicked while
    /// handed them: the receives that poll took after the panicking one
    /// were consumed unseen, and a message handed on later would hide the
    /// gap. The connection's own end still polls (it only counts).
    #[inline]
    pub(super) fn check_receiving(&self) -> Result<()> {
        if self.rq.is_unwound() && !self.closing {
            return Err(Error::CallbackPanicked);
        }
        Ok(())
    }

    /// Receives posted and not yet completed.
    pub(super) fn receives_outstanding(&self) -> u64 {
        self.rq.outstanding()
    }
}

fn receive_error(arrival: &Arrival) -> WcError {
    WcError {
        wr_id: arrival.pos,
        opcode: Some(WcOpcode::RECV),
        status: arrival.status,
        vendor_err: arrival.vendor_err,
    }
}
