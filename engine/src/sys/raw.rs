//! Raw posting for experts: requests that name memory by [`LocalSlice`],
//! with nothing checking who owns it — hence `unsafe`.

use super::mr::{LocalSlice, RemoteSlice};
use super::qp::QueuePair;
use super::region::RegionOp;
use super::wr::{self, Payload, PostFailed, SendOpcode, SendRequest};
use super::wr_id;
use crate::error::{Error, Misuse, Result};

/// Raw posting for experts, on a queue pair whose completions the caller
/// polls itself (`Endpoint::wait_send`, `Endpoint::wait_recv`): requests
/// name memory by [`LocalSlice`], and nothing checks who owns it.
///
/// A raw request's id carries a tag that no connection ring counts with,
/// so its completion is never taken for a ring's: if a
/// [`crate::Connection`] is built on this endpoint while the request is
/// outstanding (by `ConnectionBuilder::accept` on a request whose endpoint
/// was posted to), the connection's polls report its completion as
/// [`Error::ForeignCompletion`] — and the caller never sees it.
#[derive(Debug)]
pub struct RawQueuePair<'q> {
    qp: &'q mut QueuePair,
}

impl<'q> RawQueuePair<'q> {
    pub(crate) fn new(qp: &'q mut QueuePair) -> RawQueuePair<'q> {
        RawQueuePair { qp }
    }

    /// Posts one send-queue request: SEND, RDMA WRITE (with an immediate,
    /// WRITE_WITH_IMM) or RDMA READ, signaled or not. `wr_id` is what its
    /// completion reports; it must be below 2^62 (the top two bits are
    /// pinpoll's tags), or the post is refused.
    ///
    /// # Safety
    /// `local` names registered memory that stays registered, and that this
    /// process neither writes (SEND, WRITE) nor reads or writes (READ),
    /// until the request's completion has been polled — or, unsignaled,
    /// until that of a later signaled request of this queue pair — or else
    /// until the queue pair is destroyed. That is also the rule when this
    /// fails with [`Error::PostIndeterminate`] (the request may be queued),
    /// and when a connection built on this endpoint takes the completion
    /// (the queue pair goes when the connection does).
    pub unsafe fn post_send(
        &mut self,
        wr_id: u64,
        op: RegionOp,
        local: LocalSlice,
        signaled: bool,
    ) -> Result<()> {
        let (opcode, remote) = match op {
            RegionOp::Send => (SendOpcode::Send, RemoteSlice::default()),
            RegionOp::Write { remote, imm } => (
                imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm),
                remote,
            ),
            RegionOp::Read { remote } => (SendOpcode::Read, remote),
        };
        let req = SendRequest {
            wr_id: tagged(wr_id)?,
            opcode,
            payload: Payload::Registered(local),
            remote,
            signaled,
        };
        // SAFETY: the caller's contract above.
        unsafe { wr::post_one(self.qp, &req) }.map_err(|failed| posting_error(self.qp, failed))
    }

    /// Posts one receive into `local` (or, with `None`, without a buffer);
    /// `wr_id` as for [`post_send`](RawQueuePair::post_send).
    ///
    /// # Safety
    /// `local` names registered memory that stays registered and that this
    /// process does not touch until the receive's completion has been
    /// polled, or else until the queue pair is destroyed — as for
    /// [`post_send`](RawQueuePair::post_send), also when this fails with
    /// [`Error::PostIndeterminate`].
    pub unsafe fn post_recv(&mut self, wr_id: u64, local: Option<LocalSlice>) -> Result<()> {
        let wr_id = tagged(wr_id)?;
        // SAFETY: the caller's contract above.
        unsafe { wr::post_one_recv(self.qp, wr_id, local) }
            .map_err(|failed| posting_error(self.qp, failed))
    }
}

/// The error of a failed post; one that may have queued the request
/// moves the queue pair to ERR, so that it completes (flushed).
fn posting_error(qp: &mut QueuePair, failed: PostFailed) -> Error {
    match failed {
        PostFailed::Refused { error, .. } => error,
        PostFailed::Unknown(unknown) => {
            qp.fail();
            unknown.error()
        }
    }
}

/// `id` with the raw tag, or the error for an id that uses the tags' bits.
fn tagged(id: u64) -> Result<u64> {
    wr_id::raw(id).ok_or_else(|| Misuse::ReservedId { id }.into())
}
