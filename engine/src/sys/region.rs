//! Registered memory as users hold it, with who may touch it when made a
//! matter of types:
//!
//! - [`MemoryRegion`]: memory that only this process's own work requests
//!   reach. While no request is posted on it, it is the CPU's: borrow it
//!   as `&[u8]`/`&mut [u8]` freely. Posting a request on it *moves* it into
//!   a [`Posted`], so nothing can look at it while the NIC owns it; the
//!   request's completion gives it back (in the manner of tokio-uring's
//!   buffer passing; see [`super::posted`]). A `Posted` that is dropped
//!   instead parks its region with the queue pair, which frees it only
//!   once the request's completion was seen or the queue pair is gone.
//! - [`SharedRegion`]: memory a peer may RDMA WRITE at any time. No safe
//!   reference to it exists: bytes are copied out (and in) through raw
//!   pointers, and a borrowing view is an `unsafe fn` whose contract is
//!   what the application protocol must guarantee.

use std::ops::Range;

use super::mr::{Access, LocalSlice, Registration, RemoteSlice};
use crate::error::{Error, Misuse, Result};

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
        Misuse::PeerWritableRegion.into()
    }

    /// Bytes of the region, as many as were asked for at registration
    /// (the mapping behind them is whole pages).
    pub fn len(&self) -> usize {
        self.reg.len()
    }

    /// Whether the region is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.reg.len() == 0
    }

    /// The access flags it was registered with (never REMOTE_WRITE).
    pub fn access(&self) -> Access {
        self.reg.access()
    }

    /// Its bytes. While this borrow lives no request of this process can
    /// write them (posting one moves the region away), and a peer may at
    /// most RDMA READ them.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live and zero-initialised by the kernel.
        // Only this process's own work requests reach a MemoryRegion (no
        // REMOTE_WRITE: checked in `new`), and posting one moves the region
        // into a `Posted`, so while this borrow lives nothing posted can
        // write it; a peer may only READ it (REMOTE_READ), which writes
        // nothing here.
        unsafe { std::slice::from_raw_parts(self.reg.at(0), self.reg.len()) }
    }

    /// Its bytes, writable: e.g. to fill it before posting it.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.reg.at(0), self.reg.len()) }
    }

    /// What a peer needs to RDMA READ `range` (the region must have been
    /// registered with REMOTE_READ).
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        self.reg.remote(range)
    }

    /// `range` as a scatter/gather entry, for [`super::raw::RawQueuePair`]'s
    /// `unsafe` posting.
    pub fn local_slice(&self, range: Range<usize>) -> Result<LocalSlice> {
        self.reg.local(range)
    }

    pub(crate) fn into_registration(self) -> Registration {
        self.reg
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

    /// Bytes of the region, as many as were asked for at registration
    /// (the mapping behind them is whole pages).
    pub fn len(&self) -> usize {
        self.reg.len()
    }

    /// Whether the region is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.reg.len() == 0
    }

    /// The access flags it was registered with: LOCAL_WRITE and
    /// REMOTE_WRITE, and REMOTE_READ when it was asked for.
    pub fn access(&self) -> Access {
        self.reg.access()
    }

    /// What the peer needs to RDMA into `range`.
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        self.reg.remote(range)
    }

    /// `range` as a scatter/gather entry, for [`super::raw::RawQueuePair`]'s
    /// `unsafe` posting.
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

/// A region a post could not take, given back with the reason, so that a
/// refused post never costs the caller its memory. (`R` is
/// `Option<MemoryRegion>` for a receive, which may have no buffer.)
#[derive(Debug, thiserror::Error)]
#[error("the region was not posted")]
pub struct RegionRefused<R: std::fmt::Debug = MemoryRegion> {
    /// Why the post was refused.
    #[source]
    pub error: Error,
    /// The region, never posted: the caller's again, untouched.
    pub region: R,
}

/// The error alone: the region, never posted, is freed.
impl<R: std::fmt::Debug> From<RegionRefused<R>> for Error {
    fn from(refused: RegionRefused<R>) -> Error {
        refused.error
    }
}

/// A send-queue operation on a whole [`MemoryRegion`] (its first `len`
/// bytes).
#[derive(Debug, Clone, Copy)]
pub enum RegionOp {
    /// SEND the bytes; they land in a receive the peer posted.
    Send,
    /// RDMA WRITE, with an immediate (WRITE_WITH_IMM) if given.
    Write {
        /// Where in the peer's memory to write. A region's post is refused
        /// when its bytes do not fit; a raw post checks nothing.
        remote: RemoteSlice,
        /// The immediate, in host order; it consumes a receive at the peer,
        /// whose completion carries it.
        imm: Option<u32>,
    },
    /// RDMA READ into the region (registered with LOCAL_WRITE).
    Read {
        /// Where in the peer's memory to read from (registered there with
        /// REMOTE_READ). A region's post is refused when it holds fewer
        /// bytes than asked for; a raw post checks nothing.
        remote: RemoteSlice,
    },
}
