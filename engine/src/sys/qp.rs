//! Reliable-connected queue pairs: creation, the RESET→INIT→RTR→RTS state
//! machine, and posting work requests.

use std::mem::MaybeUninit;
use std::sync::Arc;

use super::cm::CmId;
use super::cq::CompletionQueue;
use super::ffi;
use super::mr::Access;
use super::parked::ParkingLot;
use super::pd::ProtectionDomain;
use super::srq::SharedReceiveQueue;
use crate::config::QpConfig;
use crate::error::{last_os_error, Error, Misuse, Result};

type Mask = ffi::ibv_qp_attr_mask;

/// The attributes RESET→INIT must carry, and no others (IBTA 11.2.1.2 /
/// ibv_modify_qp(3) "RESET to INIT: required").
pub const INIT_MASK: u32 = Mask::IBV_QP_STATE.0
    | Mask::IBV_QP_PKEY_INDEX.0
    | Mask::IBV_QP_PORT.0
    | Mask::IBV_QP_ACCESS_FLAGS.0;
/// INIT→RTR for RC.
pub const RTR_MASK: u32 = Mask::IBV_QP_STATE.0
    | Mask::IBV_QP_AV.0
    | Mask::IBV_QP_PATH_MTU.0
    | Mask::IBV_QP_DEST_QPN.0
    | Mask::IBV_QP_RQ_PSN.0
    | Mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
    | Mask::IBV_QP_MIN_RNR_TIMER.0;
/// RTR→RTS for RC.
pub const RTS_MASK: u32 = Mask::IBV_QP_STATE.0
    | Mask::IBV_QP_TIMEOUT.0
    | Mask::IBV_QP_RETRY_CNT.0
    | Mask::IBV_QP_RNR_RETRY.0
    | Mask::IBV_QP_SQ_PSN.0
    | Mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
/// Any state → ERR: flushes every posted work request.
pub const ERR_MASK: u32 = Mask::IBV_QP_STATE.0;

/// The address of the peer's queue pair, for INIT→RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerPath {
    pub qpn: u32,
    /// The peer's first receive PSN (= its send PSN), 24 bits.
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// Route by GID (always on RoCE, where there are no LIDs).
    pub global: bool,
    /// The local GID index the packets leave from.
    pub sgid_index: u8,
    /// `enum ibv_mtu` of the path.
    pub mtu: u32,
}

/// QP states, as `enum ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpState {
    /// Created (or reset): it processes no work request.
    Reset,
    /// Initialised: receives may be posted, but nothing is received or
    /// sent yet.
    Init,
    /// Ready to receive: the peer's packets are processed, nothing can be
    /// sent yet.
    Rtr,
    /// Ready to send: connected and working.
    Rts,
    /// Send queue drained: sending paused (pinpoll never moves a queue
    /// pair here).
    Sqd,
    /// Send queue error, a state of unreliable queue pairs: a
    /// reliable-connected one fails to `Err` instead.
    Sqe,
    /// Error: every posted and every new work request completes, flushed.
    /// A failed request, a disconnect, or the end of a connection puts a
    /// queue pair here.
    Err,
    /// A value of `enum ibv_qp_state` this version of pinpoll does not know.
    Unknown,
}

impl QpState {
    fn from_raw(v: u32) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => QpState::Unknown,
        }
    }
}

#[derive(Debug)]
enum Owner {
    /// Created with ibv_create_qp; destroyed with ibv_destroy_qp.
    Verbs,
    /// Created with rdma_create_qp on a CM id, whose `qp` field names it
    /// until it is destroyed.
    Cm(Arc<CmId>),
}

/// A reliable-connected `ibv_qp`. Holds its PD and CQs alive, and the
/// memory its requests may still name after their owners let go of it
/// ([`ParkingLot`]), which it frees once destroyed — or leaks, with every
/// registration of its PD, if destroying it fails.
///
/// Posting (in [`super::wr`]) takes `&mut self`: one owner posts, which is
/// what the busy-poll design wants and what lets a provider run without
/// locks (`MLX5_SINGLE_THREADED=1`).
#[derive(Debug)]
pub(crate) struct QueuePair {
    ptr: *mut ffi::ibv_qp,
    owner: Owner,
    max_inline: u32,
    lot: Arc<ParkingLot>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    /// The shared receive queue its receives come from, if any (it has no
    /// receive queue of its own then).
    _srq: Option<Arc<SharedReceiveQueue>>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the QP handle may move to another thread (the engine's worker)
// with its owner; it is not Sync, so posting (which needs &mut) and every
// other verb on it run on one thread at a time.
unsafe impl Send for QueuePair {}

/// The queues a queue pair is made of: its completion queues and, if its
/// receives come from one, a shared receive queue (held alive by the QP).
#[derive(Clone, Copy)]
pub(crate) struct Queues<'a> {
    pub send_cq: &'a Arc<CompletionQueue>,
    pub recv_cq: &'a Arc<CompletionQueue>,
    pub srq: Option<&'a Arc<SharedReceiveQueue>>,
}

impl<'a> Queues<'a> {
    /// Completion queues, and a receive queue of the QP's own.
    pub(crate) fn own(
        send_cq: &'a Arc<CompletionQueue>,
        recv_cq: &'a Arc<CompletionQueue>,
    ) -> Self {
        Queues {
            send_cq,
            recv_cq,
            srq: None,
        }
    }
}

impl Queues<'_> {
    /// Whether every queue is of `pd`'s device context, and the SRQ of
    /// `pd` itself: the kernel looks the handles up in the QP's own
    /// context, so another's could name a different object there.
    fn belong_to(&self, pd: &ProtectionDomain) -> bool {
        let ctx = pd.context();
        Arc::ptr_eq(self.send_cq.context(), ctx)
            && Arc::ptr_eq(self.recv_cq.context(), ctx)
            && self.srq.is_none_or(|srq| {
                std::ptr::eq(Arc::as_ptr(srq.pd()), pd) && Arc::ptr_eq(srq.recv_cq(), self.recv_cq)
            })
    }
}

fn init_attr(cfg: &QpConfig, queues: Queues<'_>) -> ffi::ibv_qp_init_attr {
    ffi::ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: queues.send_cq.as_ptr(),
        recv_cq: queues.recv_cq.as_ptr(),
        srq: queues.srq.map_or(std::ptr::null_mut(), |s| s.as_ptr()),
        cap: ffi::ibv_qp_cap {
            max_send_wr: cfg.max_send_wr,
            // A QP on an SRQ has no receive queue of its own.
            max_recv_wr: if queues.srq.is_some() {
                0
            } else {
                cfg.max_recv_wr
            },
            max_send_sge: cfg.max_sge,
            max_recv_sge: cfg.max_sge,
            max_inline_data: cfg.max_inline_data,
        },
        qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
        sq_sig_all: 0,
    }
}

impl QueuePair {
    /// Creates an RC queue pair in RESET, for manual connection.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        queues: Queues<'_>,
        cfg: &QpConfig,
    ) -> Result<QueuePair> {
        if !queues.belong_to(pd) {
            return Err(Error::Misuse(Misuse::QueuesOfAnotherDomain));
        }
        let mut attr = init_attr(cfg, queues);
        // SAFETY: pd, CQs and SRQ are live and outlive the QP (held below),
        // and all of pd's device (checked above).
        let ptr = unsafe { ffi::ibv_create_qp(pd.as_ptr(), &mut attr) };
        if ptr.is_null() {
            return Err(create_qp_error(&attr, last_os_error()));
        }
        Ok(QueuePair {
            ptr,
            owner: Owner::Verbs,
            max_inline: attr.cap.max_inline_data,
            lot: ParkingLot::new(),
            _send_cq: Arc::clone(queues.send_cq),
            _recv_cq: Arc::clone(queues.recv_cq),
            _srq: queues.srq.map(Arc::clone),
            _pd: Arc::clone(pd),
        })
    }

    /// Creates an RC queue pair on a CM id; rdma_cm drives its transitions.
    pub(crate) fn with_cm_id(
        id: &Arc<CmId>,
        pd: &Arc<ProtectionDomain>,
        queues: Queues<'_>,
        cfg: &QpConfig,
    ) -> Result<QueuePair> {
        if !queues.belong_to(pd) {
            return Err(Error::Misuse(Misuse::QueuesOfAnotherDomain));
        }
        let mut attr = init_attr(cfg, queues);
        // SAFETY: id, pd, CQs and SRQ are live and outlive the QP (held below),
        // all of pd's device (checked above); rdma_create_qp stores the QP in
        // id->qp.
        let rc = unsafe { ffi::rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(create_qp_error(&attr, last_os_error()));
        }
        // SAFETY: on success id->qp is the new QP.
        let ptr = unsafe { (*id.as_ptr()).qp };
        Ok(QueuePair {
            ptr,
            owner: Owner::Cm(Arc::clone(id)),
            max_inline: attr.cap.max_inline_data,
            lot: ParkingLot::new(),
            _send_cq: Arc::clone(queues.send_cq),
            _recv_cq: Arc::clone(queues.recv_cq),
            _srq: queues.srq.map(Arc::clone),
            _pd: Arc::clone(pd),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_qp {
        self.ptr
    }

    /// This QP's identity, for matching asynchronous events to it.
    pub(crate) fn handle(&self) -> *const std::ffi::c_void {
        self.ptr.cast()
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: ptr is a live QP.
        unsafe { (*self.ptr).qp_num }
    }

    /// Where memory goes that this QP's requests may still name.
    pub(crate) fn lot(&self) -> &Arc<ParkingLot> {
        &self.lot
    }

    /// The inline size the device granted (at least what was asked for).
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }

    pub(crate) fn state(&self) -> Result<QpState> {
        let mut attr = MaybeUninit::<ffi::ibv_qp_attr>::zeroed();
        let mut init = MaybeUninit::<ffi::ibv_qp_init_attr>::zeroed();
        // SAFETY: ptr is live and both out-pointers are valid.
        let rc = unsafe {
            ffi::ibv_query_qp(
                self.ptr,
                attr.as_mut_ptr(),
                Mask::IBV_QP_STATE.0 as i32,
                init.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(Error::ModifyQp {
                from: "query",
                to: "query",
                mask: Mask::IBV_QP_STATE.0,
                hint: "ibv_query_qp failed",
                source: crate::error::errno(rc),
            });
        }
        // SAFETY: filled by ibv_query_qp.
        Ok(QpState::from_raw(unsafe { attr.assume_init() }.qp_state))
    }

    fn modify(
        &mut self,
        attr: &mut ffi::ibv_qp_attr,
        mask: u32,
        from: &'static str,
        to: &'static str,
        hint: &'static str,
    ) -> Result<()> {
        // SAFETY: ptr is live and attr is a fully initialised attribute set.
        let rc = unsafe { ffi::ibv_modify_qp(self.ptr, attr, mask as i32) };
        if rc != 0 {
            return Err(Error::ModifyQp {
                from,
                to,
                mask,
                hint,
                source: crate::error::errno(rc),
            });
        }
        Ok(())
    }

    /// RESET→INIT, allowing the remote accesses `access` on this QP.
    pub(crate) fn enter_init(&mut self, port: u8, access: Access) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = port;
        attr.qp_access_flags = access.bits();
        self.modify(
            &mut attr,
            INIT_MASK,
            "RESET",
            "INIT",
            "check the port number and that the QP is in RESET",
        )
    }

    /// INIT→RTR towards `peer`.
    pub(crate) fn enter_rtr(&mut self, peer: &PeerPath, cfg: &QpConfig) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = peer.mtu;
        attr.dest_qp_num = peer.qpn;
        attr.rq_psn = peer.psn;
        attr.max_dest_rd_atomic = cfg.max_rd_atomic;
        attr.min_rnr_timer = cfg.min_rnr_timer;
        attr.ah_attr.dlid = peer.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = cfg.port;
        attr.ah_attr.is_global = u8::from(peer.global);
        if peer.global {
            attr.ah_attr.grh.dgid.raw = peer.gid;
            attr.ah_attr.grh.sgid_index = peer.sgid_index;
            attr.ah_attr.grh.hop_limit = 64;
            attr.ah_attr.grh.flow_label = 0;
            attr.ah_attr.grh.traffic_class = 0;
        }
        self.modify(
            &mut attr,
            RTR_MASK,
            "INIT",
            "RTR",
            "check the peer's QPN, the path MTU (at most the port's active MTU), and on RoCE the GID and its index (is_global must be set)",
        )
    }

    /// RTR→RTS, sending from `psn`.
    pub(crate) fn enter_rts(&mut self, psn: u32, cfg: &QpConfig) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = cfg.timeout;
        attr.retry_cnt = cfg.retry_count;
        attr.rnr_retry = cfg.rnr_retry;
        attr.sq_psn = psn;
        attr.max_rd_atomic = cfg.max_rd_atomic;
        self.modify(
            &mut attr,
            RTS_MASK,
            "RTR",
            "RTS",
            "check timeout (1..=31), retry_count (0..=7) and max_rd_atomic against the device",
        )
    }

    /// Moves the QP to ERR after a post that may have queued requests
    /// without saying so, so that each of them completes (flushed) before
    /// its memory is used again. If even that fails, the requests complete
    /// when they run, or never: their memory is then kept until the QP is
    /// destroyed, which is all that is left to wait for.
    #[cold]
    #[inline(never)]
    pub(crate) fn fail(&mut self) {
        if let Err(e) = self.enter_error() {
            tracing::warn!(error = %e, "moving the queue pair to ERR after an indeterminate post failed");
        }
    }

    /// Moves the QP to ERR, which flushes every posted work request with
    /// WR_FLUSH_ERR; the first step of an orderly teardown.
    pub(crate) fn enter_error(&mut self) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        self.modify(
            &mut attr,
            ERR_MASK,
            "any",
            "ERR",
            "the QP may already be destroyed",
        )
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: our QP, destroyed once, before the CQs and PD that this
        // struct holds alive. For a QP made by rdma_create_qp with our own
        // CQs, rdma_destroy_qp is exactly this call followed by clearing
        // id->qp (librdmacm's cma.c; it destroys CQs only if it made them),
        // but it drops the result, which decides below what may be freed.
        let rc = unsafe { ffi::ibv_destroy_qp(self.ptr) };
        let destroyed = rc == 0;
        if !destroyed {
            tracing::warn!(
                error = %crate::error::errno(rc),
                "ibv_destroy_qp failed: the memory of its PD is leaked, never unmapped"
            );
        } else if let Owner::Cm(id) = &self.owner {
            // SAFETY: the CM id is alive (held here) and its QP is gone:
            // what rdma_destroy_qp leaves behind.
            unsafe { (*id.as_ptr()).qp = std::ptr::null_mut() };
        }
        if !destroyed {
            // The QP may still reach any memory of its PD, parked or not.
            self._pd.poison();
        }
        self.lot.queue_pair_gone(destroyed);
    }
}

fn zeroed_attr() -> ffi::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data; zero is valid for every field.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// What a failed creation asked for (`attr` as it was passed: an SRQ's
/// queue pair asks for no receives of its own).
fn create_qp_error(attr: &ffi::ibv_qp_init_attr, source: std::io::Error) -> Error {
    Error::CreateQp {
        max_send_wr: attr.cap.max_send_wr,
        max_recv_wr: attr.cap.max_recv_wr,
        max_inline: attr.cap.max_inline_data,
        source,
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    fn bits(names: &[Mask]) -> u32 {
        names.iter().fold(0, |acc, m| acc | m.0)
    }

    /// Each transition carries exactly the attributes ibv_modify_qp(3)
    /// lists as required for RC, nothing optional: an extra or missing bit
    /// is the classic EINVAL.
    #[test]
    fn transition_masks_are_exactly_the_required_sets() {
        assert_eq!(
            INIT_MASK,
            bits(&[
                Mask::IBV_QP_STATE,
                Mask::IBV_QP_PKEY_INDEX,
                Mask::IBV_QP_PORT,
                Mask::IBV_QP_ACCESS_FLAGS
            ])
        );
        assert_eq!(
            RTR_MASK,
            bits(&[
                Mask::IBV_QP_STATE,
                Mask::IBV_QP_AV,
                Mask::IBV_QP_PATH_MTU,
                Mask::IBV_QP_DEST_QPN,
                Mask::IBV_QP_RQ_PSN,
                Mask::IBV_QP_MAX_DEST_RD_ATOMIC,
                Mask::IBV_QP_MIN_RNR_TIMER
            ])
        );
        assert_eq!(
            RTS_MASK,
            bits(&[
                Mask::IBV_QP_STATE,
                Mask::IBV_QP_TIMEOUT,
                Mask::IBV_QP_RETRY_CNT,
                Mask::IBV_QP_RNR_RETRY,
                Mask::IBV_QP_SQ_PSN,
                Mask::IBV_QP_MAX_QP_RD_ATOMIC
            ])
        );
        // The numeric values are the kernel ABI; pin a few.
        assert_eq!(INIT_MASK, 0x1 | 0x10 | 0x20 | 0x8);
        assert_eq!(RTS_MASK & Mask::IBV_QP_AV.0, 0);
    }
}
