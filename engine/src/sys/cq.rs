//! Completion queues and the work completions polled from them.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::Arc;

use super::device::Context;
use super::ffi;
use crate::error::{last_os_error, Error, Result};
use crate::status::{WcError, WcOpcode, WcStatus};

/// An `ibv_cq` polled by busy-waiting (no completion channel): the owner,
/// which keeps it alive for the QPs that use it and destroys it last.
/// Polling is the unique [`CqPoller`]'s.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    ptr: *mut ffi::ibv_cq,
    _ctx: Arc<Context>,
}

// SAFETY: the handle may move between threads; destroying it (Drop) needs
// the last Arc, so no other thread still uses it.
unsafe impl Send for CompletionQueue {}
// SAFETY: &CompletionQueue only hands the handle to ibv_create_qp (which the kernel checks); polling, the one
// operation that touches the provider's CQ state, is not reachable from it.
unsafe impl Sync for CompletionQueue {}

/// The right to poll one CQ: one per CQ, `Send` but not `Sync`, so one
/// thread at a time polls — what lets a provider skip its CQ lock
/// (`MLX5_SINGLE_THREADED=1`).
#[derive(Debug)]
pub(crate) struct CqPoller {
    cq: Arc<CompletionQueue>,
    _not_sync: PhantomData<Cell<()>>,
}

impl CompletionQueue {
    /// Creates a CQ of at least `depth` entries; returns its owner (for the
    /// QPs) and its poller.
    pub(crate) fn new(ctx: &Arc<Context>, depth: u32) -> Result<(Arc<Self>, CqPoller)> {
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
        let cq = Arc::new(CompletionQueue {
            ptr,
            _ctx: Arc::clone(ctx),
        });
        let poller = CqPoller {
            cq: Arc::clone(&cq),
            _not_sync: PhantomData,
        };
        Ok((cq, poller))
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.ptr
    }
}

impl CqPoller {
    /// Polls up to `out.len()` completions into `out`, returning how many.
    /// Never blocks, never allocates.
    #[inline]
    pub(crate) fn poll(&mut self, out: &mut [WorkCompletion]) -> Result<usize> {
        let max = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, so `out`
        // is `max` writable ibv_wc; the CQ is live (we hold an Arc), and
        // &mut self on the only poller makes this the only poll of it.
        let n =
            unsafe { ffi::ibv_poll_cq(self.cq.ptr, max, out.as_mut_ptr().cast::<ffi::ibv_wc>()) };
        if n < 0 {
            return Err(poll_failed(n));
        }
        Ok(n as usize)
    }
}

#[cold]
#[inline(never)]
fn poll_failed(n: i32) -> Error {
    Error::PollCq(crate::error::errno(n))
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ and its poller hold an Arc of it,
        // so none is alive; destroyed exactly once.
        let rc = unsafe { ffi::ibv_destroy_cq(self.ptr) };
        if rc != 0 {
            tracing::warn!(error = %crate::error::errno(rc), "ibv_destroy_cq failed");
        }
    }
}

/// One `ibv_wc`, read through safe accessors. Only polling fills one.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct WorkCompletion(ffi::ibv_wc);

impl WorkCompletion {
    /// An empty slot to poll into.
    pub(crate) fn zeroed() -> Self {
        // SAFETY: ibv_wc is plain data (integers and a union of integers);
        // all-zero is a valid value.
        WorkCompletion(unsafe { MaybeUninit::<ffi::ibv_wc>::zeroed().assume_init() })
    }

    /// A fixed array of empty slots, for polling in batches without allocating.
    pub(crate) fn array<const N: usize>() -> [WorkCompletion; N] {
        std::array::from_fn(|_| WorkCompletion::zeroed())
    }

    #[inline]
    pub(crate) fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    #[inline]
    pub(crate) fn status(&self) -> WcStatus {
        WcStatus(self.0.status)
    }

    #[inline]
    pub(crate) fn is_success(&self) -> bool {
        self.0.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// Valid only for successful completions (verbs leave it undefined
    /// otherwise).
    #[inline]
    pub(crate) fn opcode(&self) -> WcOpcode {
        WcOpcode(self.0.opcode)
    }

    #[inline]
    pub(crate) fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate value in host order, if the completion carries one.
    #[inline]
    pub(crate) fn imm(&self) -> Option<u32> {
        if self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data.
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }

    #[inline]
    pub(crate) fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    #[inline]
    pub(crate) fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// `Ok(())` for success, otherwise the typed error; `posted` is the
    /// opcode the caller posted this wr_id with, if it knows it.
    #[inline]
    pub(crate) fn result(&self, posted: Option<WcOpcode>) -> Result<(), WcError> {
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
