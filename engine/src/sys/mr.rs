//! Registered memory regions.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::sync::Arc;

use super::ffi;
use super::mem::{memlock_limit, Buffer};
use super::pd::ProtectionDomain;
use crate::config::PageSize;
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

    /// The `ibv_access_flags` bits, as `ibv_reg_mr` and `ibv_modify_qp`
    /// take them.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set here (always, for
    /// [`LOCAL_READ`](Access::LOCAL_READ), which sets none).
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
/// The crate-internal owner: it hands out addresses, keys and bounded raw
/// copies, never a reference to its bytes, because the NIC (a posted
/// receive or READ) or a peer (REMOTE_WRITE) may be writing them. The
/// public views with their ownership rules are in [`super::region`].
///
/// Dropping it deregisters first, so the NIC can no longer reach the
/// pages, and unmaps after — unless deregistering failed, or a queue pair
/// of its PD could not be destroyed: then the pages may still be the
/// NIC's, and they are leaked, never unmapped. A registration that a
/// queued request still names is never dropped at all: it is parked with
/// that request's queue pair ([`super::parked`]).
pub(crate) struct Registration {
    ptr: *mut ffi::ibv_mr,
    /// Unmapped only after a successful deregistration (see `Drop`).
    buf: ManuallyDrop<Buffer>,
    access: Access,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the MR handle and the buffer it owns may move between threads
// together; nothing in them is tied to the creating thread.
unsafe impl Send for Registration {}
// SAFETY: &Registration reads only the MR's immutable keys and copies
// bytes out through raw pointers (no reference to the region is formed);
// writing bytes in takes &mut.
unsafe impl Sync for Registration {}

impl Registration {
    /// Maps `len` bytes of `page`-backed memory and registers it with
    /// `access` (at least one byte: verbs refuse empty regions).
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        page: PageSize,
        access: Access,
    ) -> Result<Registration> {
        let buf = Buffer::new(len, page)?;
        let reg_len = buf.len().max(1);
        // SAFETY: buf is a live mapping of at least `reg_len` bytes (a
        // whole page) that this registration owns, so it outlives the MR.
        let ptr = unsafe {
            ffi::ibv_reg_mr(
                pd.as_ptr(),
                buf.as_ptr().cast(),
                reg_len,
                access.bits() as i32,
            )
        };
        if ptr.is_null() {
            let source = last_os_error();
            let hint = reg_mr_hint(&source, reg_len);
            return Err(Error::RegMr {
                len: reg_len,
                access: access.to_string(),
                hint,
                source,
            });
        }
        Ok(Registration {
            ptr,
            buf: ManuallyDrop::new(buf),
            access,
            _pd: Arc::clone(pd),
        })
    }

    #[inline]
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: ptr is a live MR; its keys never change.
        unsafe { (*self.ptr).lkey }
    }

    #[inline]
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as in lkey.
        unsafe { (*self.ptr).rkey }
    }

    #[inline]
    pub(crate) fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn access(&self) -> Access {
        self.access
    }

    /// Where byte `offset` lives (inside or one past the region).
    #[inline]
    pub(super) fn at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len());
        self.buf.as_ptr().wrapping_add(offset)
    }

    /// The bytes `range`, checked, as a scatter/gather entry.
    #[inline]
    pub(crate) fn local(&self, range: Range<usize>) -> Result<LocalSlice> {
        check_range(&range, self.len())?;
        // Neither wraps: the range is ordered and inside the mapping.
        Ok(LocalSlice {
            addr: self.addr().wrapping_add(range.start as u64),
            len: range.end.wrapping_sub(range.start) as u32,
            lkey: self.lkey(),
        })
    }

    /// What a peer needs to RDMA into `range` of this region.
    pub(crate) fn remote(&self, range: Range<usize>) -> Result<RemoteSlice> {
        check_range(&range, self.len())?;
        // As in `local`.
        Ok(RemoteSlice {
            addr: self.addr().wrapping_add(range.start as u64),
            len: range.end.wrapping_sub(range.start) as u64,
            rkey: self.rkey(),
        })
    }

    /// Copies `dst.len()` bytes from `offset` into `dst` through raw
    /// pointers: no reference to the region is ever formed, so a NIC or a
    /// peer writing it meanwhile is not undefined behaviour — each byte
    /// copied is then the old value or the new one, and `dst` is a private
    /// snapshot that nothing else can change.
    #[inline]
    pub(crate) fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_span(offset, dst.len(), self.len())?;
        // SAFETY: the source span lies inside the live mapping (checked);
        // dst is a distinct, exclusively borrowed Rust buffer, so the two
        // cannot overlap; raw copies tolerate concurrent device writes.
        unsafe { std::ptr::copy_nonoverlapping(self.at(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` to `offset` through raw pointers (see [`copy_out`]).
    ///
    /// [`copy_out`]: Registration::copy_out
    #[inline]
    pub(crate) fn copy_in(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        check_span(offset, src.len(), self.len())?;
        // SAFETY: the target span lies inside the live mapping (checked)
        // and src is a Rust slice outside it; &mut self excludes any other
        // CPU access through this owner.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.at(offset), src.len()) };
        Ok(())
    }

    /// Reads byte `offset` afresh from memory on every call (a volatile
    /// load), for spinning on a flag a peer's RDMA WRITE will set — the way
    /// perftest's write latency test waits on the last byte.
    #[inline]
    pub(crate) fn load_byte(&self, offset: usize) -> u8 {
        assert!(
            offset < self.len(),
            "offset {offset} outside the region of {} bytes",
            self.len()
        );
        // SAFETY: offset is inside the live mapping; a volatile byte load of
        // memory a device may write concurrently reads either the old or
        // the new value, and forces a real load on every call.
        unsafe { std::ptr::read_volatile(self.at(offset)) }
    }
}

#[inline]
fn check_span(offset: usize, len: usize, region_len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(remote_out_of_region(
            offset as u64,
            len as u64,
            region_len as u64,
        )),
    }
}

#[inline]
fn check_range(range: &Range<usize>, len: usize) -> Result<()> {
    // The subtraction only once the range is known to be ordered.
    if range.start > range.end
        || range.end > len
        || range.end.wrapping_sub(range.start) > u32::MAX as usize
    {
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

impl Drop for Registration {
    fn drop(&mut self) {
        if self._pd.is_poisoned() {
            tracing::warn!(
                addr = self.addr(),
                len = self.len(),
                "a queue pair of this memory's PD could not be destroyed: leaking the memory"
            );
            return;
        }
        // SAFETY: ptr is our MR, deregistered exactly once; after
        // ibv_dereg_mr succeeds the device no longer reaches the pages
        // through it (ibv_reg_mr(3)).
        let rc = unsafe { ffi::ibv_dereg_mr(self.ptr) };
        if rc != 0 {
            tracing::warn!(
                error = %crate::error::errno(rc),
                len = self.len(),
                "ibv_dereg_mr failed: leaking the memory, which the device may still reach"
            );
            return;
        }
        // SAFETY: the MR over the buffer is gone (above), so nothing but
        // this owner refers to the mapping; dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.buf) };
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
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

/// A checked local buffer: address, length and lkey of one scatter/gather
/// entry. Naming memory is all it does; only `unsafe` raw posting takes it,
/// whose contract says who may touch the bytes and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSlice {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
}

impl LocalSlice {
    /// Bytes the entry names.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the entry names no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A peer's memory the local side may RDMA into or from: address, rkey and
/// length, as the peer advertised it. Nothing local can check it; the peer's
/// NIC does, and answers REM_ACCESS_ERR when it is wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteSlice {
    /// The address of its first byte in the peer's address space, which
    /// RDMA requests name.
    pub addr: u64,
    /// Bytes from `addr` on that the peer advertised.
    pub len: u64,
    /// The remote key of the peer's memory region, which the peer's NIC
    /// checks every access against.
    pub rkey: u32,
}

impl RemoteSlice {
    /// The sub-range `[offset, offset + len)`, with the offset checked
    /// against what the peer advertised.
    #[inline]
    pub fn sub(&self, offset: u64, len: u64) -> Result<RemoteSlice> {
        // The peer's address may be anything: its sum is checked too.
        match (offset.checked_add(len), self.addr.checked_add(offset)) {
            (Some(end), Some(addr)) if end <= self.len => Ok(RemoteSlice {
                addr,
                len,
                rkey: self.rkey,
            }),
            _ => Err(remote_out_of_region(offset, len, self.len)),
        }
    }
}
