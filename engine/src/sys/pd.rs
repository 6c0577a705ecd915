//! Protection domains.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::device::Context;
use super::ffi;
use crate::error::{last_os_error, Error, Result};

/// An `ibv_pd`; holds its device context alive.
#[derive(Debug)]
pub struct ProtectionDomain {
    ptr: *mut ffi::ibv_pd,
    ctx: Arc<Context>,
    /// A queue pair of this PD could not be destroyed: it may still reach
    /// any memory registered here, so none of it is ever unmapped.
    poisoned: AtomicBool,
}

// SAFETY: a PD is a handle the kernel validates; verbs on it are thread-safe.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; the only Rust-side state a shared method changes is
// `poisoned`, an atomic.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: ctx is a live context.
        let ptr = unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) };
        if ptr.is_null() {
            return Err(Error::AllocPd(last_os_error()));
        }
        Ok(Arc::new(ProtectionDomain {
            ptr,
            ctx: Arc::clone(ctx),
            poisoned: AtomicBool::new(false),
        }))
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_pd {
        self.ptr
    }

    /// Marks the PD as reachable by a queue pair that failed to go: its
    /// registrations then leak their memory instead of unmapping it.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        if self.is_poisoned() {
            // A queue pair of it may live on in the device: so must the PD.
            return;
        }
        // SAFETY: every QP and MR of this PD holds an Arc of it, so none is
        // alive; the PD is freed exactly once.
        let rc = unsafe { ffi::ibv_dealloc_pd(self.ptr) };
        if rc != 0 {
            tracing::warn!(error = %crate::error::errno(rc), "ibv_dealloc_pd failed");
        }
    }
}
