//! Whole regions handed to the NIC by a post and given back by the
//! request's own completion (the low-level, stop-and-wait style).
//!
//! Posting moves a [`MemoryRegion`] into a [`Posted`]. The region comes
//! out only when the completion that names the request has been polled —
//! success or error, the NIC is done with it then. A `Posted` that is
//! dropped before that parks its region with the queue pair
//! ([`super::parked`]), which frees it once that completion is polled or
//! the queue pair is destroyed. A refused post gives the region back at
//! once; a post the provider may have queued without saying so is taken
//! as queued.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::cq::WorkCompletion;
use super::mr::{Access, RemoteSlice};
use super::parked::{ParkingLot, Request};
use super::qp::QueuePair;
use super::region::{MemoryRegion, RegionOp, RegionRefused};
use super::wr::{self, Indeterminate, Payload, PostFailed, SendOpcode, SendRequest};
use super::wr_id;
use crate::error::{Error, Misuse};

static NEXT_OWNED_ID: AtomicU64 = AtomicU64::new(0);

/// A fresh id with the owned tag: unique in the process (2^63 of them).
fn owned_id() -> u64 {
    wr_id::OWNED | NEXT_OWNED_ID.fetch_add(1, Ordering::Relaxed)
}

/// A posted work request holding the region the NIC owns until it
/// completes. Give it to `Endpoint::complete` to get the region back.
#[must_use = "dropping a Posted parks its region with the queue pair until the request's completion is polled or the queue pair is destroyed"]
#[derive(Debug)]
pub struct Posted {
    region: Option<MemoryRegion>,
    wr_id: u64,
    qp_num: u32,
    receive: bool,
    lot: Arc<ParkingLot>,
}

impl Posted {
    /// The request's identifier, as its completion reports it.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// Whether it is a receive (its completion comes on the receive CQ).
    pub fn is_receive(&self) -> bool {
        self.receive
    }

    /// Whether it went to `qp`.
    pub(crate) fn is_on(&self, qp: &QueuePair) -> bool {
        Arc::ptr_eq(&self.lot, qp.lot())
    }

    /// Whether `wc` is this request's completion.
    pub(crate) fn is_completed_by(&self, wc: &WorkCompletion) -> bool {
        wc.wr_id() == self.wr_id && wc.qp_num() == self.qp_num
    }

    /// The region back, if `wc` is this request's completion (any
    /// completion, success or error, ends the NIC's use); `self` otherwise.
    pub(crate) fn finish(
        mut self,
        wc: &WorkCompletion,
    ) -> std::result::Result<Option<MemoryRegion>, Posted> {
        if self.is_completed_by(wc) {
            Ok(self.region.take())
        } else {
            Err(self)
        }
    }
}

impl Drop for Posted {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            let request = Request {
                wr_id: self.wr_id,
                receive: self.receive,
            };
            self.lot.park(Some(request), region.into_registration());
        }
    }
}

/// Why `Endpoint::complete` gave no [`crate::Completed`], with what it
/// holds back.
#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    /// The request has not completed: the wait timed out, or the next
    /// completion on its queue was another request's (`error` names it).
    /// The NIC may still use the region: `posted` is the request, to
    /// complete again, or to drop (which parks the region until the
    /// queue pair is done with it).
    #[error("{error}")]
    Pending {
        /// Why it is not done: a timeout, another request's completion
        /// ([`Error::UnexpectedCompletion`]), a request of another
        /// endpoint, or a failure while polling.
        error: Error,
        /// The request, still holding its region.
        posted: Posted,
    },
    /// The request completed with an error status: the NIC is done with
    /// the region, which is back (`None` for a receive without one).
    #[error("{error}")]
    Failed {
        /// The failure: [`Error::Completion`] with its status, or what
        /// ended the connection (a disconnect, a device event, a post that
        /// failed without naming its request) when that end flushed it.
        error: Error,
        /// The region, the CPU's again (`None` for a receive posted
        /// without one).
        region: Option<MemoryRegion>,
    },
}

impl CompleteError {
    /// Why the request gave no completion.
    pub fn error(&self) -> &Error {
        match self {
            CompleteError::Pending { error, .. } | CompleteError::Failed { error, .. } => error,
        }
    }
}

/// The error alone; a pending request's region is parked with its queue
/// pair (see [`Posted`]).
impl From<CompleteError> for Error {
    fn from(e: CompleteError) -> Error {
        match e {
            CompleteError::Pending { error, .. } | CompleteError::Failed { error, .. } => error,
        }
    }
}

/// A post that went in: the request, and how the provider failed if it
/// did not say whether it took the request — which is then taken as
/// queued, and the queue pair moved to ERR so that it completes (flushed)
/// and gives the region back that way.
pub(crate) type Queued = (Posted, Option<Indeterminate>);

/// Posts `op` on the first `len` bytes of `region`, signaled; the region
/// is the NIC's until the returned [`Posted`] completes. A refusal gives
/// the region back.
// The region comes back in the error unboxed: a full queue is ordinary
// back-pressure.
#[allow(clippy::result_large_err)]
pub(crate) fn post_region(
    qp: &mut QueuePair,
    op: RegionOp,
    region: MemoryRegion,
    len: usize,
) -> Result<Queued, RegionRefused> {
    let request = match send_request(op, &region, len) {
        Ok(request) => request,
        Err(error) => return Err(RegionRefused { error, region }),
    };
    // SAFETY: `region` moves into the Posted made below (or back to the
    // caller only when the provider says it refused the request), so
    // nothing in this process touches it until the request's completion is
    // polled; a Posted dropped first parks it with the queue pair, which
    // keeps it registered and mapped until that completion is polled or the
    // queue pair is destroyed.
    let posted = unsafe { wr::post_one(qp, &request) };
    queued(qp, posted, request.wr_id, false, region)
        .map_err(|(error, region)| RegionRefused { error, region })
}

/// The request that posts `op` on the first `len` bytes of `region`, or
/// why it cannot.
fn send_request(
    op: RegionOp,
    region: &MemoryRegion,
    len: usize,
) -> crate::Result<SendRequest<'static>> {
    let local = region.local_slice(0..len)?;
    // Lossless: usize is at most 64 bits wide on every target.
    let len = len as u64;
    let (opcode, remote) = match op {
        RegionOp::Send => (SendOpcode::Send, RemoteSlice::default()),
        RegionOp::Write { remote, imm } => (
            imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm),
            remote.sub(0, len)?,
        ),
        RegionOp::Read { remote } => (SendOpcode::Read, remote.sub(0, len)?),
    };
    if opcode == SendOpcode::Read && !region.access().contains(Access::LOCAL_WRITE) {
        return Err(Misuse::NeedsLocalWrite {
            written_by: "an RDMA READ",
        }
        .into());
    }
    Ok(SendRequest {
        wr_id: owned_id(),
        opcode,
        payload: Payload::Registered(local),
        remote,
        signaled: true,
    })
}

/// Posts a receive into `region` (all of it), or with `None` a receive
/// without a buffer (for WRITE_WITH_IMM notifications). A refusal gives
/// the region back.
#[allow(clippy::result_large_err)] // as for post_region
pub(crate) fn post_region_recv(
    qp: &mut QueuePair,
    region: Option<MemoryRegion>,
) -> Result<Queued, RegionRefused<Option<MemoryRegion>>> {
    let buffer = match &region {
        Some(r) if !r.access().contains(Access::LOCAL_WRITE) => Err(Misuse::NeedsLocalWrite {
            written_by: "a receive",
        }
        .into()),
        Some(r) => r.local_slice(0..r.len()).map(Some),
        None => Ok(None),
    };
    let buffer = match buffer {
        Ok(buffer) => buffer,
        Err(error) => return Err(RegionRefused { error, region }),
    };
    let wr_id = owned_id();
    // SAFETY: as in post_region: the region moves into the Posted (or
    // back only when the provider says it refused the receive).
    let posted = unsafe { wr::post_one_recv(qp, wr_id, buffer) };
    queued(qp, posted, wr_id, true, region)
        .map_err(|(error, region)| RegionRefused { error, region })
}

/// The outcome of posting request `wr_id` on `region`: the Posted, also
/// when the provider failed without saying whether it took the request
/// (then the QP goes to ERR, so that the request completes flushed); the
/// region back with the error only when the provider refused it.
fn queued<R: Into<Option<MemoryRegion>>>(
    qp: &mut QueuePair,
    posted: Result<(), PostFailed>,
    wr_id: u64,
    receive: bool,
    region: R,
) -> Result<Queued, (Error, R)> {
    let unknown = match posted {
        Ok(()) => None,
        Err(PostFailed::Refused { error, .. }) => return Err((error, region)),
        Err(PostFailed::Unknown(unknown)) => {
            qp.fail();
            Some(unknown)
        }
    };
    let posted = Posted {
        region: region.into(),
        wr_id,
        qp_num: qp.qp_num(),
        receive,
        lot: Arc::clone(qp.lot()),
    };
    Ok((posted, unknown))
}
