//! Shared receive queues: one ring of receives that many queue pairs of a
//! protection domain take their incoming SENDs from, so that receive
//! memory does not grow with the number of connections (issue 25).
//!
//! The rules are the receive queue's: a receive's buffer is the NIC's
//! from its post until its completion is polled, whichever queue pair it
//! lands on; memory a posted receive names outlives the SRQ (parked in
//! its [`ParkingLot`], freed once the SRQ is destroyed, leaked if that
//! fails); posting is the one [`SrqPoster`]'s, `Send` but not `Sync`.
//!
//! One thread must also do everything else that touches the SRQ's queue
//! in user space: mlx5 returns receives to the SRQ's free list from
//! `ibv_poll_cq` of the CQ the SRQ's queue pairs complete receives on,
//! and from `ibv_destroy_qp` of each of them, under the SRQ lock that
//! `MLX5_SINGLE_THREADED=1` removes. So the poster, the receive CQ's
//! poller and the destruction of those queue pairs belong to one `!Sync`
//! owner — the poller of issue 25 (until it exists, only device tests
//! use these types, on one thread).

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::Arc;

use super::cq::CompletionQueue;
use super::ffi;
use super::parked::ParkingLot;
use super::pd::ProtectionDomain;
use crate::error::{errno, last_os_error, Error, Result};

/// An `ibv_srq`: the owner, which the queue pairs on it hold alive, and
/// which is destroyed after the last of them.
#[derive(Debug)]
pub(crate) struct SharedReceiveQueue {
    ptr: *mut ffi::ibv_srq,
    /// The receives the device granted (at least what was asked for).
    max_wr: u32,
    /// Memory its posted receives may name.
    lot: Arc<ParkingLot>,
    /// The CQ every queue pair on it completes its receives on: held, so
    /// no other CQ gets its address (a ring's completions are told apart
    /// by it) while the SRQ lives.
    recv_cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the handle may move between threads; destroying it (Drop) needs
// the last Arc, so no other thread still uses it.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: &SharedReceiveQueue hands the handle to ibv_create_qp and runs
// ibv_modify_srq with IBV_SRQ_LIMIT only and ibv_query_srq: on rxe and
// mlx5 both are commands to the kernel that touch no user-space state of
// the provider, so they may run beside a post. (Resizing, IBV_SRQ_MAX_WR,
// would touch the provider's queue: it is never passed.) Posting, and
// what else reaches the queue (module doc), are the single owner's.
unsafe impl Sync for SharedReceiveQueue {}

/// The right to post receives to one SRQ: one per SRQ, `Send` but not
/// `Sync`, so one thread at a time posts (a provider may then skip its
/// SRQ lock, as `MLX5_SINGLE_THREADED=1` does).
#[derive(Debug)]
pub(crate) struct SrqPoster {
    srq: Arc<SharedReceiveQueue>,
    _not_sync: PhantomData<Cell<()>>,
}

impl SharedReceiveQueue {
    /// Creates an SRQ of at least `max_wr` receives of one scatter/gather
    /// entry each, in `pd`, whose receives complete on `recv_cq` (every
    /// queue pair on it must have that receive CQ: its ring's ids are
    /// tagged by that CQ alone); returns its owner (for the queue pairs)
    /// and its poster.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        recv_cq: &Arc<CompletionQueue>,
        max_wr: u32,
    ) -> Result<(Arc<Self>, SrqPoster)> {
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: pd is live and outlives the SRQ (held below); attr is
        // valid, and the call writes the granted sizes back into it.
        let ptr = unsafe { ffi::ibv_create_srq(pd.as_ptr(), &mut attr) };
        if ptr.is_null() {
            return Err(Error::CreateSrq {
                max_wr,
                source: last_os_error(),
            });
        }
        let srq = Arc::new(SharedReceiveQueue {
            ptr,
            max_wr: attr.attr.max_wr,
            lot: ParkingLot::new(),
            recv_cq: Arc::clone(recv_cq),
            pd: Arc::clone(pd),
        });
        if srq.max_wr < max_wr {
            // Fewer than asked: the ring would overflow it (destroyed on
            // return, nothing posted yet).
            return Err(Error::CreateSrq {
                max_wr,
                source: std::io::Error::other(format!(
                    "the device granted {} receives",
                    srq.max_wr
                )),
            });
        }
        let poster = SrqPoster {
            srq: Arc::clone(&srq),
            _not_sync: PhantomData,
        };
        Ok((srq, poster))
    }

    /// The CQ its receives complete on.
    pub(crate) fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_srq {
        self.ptr
    }

    /// This SRQ's identity, for matching asynchronous events to it.
    pub(crate) fn handle(&self) -> *const std::ffi::c_void {
        self.ptr.cast()
    }

    /// The receives it holds at most (what the device granted, at least
    /// what was asked).
    pub(crate) fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Where memory goes that its posted receives may still name.
    pub(crate) fn lot(&self) -> &Arc<ParkingLot> {
        &self.lot
    }

    /// The protection domain it was made in.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Arms the limit event: once fewer than `limit` receives remain
    /// posted, the device raises `IBV_EVENT_SRQ_LIMIT_REACHED` on the
    /// context's asynchronous events, once, and disarms (the limit reads 0
    /// again). 0 disarms.
    pub(crate) fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: ptr is a live SRQ and attr valid for the call.
        let rc = unsafe { ffi::ibv_modify_srq(self.ptr, &mut attr, ffi::IBV_SRQ_LIMIT as i32) };
        if rc != 0 {
            return Err(Error::SharedReceiveQueue {
                call: "ibv_modify_srq",
                what: "setting its limit (srq_limit must be below max_wr)",
                source: errno(rc),
            });
        }
        Ok(())
    }

    /// The armed limit; 0 when none is armed (or the event fired).
    pub(crate) fn limit(&self) -> Result<u32> {
        let mut attr = MaybeUninit::<ffi::ibv_srq_attr>::zeroed();
        // SAFETY: ptr is a live SRQ and attr a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_srq(self.ptr, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::SharedReceiveQueue {
                call: "ibv_query_srq",
                what: "reading its limit",
                source: errno(rc),
            });
        }
        // SAFETY: filled by ibv_query_srq (zeroed is valid too).
        Ok(unsafe { attr.assume_init() }.srq_limit)
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: our SRQ, destroyed once: every queue pair on it holds an
        // Arc of it, so none is left, and the poster holds one too.
        let rc = unsafe { ffi::ibv_destroy_srq(self.ptr) };
        let destroyed = rc == 0;
        if !destroyed {
            tracing::warn!(
                error = %errno(rc),
                "ibv_destroy_srq failed: the memory of its PD is leaked, never unmapped"
            );
            // Its receives may still land in any memory of the PD.
            self.pd.poison();
        }
        self.lot.queue_pair_gone(destroyed);
    }
}

impl SrqPoster {
    pub(crate) fn srq(&self) -> &Arc<SharedReceiveQueue> {
        &self.srq
    }
}
