//! One connection of a poller: its queue pair, send queue and rings, and
//! what the caller posts on it.

use std::time::Instant;

use super::event::EndCause;
use super::slab::ConnId;
use crate::datapath::{Event, Stats};
use crate::endpoint::Endpoint;
use crate::error::{Misuse, Result};
use crate::status::{WcError, WcOpcode, WcStatus};
use crate::sys::cq::WorkCompletion;
use crate::sys::mr::RemoteSlice;
use crate::sys::region::SharedRegion;
use crate::sys::send_names::PooledIds;
use crate::sys::send_queue::{Outbound, SendQueue};

/// One connection of the poller, in drop order: its queue pair goes
/// before the rings its requests name and the ring its peer writes.
pub(super) struct Pooled {
    pub(super) ep: Endpoint,
    pub(super) sq: SendQueue<PooledIds>,
    pub(super) target: SharedRegion,
    pub(super) peer: RemoteSlice,
    pub(super) failure: Option<WcError>,
    pub(super) send_failed: bool,
    pub(super) stats: Stats,
    /// `close` was called: nothing more is posted, and the connection
    /// ends once its requests have retired, or at `closing` (`None`: a
    /// timeout too far to represent, never).
    pub(super) is_closing: bool,
    pub(super) closing: Option<Instant>,
    /// Why it is to end, once it is on the poller's list of connections
    /// to end (on it at most once).
    pub(super) end: Option<EndCause>,
    /// An accepted rdma_cm connection not yet established, and the
    /// deadline of its handshake (`None`: never).
    pub(super) handshaking: bool,
    pub(super) handshake: Option<Instant>,
}

impl Pooled {
    /// Puts the connection on `to_end` for `cause`, unless it is on it
    /// already (the first cause stands).
    pub(super) fn mark_end(&mut self, id: ConnId, cause: EndCause, to_end: &mut Vec<ConnId>) {
        if self.end.is_none() {
            self.end = Some(cause);
            // Never beyond its capacity (one entry per live connection),
            // so never an allocation.
            debug_assert!(to_end.len() < to_end.capacity());
            to_end.push(id);
        }
    }

    /// Marks the connection to end if a completion failed it.
    pub(super) fn end_if_failed(&mut self, id: ConnId, to_end: &mut Vec<ConnId>) {
        if let Some(failure) = self.failure {
            self.mark_end(id, EndCause::Failed(failure), to_end);
        }
    }
}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("qp", &self.ep.qp_num())
            .field("sq", &self.sq)
            .field("end", &self.end)
            .finish()
    }
}

/// A receive's completion, reported to its connection.
pub(super) fn deliver(
    conn: &mut Pooled,
    wc: &WorkCompletion,
    data: &[u8],
    on: &mut impl FnMut(Event<'_>),
) {
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

/// A pooled connection, borrowed from its poller to post on.
#[derive(Debug)]
pub(crate) struct PooledConn<'p> {
    pub(super) id: ConnId,
    pub(super) conn: &'p mut Pooled,
    pub(super) to_end: &'p mut Vec<ConnId>,
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
        self.check_open()?;
        let remote = self.conn.peer.sub(remote_offset, len as u64)?;
        let posted = self.conn.sq.post_read(self.conn.ep.qp(), remote, len);
        let ticket = self.judge_post(posted)?;
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
        self.check_open()?;
        let posted = self.conn.sq.post_bytes(self.conn.ep.qp(), op, data, false);
        self.judge_post(posted)
    }

    /// Counts a post's doorbell; a post that failed without naming the
    /// refused request left the queue pair in ERR: the connection ends.
    fn judge_post<T>(&mut self, posted: Result<T>) -> Result<T> {
        match posted {
            Ok(done) => {
                self.conn.stats.doorbells += 1;
                Ok(done)
            }
            Err(e) => {
                if self.conn.sq.broken().is_some() {
                    self.conn
                        .mark_end(self.id, EndCause::PostIndeterminate, self.to_end);
                }
                Err(e)
            }
        }
    }

    /// Refuses a post on a connection that failed, or is closing or
    /// ending.
    fn check_open(&self) -> Result<()> {
        if let Some(f) = self.conn.failure {
            return Err(f.into());
        }
        if self.conn.is_closing || self.conn.end.is_some() {
            return Err(Misuse::ConnectionClosing.into());
        }
        Ok(())
    }
}
