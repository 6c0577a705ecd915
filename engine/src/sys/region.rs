//! Registered memory as users hold it, with who may touch it when made a
//! matter of types:
//!
//! - [`MemoryRegion`]: memory that only this process's own work requests
//!   reach. While no request is posted on it, it is the CPU's: borrow it
//!   as `&[u8]`/`&mut [u8]` freely. Posting a request on it *moves* it into
//!   a [`Posted`], so nothing can look at it while the NIC owns it; the
//!   request's completion gives it back (in the manner of tokio-uring's
//!   buffer passing). A `Posted` that is dropped instead deregisters the
//!   region — after which the NIC cannot reach the pages — and frees it.
//! - [`SharedRegion`]: memory a peer may RDMA WRITE at any time. No safe
//!   reference to it exists: bytes are copied out (and in) through raw
//!   pointers, and a borrowing view is an `unsafe fn` whose contract is
//!   what the application protocol must guarantee.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::cq::WorkCompletion;
use super::mr::{Access, LocalSlice, Registration, RemoteSlice};
use super::qp::QueuePair;
use super::wr::{self, Payload, SendOpcode, SendRequest};
use crate::error::{Error, Result};

/// Registered memory reached only by this process's own work requests.
#[derive(Debug)]
pub struct MemoryRegion {
    reg: Registration,
}

impl MemoryRegion {
    pub(crate) fn new(reg: Registration) -> Result<MemoryRegion> {
        if reg.access().contains(Access::REMOTE_WRITE) {
            return Err(Self::shared_access_error());
        }
        Ok(MemoryRegion { reg })
    }

    pub(crate) fn shared_access_error() -> Error {
        Error::Config(
            "memory a peer may write is a SharedRegion (Endpoint::register_shared), not a MemoryRegion"
                .into(),
        )
    }

    pub fn len(&self) -> usize {
        self.reg.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reg.len() == 0
    }

    pub fn access(&self) -> Access {
        self.reg.access()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live and zero-initialised by the kernel.
        // Only this process's own work requests reach a MemoryRegion (no
        // REMOTE_WRITE: checked in `new`), and posting one moves the region
        // into a `Posted`, so while this borrow lives nothing posted can
        // write it; a peer may only READ it (REMOTE_READ), which writes
        // nothing here.
        unsafe { std::slice::from_raw_parts(self.reg.at(0), self.reg.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.reg.at(0), self.reg.len()) }
    }

    /// What a peer needs to RDMA READ `range` (the region must have been
    /// registered with REMOTE_READ).
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        self.reg.remote(range)
    }

    /// `range` as a scatter/gather entry, for [`RawQueuePair`]'s `unsafe`
    /// posting.
    pub fn local_slice(&self, range: Range<usize>) -> Result<LocalSlice> {
        self.reg.local(range)
    }
}

/// Registered memory that a peer may RDMA WRITE at any moment.
#[derive(Debug)]
pub struct SharedRegion {
    reg: Registration,
}

impl SharedRegion {
    pub(crate) fn new(reg: Registration) -> SharedRegion {
        SharedRegion { reg }
    }

    pub fn len(&self) -> usize {
        self.reg.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reg.len() == 0
    }

    pub fn access(&self) -> Access {
        self.reg.access()
    }

    /// What the peer needs to RDMA into `range`.
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        self.reg.remote(range)
    }

    /// `range` as a scatter/gather entry, for [`RawQueuePair`]'s `unsafe`
    /// posting.
    pub fn local_slice(&self, range: Range<usize>) -> Result<LocalSlice> {
        self.reg.local(range)
    }

    /// Copies the bytes at `offset` into `dst`: a private snapshot. If the
    /// peer writes them meanwhile, each byte is the old or the new value;
    /// what is checked in `dst` is then exactly what is used.
    #[inline]
    pub fn copy_to(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.reg.copy_out(offset, dst)
    }

    /// Copies `src` to `offset` (e.g. data the peer will RDMA READ).
    #[inline]
    pub fn copy_from(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.reg.copy_in(offset, src)
    }

    /// Byte `offset`, loaded from memory on every call: spin on it to see
    /// a peer's RDMA WRITE land (on RC the last byte of a WRITE lands last).
    #[inline]
    pub fn load_byte(&self, offset: usize) -> u8 {
        self.reg.load_byte(offset)
    }

    /// Borrows `range` without copying.
    ///
    /// # Safety
    /// For as long as the slice lives, the peer must not write `range` —
    /// which only the application protocol can promise: e.g. the peer
    /// wrote it, then said so in a message, and writes there again only
    /// after this side answers.
    pub unsafe fn slice(&self, range: Range<usize>) -> Result<&[u8]> {
        self.reg.local(range.clone())?;
        // SAFETY: the range lies inside the live mapping (checked just
        // above); that nothing writes it while borrowed is the caller's
        // contract.
        Ok(unsafe { std::slice::from_raw_parts(self.reg.at(range.start), range.len()) })
    }
}

/// Identifiers of low-level posts carry the top bit, so they are never
/// mistaken for the sequence numbers a connection's rings count with.
const OWNED_ID: u64 = 1 << 63;
/// A region a post could not take, given back with the reason, so that a
/// refused post never costs the caller its memory.
#[derive(Debug, thiserror::Error)]
#[error("the region was not posted")]
pub struct RegionRefused {
    #[source]
    pub error: Error,
    pub region: MemoryRegion,
}

static NEXT_OWNED_ID: AtomicU64 = AtomicU64::new(0);

/// A send-queue operation on a whole [`MemoryRegion`] (its first `len`
/// bytes).
#[derive(Debug, Clone, Copy)]
pub enum RegionOp {
    Send,
    /// RDMA WRITE, with an immediate (WRITE_WITH_IMM) if given.
    Write {
        remote: RemoteSlice,
        imm: Option<u32>,
    },
    /// RDMA READ into the region (registered with LOCAL_WRITE).
    Read {
        remote: RemoteSlice,
    },
}

/// A posted work request holding the region the NIC owns until it
/// completes. Give it to `Endpoint::complete` to get the region back.
#[must_use = "dropping a Posted deregisters and frees its region"]
#[derive(Debug)]
pub struct Posted {
    region: Option<MemoryRegion>,
    wr_id: u64,
    qp_num: u32,
    receive: bool,
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

    /// The region back, if `wc` is this request's completion; `self`
    /// otherwise. Any completion, success or error, ends the NIC's use.
    pub(crate) fn finish(
        self,
        wc: &WorkCompletion,
    ) -> std::result::Result<Option<MemoryRegion>, Posted> {
        if wc.wr_id() == self.wr_id && wc.qp_num() == self.qp_num {
            Ok(self.region)
        } else {
            Err(self)
        }
    }
}

fn owned_id() -> u64 {
    OWNED_ID | NEXT_OWNED_ID.fetch_add(1, Ordering::Relaxed)
}

/// Posts `op` on the first `len` bytes of `region`, signaled; the region
/// is the NIC's until the returned [`Posted`] completes.
pub(crate) fn post_region(
    qp: &mut QueuePair,
    op: RegionOp,
    region: MemoryRegion,
    len: usize,
) -> Result<Posted> {
    let local = region.reg.local(0..len)?;
    let (opcode, remote) = match op {
        RegionOp::Send => (SendOpcode::Send, RemoteSlice::default()),
        RegionOp::Write { remote, imm } => (
            imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm),
            remote.sub(0, len as u64)?,
        ),
        RegionOp::Read { remote } => (SendOpcode::Read, remote.sub(0, len as u64)?),
    };
    if opcode == SendOpcode::Read && !region.access().contains(Access::LOCAL_WRITE) {
        return Err(Error::Config(
            "an RDMA READ lands in the region: register it with LOCAL_WRITE".into(),
        ));
    }
    let wr_id = owned_id();
    let req = SendRequest {
        wr_id,
        opcode,
        payload: Payload::Registered(local),
        remote,
        signaled: true,
    };
    // SAFETY: `region` moves into the returned Posted, so nothing in this
    // process can touch it until the completion hands it back; if the
    // Posted is dropped first, deregistration cuts the NIC off the pages
    // before they are unmapped.
    unsafe { wr::post_one(qp, &req) }?;
    Ok(Posted {
        region: Some(region),
        wr_id,
        qp_num: qp.qp_num(),
        receive: false,
    })
}

/// Posts a receive into `region` (all of it), or with `None` a receive
/// without a buffer (for WRITE_WITH_IMM notifications).
pub(crate) fn post_region_recv(qp: &mut QueuePair, region: Option<MemoryRegion>) -> Result<Posted> {
    let buffer = match &region {
        Some(r) if !r.access().contains(Access::LOCAL_WRITE) => {
            return Err(Error::Config(
                "a receive buffer is written by the NIC: register it with LOCAL_WRITE".into(),
            ))
        }
        Some(r) => Some(r.reg.local(0..r.len())?),
        None => None,
    };
    let wr_id = owned_id();
    // SAFETY: as in post_region: the region moves into the Posted.
    unsafe { wr::post_one_recv(qp, wr_id, buffer) }?;
    Ok(Posted {
        region,
        wr_id,
        qp_num: qp.qp_num(),
        receive: true,
    })
}

/// Raw posting for experts, on a queue pair whose completions the caller
/// polls itself: requests name memory by [`LocalSlice`], and nothing
/// checks who owns it.
#[derive(Debug)]
pub struct RawQueuePair<'q> {
    qp: &'q mut QueuePair,
}

impl<'q> RawQueuePair<'q> {
    pub(crate) fn new(qp: &'q mut QueuePair) -> RawQueuePair<'q> {
        RawQueuePair { qp }
    }

    /// Posts one send-queue request: SEND, RDMA WRITE (with an immediate,
    /// WRITE_WITH_IMM) or RDMA READ, signaled or not.
    ///
    /// # Safety
    /// `local` names registered memory that stays registered, and that this
    /// process neither writes (SEND, WRITE) nor reads or writes (READ)
    /// until the request completes — or, unsignaled, until a later
    /// signaled request of this queue pair completes. `wr_id` must not
    /// have the top bit set (those identify the safe API's posts).
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
            wr_id: wr_id & !OWNED_ID,
            opcode,
            payload: Payload::Registered(local),
            remote,
            signaled,
        };
        // SAFETY: the caller's contract above.
        unsafe { wr::post_one(self.qp, &req) }
    }

    /// Posts one receive into `local` (or, with `None`, without a buffer).
    ///
    /// # Safety
    /// `local` names registered memory that stays registered and that this
    /// process does not touch until the receive completes.
    pub unsafe fn post_recv(&mut self, wr_id: u64, local: Option<LocalSlice>) -> Result<()> {
        // SAFETY: the caller's contract above.
        unsafe { wr::post_one_recv(self.qp, wr_id & !OWNED_ID, local) }
    }
}
