//! Registered memory regions.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::ffi;
use super::mem::{memlock_limit, Buffer};
use super::pd::ProtectionDomain;
use crate::error::{last_os_error, Error, Result};

/// Access rights of a memory region (`enum ibv_access_flags`). Register with
/// the fewest that the use needs: a region the peer only writes into gets
/// `LOCAL_WRITE | REMOTE_WRITE`, never `REMOTE_READ`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// Local reads only (a send source or RDMA WRITE source).
    pub const LOCAL_READ: Access = Access(0);
    /// The NIC may write it locally: receive buffers, RDMA READ targets.
    pub const LOCAL_WRITE: Access = Access(ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// The peer may RDMA WRITE into it (needs LOCAL_WRITE too).
    pub const REMOTE_WRITE: Access = Access(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// The peer may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);

    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
        ]
        .into_iter()
        .filter(|(a, _)| self.contains(*a))
        .map(|(_, n)| n)
        .collect();
        if names.is_empty() {
            f.write_str("LOCAL_READ")
        } else {
            f.write_str(&names.join("|"))
        }
    }
}

/// An `ibv_mr` over a [`Buffer`] it owns; holds its PD alive.
///
/// Dropping it deregisters first, so the NIC can no longer reach the pages,
/// and unmaps after. The NIC writes into receive buffers, RDMA READ targets
/// and remotely writable regions on its own schedule: read such bytes only
/// after the completion (or the protocol message) that says they are there.
pub struct MemoryRegion {
    ptr: *mut ffi::ibv_mr,
    buf: Buffer,
    access: Access,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the MR handle and the buffer it owns may move between threads.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access only reads keys and hands out &[u8].
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        buf: Buffer,
        access: Access,
    ) -> Result<MemoryRegion> {
        let len = buf.len().max(1);
        // SAFETY: buf is a live mapping of at least `len` bytes that this MR
        // owns, so it outlives the registration.
        let ptr =
            unsafe { ffi::ibv_reg_mr(pd.as_ptr(), buf.as_ptr().cast(), len, access.bits() as i32) };
        if ptr.is_null() {
            let source = last_os_error();
            let hint = reg_mr_hint(&source, len);
            return Err(Error::RegMr {
                len,
                access: access.to_string(),
                hint,
                source,
            });
        }
        Ok(MemoryRegion {
            ptr,
            buf,
            access,
            _pd: Arc::clone(pd),
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: ptr is a live MR.
        unsafe { (*self.ptr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: ptr is a live MR.
        unsafe { (*self.ptr).rkey }
    }

    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn access(&self) -> Access {
        self.access
    }

    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// Reads byte `offset` afresh from memory every call (a volatile load),
    /// for spinning on a flag the peer's RDMA WRITE will set — the way
    /// perftest's write latency test waits on the last byte.
    #[inline]
    pub fn load_byte(&self, offset: usize) -> u8 {
        assert!(
            offset < self.len(),
            "offset {offset} outside the region of {} bytes",
            self.len()
        );
        // SAFETY: offset is inside the live mapping; a volatile byte load
        // of memory the NIC may write concurrently reads either the old or
        // the new value, and forces a real load on every call.
        unsafe { std::ptr::read_volatile(self.buf.as_ptr().add(offset)) }
    }

    /// The bytes `range` of this region, checked, as a scatter/gather entry.
    #[inline]
    pub fn slice(&self, range: Range<usize>) -> Result<LocalSlice> {
        check_range(&range, self.len())?;
        Ok(LocalSlice {
            addr: self.addr() + range.start as u64,
            len: (range.end - range.start) as u32,
            lkey: self.lkey(),
        })
    }

    /// What a peer needs to RDMA into `range` of this region.
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        check_range(&range, self.len())?;
        Ok(RemoteSlice {
            addr: self.addr() + range.start as u64,
            len: (range.end - range.start) as u64,
            rkey: self.rkey(),
        })
    }
}

#[inline]
fn check_range(range: &Range<usize>, len: usize) -> Result<()> {
    if range.start > range.end || range.end > len || range.end - range.start > u32::MAX as usize {
        return Err(out_of_region(range, len));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn remote_out_of_region(offset: u64, len: u64, region_len: u64) -> Error {
    Error::OutOfRegion {
        range: format!("{offset}..{}", offset.saturating_add(len)),
        len: region_len as usize,
    }
}

#[cold]
#[inline(never)]
fn out_of_region(range: &Range<usize>, len: usize) -> Error {
    Error::OutOfRegion {
        range: format!("{range:?}"),
        len,
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: ptr is our MR, deregistered exactly once, before `buf`
        // (a later field) is unmapped.
        let rc = unsafe { ffi::ibv_dereg_mr(self.ptr) };
        if rc != 0 {
            tracing::warn!(error = %crate::error::errno(rc), "ibv_dereg_mr failed");
        }
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}

fn reg_mr_hint(err: &std::io::Error, len: usize) -> String {
    match (err.raw_os_error(), memlock_limit()) {
        (Some(libc::ENOMEM) | Some(libc::EPERM), Some(limit)) => format!(
            "locked-memory limit is {limit} bytes (`ulimit -l`), the region needs {len}; raise it with \
             `ulimit -l unlimited` or a memlock line in /etc/security/limits.conf"
        ),
        (Some(libc::EINVAL), _) => "the access flags are invalid for this device (REMOTE_WRITE needs LOCAL_WRITE)".into(),
        _ => "see ibv_reg_mr(3)".into(),
    }
}

/// A checked local buffer: address, length and lkey of one scatter/gather entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSlice {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
}

impl LocalSlice {
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A peer's memory the local side may RDMA into or from: address, rkey and
/// length, as the peer advertised it. Nothing local can check it; the peer's
/// NIC does, and answers REM_ACCESS_ERR when it is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSlice {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl RemoteSlice {
    /// The sub-range `[offset, offset + len)`, with the offset checked
    /// against what the peer advertised.
    #[inline]
    pub fn sub(&self, offset: u64, len: u64) -> Result<RemoteSlice> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteSlice {
                addr: self.addr + offset,
                len,
                rkey: self.rkey,
            }),
            _ => Err(remote_out_of_region(offset, len, self.len)),
        }
    }
}
