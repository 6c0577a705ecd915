//! Completion queues and the work completions polled from them.

use std::mem::MaybeUninit;
use std::sync::Arc;

use super::device::Context;
use super::ffi;
use crate::completion::{WcError, WcOpcode, WcStatus};
use crate::error::{last_os_error, Error, Result};

/// An `ibv_cq` polled by busy-waiting (no completion channel).
#[derive(Debug)]
pub struct CompletionQueue {
    ptr: *mut ffi::ibv_cq,
    depth: u32,
    _ctx: Arc<Context>,
}

// SAFETY: a CQ may be polled from any thread; the provider locks it.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above: ibv_poll_cq is thread-safe per ibv_poll_cq(3).
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    pub fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<Self>> {
        // SAFETY: ctx is live; no channel and no context pointer are passed.
        let ptr = unsafe {
            ffi::ibv_create_cq(
                ctx.as_ptr(),
                depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if ptr.is_null() {
            return Err(Error::CreateCq {
                depth,
                source: last_os_error(),
            });
        }
        // SAFETY: ptr is a CQ we just created; cqe is the real depth.
        let depth = unsafe { (*ptr).cqe }.max(0) as u32;
        Ok(Arc::new(CompletionQueue {
            ptr,
            depth,
            _ctx: Arc::clone(ctx),
        }))
    }

    /// The depth the device actually gave (at least the one asked for).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.ptr
    }

    /// Polls up to `out.len()` completions into `out`, returning the filled
    /// prefix. Never blocks, never allocates.
    #[inline]
    pub fn poll<'a>(&self, out: &'a mut [WorkCompletion]) -> Result<&'a [WorkCompletion]> {
        let max = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, so `out`
        // is `max` writable ibv_wc slots; the CQ is live.
        let n = unsafe { ffi::ibv_poll_cq(self.ptr, max, out.as_mut_ptr().cast::<ffi::ibv_wc>()) };
        if n < 0 {
            return Err(Error::PollCq(crate::error::errno(n)));
        }
        Ok(&out[..n as usize])
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc of it, so none is
        // alive; destroyed exactly once.
        let rc = unsafe { ffi::ibv_destroy_cq(self.ptr) };
        if rc != 0 {
            tracing::warn!(error = %crate::error::errno(rc), "ibv_destroy_cq failed");
        }
    }
}

/// One `ibv_wc`, read through safe accessors.
#[repr(transparent)]
pub struct WorkCompletion(ffi::ibv_wc);

impl WorkCompletion {
    /// An empty slot to poll into.
    pub fn zeroed() -> Self {
        // SAFETY: ibv_wc is plain data (integers and a union of integers);
        // all-zero is a valid value.
        WorkCompletion(unsafe { MaybeUninit::<ffi::ibv_wc>::zeroed().assume_init() })
    }

    /// A fixed array of empty slots, for polling in batches without allocating.
    pub fn array<const N: usize>() -> [WorkCompletion; N] {
        std::array::from_fn(|_| WorkCompletion::zeroed())
    }

    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus(self.0.status)
    }

    #[inline]
    pub fn is_success(&self) -> bool {
        self.0.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// Valid only for successful completions (verbs leave it undefined
    /// otherwise).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode(self.0.opcode)
    }

    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate value in host order, if the completion carries one.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        if self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data.
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }

    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// `Ok(())` for success, otherwise the typed error; `posted` is the
    /// opcode the caller posted this wr_id with, if it knows it.
    #[inline]
    pub fn result(&self, posted: Option<WcOpcode>) -> Result<(), WcError> {
        if self.is_success() {
            Ok(())
        } else {
            Err(WcError {
                wr_id: self.wr_id(),
                opcode: posted,
                status: self.status(),
                vendor_err: self.vendor_err(),
            })
        }
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("imm", &self.imm())
            .finish()
    }
}
