//! Reliable-connected queue pairs: creation, the RESET→INIT→RTR→RTS state
//! machine, and posting work requests.

use std::mem::MaybeUninit;
use std::sync::Arc;

use super::cm::CmId;
use super::cq::CompletionQueue;
use super::ffi;
use super::mr::{Access, LocalSlice, RemoteSlice};
use super::pd::ProtectionDomain;
use crate::config::QpConfig;
use crate::error::{last_os_error, Error, Result};

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
pub struct PeerPath {
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
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
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

/// How a send-side work request is flagged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendFlags {
    /// Generate a completion for this request.
    pub signaled: bool,
    /// Copy the payload into the WQE at post time (no lkey, no DMA read).
    pub inline: bool,
}

impl SendFlags {
    pub const SIGNALED: SendFlags = SendFlags {
        signaled: true,
        inline: false,
    };
    pub const UNSIGNALED: SendFlags = SendFlags {
        signaled: false,
        inline: false,
    };

    pub(crate) fn bits(self) -> u32 {
        let mut bits = 0;
        if self.signaled {
            bits |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self.inline {
            bits |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        bits
    }
}

#[derive(Debug)]
enum Owner {
    /// Created with ibv_create_qp; destroyed with ibv_destroy_qp.
    Verbs,
    /// Created with rdma_create_qp on a CM id; destroyed with rdma_destroy_qp.
    Cm(Arc<CmId>),
}

/// A reliable-connected `ibv_qp`. Holds its PD and CQs alive.
///
/// Posting takes `&mut self`: one owner posts, which is what the busy-poll
/// design wants and what lets a provider run without locks
/// (`MLX5_SINGLE_THREADED=1`).
#[derive(Debug)]
pub struct QueuePair {
    ptr: *mut ffi::ibv_qp,
    owner: Owner,
    max_inline: u32,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the QP handle may move to another thread (the engine's worker);
// it is not Sync because posting needs exclusive access.
unsafe impl Send for QueuePair {}

fn init_attr(
    cfg: &QpConfig,
    send_cq: &CompletionQueue,
    recv_cq: &CompletionQueue,
) -> ffi::ibv_qp_init_attr {
    ffi::ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: send_cq.as_ptr(),
        recv_cq: recv_cq.as_ptr(),
        srq: std::ptr::null_mut(),
        cap: ffi::ibv_qp_cap {
            max_send_wr: cfg.max_send_wr,
            max_recv_wr: cfg.max_recv_wr,
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
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        cfg: &QpConfig,
    ) -> Result<QueuePair> {
        let mut attr = init_attr(cfg, send_cq, recv_cq);
        // SAFETY: pd and CQs are live and outlive the QP (held below).
        let ptr = unsafe { ffi::ibv_create_qp(pd.as_ptr(), &mut attr) };
        if ptr.is_null() {
            return Err(create_qp_error(cfg, last_os_error()));
        }
        Ok(QueuePair {
            ptr,
            owner: Owner::Verbs,
            max_inline: attr.cap.max_inline_data,
            _send_cq: Arc::clone(send_cq),
            _recv_cq: Arc::clone(recv_cq),
            _pd: Arc::clone(pd),
        })
    }

    /// Creates an RC queue pair on a CM id; rdma_cm drives its transitions.
    pub fn with_cm_id(
        id: &Arc<CmId>,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        cfg: &QpConfig,
    ) -> Result<QueuePair> {
        let mut attr = init_attr(cfg, send_cq, recv_cq);
        // SAFETY: id, pd and CQs are live and outlive the QP (held below);
        // rdma_create_qp stores the QP in id->qp.
        let rc = unsafe { ffi::rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(create_qp_error(cfg, last_os_error()));
        }
        // SAFETY: on success id->qp is the new QP.
        let ptr = unsafe { (*id.as_ptr()).qp };
        Ok(QueuePair {
            ptr,
            owner: Owner::Cm(Arc::clone(id)),
            max_inline: attr.cap.max_inline_data,
            _send_cq: Arc::clone(send_cq),
            _recv_cq: Arc::clone(recv_cq),
            _pd: Arc::clone(pd),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_qp {
        self.ptr
    }

    /// This QP's identity, for matching asynchronous events to it.
    pub fn handle(&self) -> *const std::ffi::c_void {
        self.ptr.cast()
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: ptr is a live QP.
        unsafe { (*self.ptr).qp_num }
    }

    /// The inline size the device granted (at least what was asked for).
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// The transport settings the QP actually runs with, read back from
    /// the device: (local ACK timeout, retry count, RNR retry, path MTU).
    pub fn transport(&self) -> Result<(u8, u8, u8, u32)> {
        let mut attr = MaybeUninit::<ffi::ibv_qp_attr>::zeroed();
        let mut init = MaybeUninit::<ffi::ibv_qp_init_attr>::zeroed();
        let mask = Mask::IBV_QP_TIMEOUT.0
            | Mask::IBV_QP_RETRY_CNT.0
            | Mask::IBV_QP_RNR_RETRY.0
            | Mask::IBV_QP_PATH_MTU.0;
        // SAFETY: ptr is live and both out-pointers are valid.
        let rc = unsafe {
            ffi::ibv_query_qp(self.ptr, attr.as_mut_ptr(), mask as i32, init.as_mut_ptr())
        };
        if rc != 0 {
            return Err(Error::ModifyQp {
                from: "query",
                to: "query",
                mask,
                hint: "ibv_query_qp failed",
                source: crate::error::errno(rc),
            });
        }
        // SAFETY: filled by ibv_query_qp.
        let a = unsafe { attr.assume_init() };
        Ok((a.timeout, a.retry_cnt, a.rnr_retry, a.path_mtu))
    }

    pub fn state(&self) -> Result<QpState> {
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
    pub fn to_init(&mut self, port: u8, access: Access) -> Result<()> {
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
    pub fn to_rtr(&mut self, peer: &PeerPath, cfg: &QpConfig) -> Result<()> {
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
    pub fn to_rts(&mut self, psn: u32, cfg: &QpConfig) -> Result<()> {
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

    /// Moves the QP to ERR, which flushes every posted work request with
    /// WR_FLUSH_ERR; the first step of an orderly teardown.
    pub fn to_error(&mut self) -> Result<()> {
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

    #[inline]
    fn post_one(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: wr and its sg_list (on the caller's stack) are valid for
        // the call; the provider copies them into the send queue before it
        // returns. Local buffers are named by lkey: a stale one fails in the
        // NIC (LOC_PROT_ERR), it is never dereferenced by us.
        let rc = unsafe { ffi::ibv_post_send(self.ptr, wr, &mut bad) };
        if rc != 0 {
            return Err(Error::PostSend {
                wr_id: wr.wr_id,
                source: crate::error::errno(rc),
            });
        }
        Ok(())
    }

    /// SEND `local` to the peer's next posted receive.
    pub fn post_send(&mut self, wr_id: u64, local: LocalSlice, flags: SendFlags) -> Result<()> {
        let mut sge = sge(local);
        let mut wr = send_wr(wr_id, ffi::ibv_wr_opcode::IBV_WR_SEND, &mut sge, flags);
        self.post_one(&mut wr)
    }

    /// SEND `data`, copied into the work request at post time.
    pub fn post_send_inline(&mut self, wr_id: u64, data: &[u8], signaled: bool) -> Result<()> {
        let mut sge = self.inline_sge(data)?;
        let mut wr = send_wr(
            wr_id,
            ffi::ibv_wr_opcode::IBV_WR_SEND,
            &mut sge,
            SendFlags {
                signaled,
                inline: true,
            },
        );
        self.post_one(&mut wr)
    }

    /// RDMA WRITE `local` to `remote`; with `imm`, WRITE_WITH_IMM, which
    /// also consumes one receive at the peer.
    pub fn post_write(
        &mut self,
        wr_id: u64,
        local: LocalSlice,
        remote: RemoteSlice,
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<()> {
        let mut sge = sge(local);
        self.post_rdma(wr_id, &mut sge, remote, imm, flags)
    }

    /// RDMA WRITE (with optional immediate) of `data`, copied inline.
    pub fn post_write_inline(
        &mut self,
        wr_id: u64,
        data: &[u8],
        remote: RemoteSlice,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = self.inline_sge(data)?;
        self.post_rdma(
            wr_id,
            &mut sge,
            remote,
            imm,
            SendFlags {
                signaled,
                inline: true,
            },
        )
    }

    fn post_rdma(
        &mut self,
        wr_id: u64,
        sge: &mut ffi::ibv_sge,
        remote: RemoteSlice,
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<()> {
        let opcode = if imm.is_some() {
            ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
        };
        let mut wr = send_wr(wr_id, opcode, sge, flags);
        wr.wr.rdma.remote_addr = remote.addr;
        wr.wr.rdma.rkey = remote.rkey;
        if let Some(imm) = imm {
            wr.__bindgen_anon_1.imm_data = imm.to_be();
        }
        self.post_one(&mut wr)
    }

    /// RDMA READ `remote` into `local` (which must allow LOCAL_WRITE).
    pub fn post_read(
        &mut self,
        wr_id: u64,
        local: LocalSlice,
        remote: RemoteSlice,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = sge(local);
        let mut wr = send_wr(
            wr_id,
            ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            &mut sge,
            SendFlags {
                signaled,
                inline: false,
            },
        );
        wr.wr.rdma.remote_addr = remote.addr;
        wr.wr.rdma.rkey = remote.rkey;
        self.post_one(&mut wr)
    }

    /// Posts a receive into `local`, or a zero-SGE receive (enough for a
    /// WRITE_WITH_IMM, which only needs a receive to carry the immediate).
    pub fn post_recv(&mut self, wr_id: u64, local: Option<LocalSlice>) -> Result<()> {
        let mut sge = local.map(sge);
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge.as_mut().map_or(std::ptr::null_mut(), |s| s as *mut _),
            num_sge: i32::from(sge.is_some()),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: wr and sge live on this stack frame for the call; the
        // provider copies them into the receive queue.
        let rc = unsafe { ffi::ibv_post_recv(self.ptr, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::PostRecv {
                wr_id,
                source: crate::error::errno(rc),
            });
        }
        Ok(())
    }

    fn inline_sge(&self, data: &[u8]) -> Result<ffi::ibv_sge> {
        if data.len() > self.max_inline as usize {
            return Err(Error::Config(format!(
                "{} bytes cannot be sent inline: the QP allows at most {} (max_inline_data)",
                data.len(),
                self.max_inline
            )));
        }
        // lkey is ignored for inline data: the CPU copies the bytes at post.
        Ok(ffi::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Verbs => {
                // SAFETY: our QP, destroyed once, before the CQs and PD that
                // this struct holds alive.
                let rc = unsafe { ffi::ibv_destroy_qp(self.ptr) };
                if rc != 0 {
                    tracing::warn!(error = %crate::error::errno(rc), "ibv_destroy_qp failed");
                }
            }
            Owner::Cm(id) => {
                // SAFETY: the QP hangs off this CM id, which is alive (held
                // here); rdma_destroy_qp destroys it and clears id->qp.
                unsafe { ffi::rdma_destroy_qp(id.as_ptr()) };
            }
        }
    }
}

fn zeroed_attr() -> ffi::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data; zero is valid for every field.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

#[inline]
fn sge(local: LocalSlice) -> ffi::ibv_sge {
    ffi::ibv_sge {
        addr: local.addr,
        length: local.len,
        lkey: local.lkey,
    }
}

#[inline]
fn send_wr(wr_id: u64, opcode: u32, sge: &mut ffi::ibv_sge, flags: SendFlags) -> ffi::ibv_send_wr {
    // SAFETY: ibv_send_wr is plain data (integers, pointers, unions of
    // those); all-zero is valid and means "no next, no immediate".
    let mut wr: ffi::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = flags.bits();
    wr
}

fn create_qp_error(cfg: &QpConfig, source: std::io::Error) -> Error {
    Error::CreateQp {
        max_send_wr: cfg.max_send_wr,
        max_recv_wr: cfg.max_recv_wr,
        max_inline: cfg.max_inline_data,
        source,
    }
}

#[cfg(test)]
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

    #[test]
    fn send_flags_map_to_verbs_bits() {
        assert_eq!(SendFlags::UNSIGNALED.bits(), 0);
        assert_eq!(
            SendFlags::SIGNALED.bits(),
            ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
        );
        assert_eq!(
            SendFlags {
                signaled: true,
                inline: true
            }
            .bits(),
            2 | 8
        );
    }
}
