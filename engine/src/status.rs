//! Work-completion status and opcode names, and the typed error a failed
//! completion becomes. Pure Rust: the numbers are the stable verbs ABI
//! (`enum ibv_wc_status`, `enum ibv_wc_opcode` in `<infiniband/verbs.h>`).

use std::fmt;

/// `enum ibv_wc_status`, in ABI order.
const STATUS: &[(&str, &str)] = &[
    ("SUCCESS", "success"),
    ("LOC_LEN_ERR", "local length error"),
    ("LOC_QP_OP_ERR", "local QP operation error"),
    ("LOC_EEC_OP_ERR", "local EE context operation error"),
    ("LOC_PROT_ERR", "local protection error"),
    ("WR_FLUSH_ERR", "Work Request Flushed Error"),
    ("MW_BIND_ERR", "memory management operation error"),
    ("BAD_RESP_ERR", "bad response error"),
    ("LOC_ACCESS_ERR", "local access error"),
    ("REM_INV_REQ_ERR", "remote invalid request error"),
    ("REM_ACCESS_ERR", "remote access error"),
    ("REM_OP_ERR", "remote operation error"),
    ("RETRY_EXC_ERR", "transport retry counter exceeded"),
    ("RNR_RETRY_EXC_ERR", "RNR retry counter exceeded"),
    ("LOC_RDD_VIOL_ERR", "local RDD violation error"),
    ("REM_INV_RD_REQ_ERR", "remote invalid RD request"),
    ("REM_ABORT_ERR", "aborted error"),
    ("INV_EECN_ERR", "invalid EE context number"),
    ("INV_EEC_STATE_ERR", "invalid EE context state"),
    ("FATAL_ERR", "fatal error"),
    ("RESP_TIMEOUT_ERR", "response timeout error"),
    ("GENERAL_ERR", "general error"),
    ("TM_ERR", "TM error"),
    ("TM_RNDV_INCOMPLETE", "TM software rendezvous"),
];

/// A work completion's status (`enum ibv_wc_status`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// The request completed as asked: the only status that is not an
    /// error.
    pub const SUCCESS: WcStatus = WcStatus(0);
    /// Local length error: most often a receive buffer shorter than the
    /// message the peer sent into it.
    pub const LOC_LEN_ERR: WcStatus = WcStatus(1);
    /// Local protection error: the local buffer is not inside the memory
    /// region its lkey names, or that region was deregistered.
    pub const LOC_PROT_ERR: WcStatus = WcStatus(4);
    /// Flushed: the queue pair was already in ERR (an earlier failure, a
    /// disconnect, a close), so the request was not carried out. A
    /// consequence, never the cause: the engine reports the cause instead
    /// where it knows it.
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(5);
    /// Remote invalid request: the peer's NIC refused the request, e.g. a
    /// message longer than its receive buffer or an opcode it does not
    /// allow.
    pub const REM_INV_REQ_ERR: WcStatus = WcStatus(9);
    /// Remote access error: the peer's memory region does not allow the
    /// access, the rkey is wrong or stale, or the range lies outside it.
    pub const REM_ACCESS_ERR: WcStatus = WcStatus(10);
    /// Remote operation error: the peer could not carry out the request
    /// (its receive queue or queue pair failed).
    pub const REM_OP_ERR: WcStatus = WcStatus(11);
    /// Transport retries exceeded: the peer acknowledged neither the
    /// request nor any of its `retry_count` retransmissions within the ACK
    /// timeout ([`QpConfig`](crate::QpConfig)): it is gone, or the path is
    /// down.
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(12);
    /// Receiver-not-ready retries exceeded: the peer still had no receive
    /// posted for a SEND after `rnr_retry` retries
    /// ([`QpConfig`](crate::QpConfig)).
    pub const RNR_RETRY_EXC_ERR: WcStatus = WcStatus(13);

    /// The verbs name, e.g. `REM_ACCESS_ERR`.
    pub fn name(self) -> &'static str {
        STATUS.get(self.0 as usize).map_or("UNKNOWN", |s| s.0)
    }

    /// The human text `ibv_wc_status_str` gives.
    pub fn text(self) -> &'static str {
        STATUS
            .get(self.0 as usize)
            .map_or("unknown status", |s| s.1)
    }

    /// What usually causes this status and what to do about it.
    pub fn hint(self) -> &'static str {
        match self.0 {
            0 => "",
            1 => "a receive buffer is smaller than the message sent into it: post larger receive buffers",
            2 => "the work request is invalid for this QP (too many SGEs or inline bytes, or wrong opcode)",
            4 => "the local buffer is not inside the memory region named by the lkey, or the region was deregistered",
            5 => "the queue pair went to the error state earlier; this work request was flushed, see the first error",
            8 => "the local memory region lacks LOCAL_WRITE access for an incoming write or read response",
            9 => "the peer rejected the request: message longer than its receive buffer or an opcode it does not allow",
            10 => "the peer's memory region does not allow this access (check its access flags), the rkey is wrong or stale, or the address range lies outside the peer's region",
            11 => "the peer could not complete the operation (its receive queue or QP failed)",
            12 => "the peer did not acknowledge in time: it is gone, the link is down, or the QP timeout/retry count is too small for the path",
            13 => "the peer had no receive posted for too long: post receives ahead (credits), or raise the RNR retry count/timer",
            19 => "the device reported a fatal error: reset the device or its driver",
            _ => "see ibv_poll_cq(3) for this status",
        }
    }

    /// Whether this is [`SUCCESS`](WcStatus::SUCCESS). Any other status is
    /// a failed (or flushed) request, after which a reliable-connected
    /// queue pair is in ERR.
    pub fn is_success(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.text())
    }
}

/// A work completion's opcode (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcOpcode(pub u32);

impl WcOpcode {
    /// A SEND this side posted completed.
    pub const SEND: WcOpcode = WcOpcode(0);
    /// An RDMA WRITE this side posted (with or without an immediate)
    /// completed.
    pub const RDMA_WRITE: WcOpcode = WcOpcode(1);
    /// An RDMA READ this side posted completed: its data are in local
    /// memory.
    pub const RDMA_READ: WcOpcode = WcOpcode(2);
    /// A posted receive took a SEND from the peer. Also the opcode the
    /// engine reports for a failed receive, whose own opcode is undefined.
    pub const RECV: WcOpcode = WcOpcode(128);
    /// A posted receive was consumed by the peer's RDMA WRITE_WITH_IMM: it
    /// carries the immediate, the data went to the memory written.
    pub const RECV_RDMA_WITH_IMM: WcOpcode = WcOpcode(129);

    /// The verbs name, e.g. `RDMA_WRITE`; `UNKNOWN` for a value outside
    /// `enum ibv_wc_opcode`.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "SEND",
            1 => "RDMA_WRITE",
            2 => "RDMA_READ",
            3 => "COMP_SWAP",
            4 => "FETCH_ADD",
            5 => "BIND_MW",
            6 => "LOCAL_INV",
            7 => "TSO",
            128 => "RECV",
            129 => "RECV_RDMA_WITH_IMM",
            _ => "UNKNOWN",
        }
    }
}

impl fmt::Debug for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A work request that completed with an error status.
///
/// The opcode of an error completion is undefined by the verbs spec (only
/// `wr_id`, `status`, `vendor_err` and `qp_num` are valid), so `opcode` is
/// the one the engine posted, when the engine knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} ({}) failed: {status}{}", request_name(*wr_id), opcode.map_or("opcode unknown", WcOpcode::name), hint_suffix(*status))]
pub struct WcError {
    /// The failed request's id, or [`WcError::INTERNAL`].
    pub wr_id: u64,
    /// What the failed request was, as the engine posted it (`RECV` for a
    /// receive); `None` where the engine does not know, as for the
    /// completions [`Endpoint`](crate::Endpoint) hands back.
    pub opcode: Option<WcOpcode>,
    /// Why it failed; [`WcStatus::hint`] says what usually causes it.
    pub status: WcStatus,
    /// The device's own error syndrome for the failure (the completion's
    /// `vendor_err`), for the NIC vendor's documentation; its meaning is
    /// the driver's.
    pub vendor_err: u32,
}

impl WcError {
    /// The `wr_id` of a failure of the engine's own request (a close
    /// marker or a heartbeat), which no caller posted: no caller's id can
    /// be mistaken for it, and none is reported in its place.
    pub const INTERNAL: u64 = u64::MAX;
}

fn request_name(wr_id: u64) -> String {
    match wr_id {
        WcError::INTERNAL => "the engine's own work request".to_owned(),
        id => format!("work request {id}"),
    }
}

fn hint_suffix(status: WcStatus) -> String {
    match status.hint() {
        "" => String::new(),
        hint => format!("; hint: {hint}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_follow_the_verbs_abi() {
        assert_eq!(WcStatus(10).name(), "REM_ACCESS_ERR");
        assert_eq!(WcStatus(12).name(), "RETRY_EXC_ERR");
        assert_eq!(WcStatus(13).name(), "RNR_RETRY_EXC_ERR");
        assert_eq!(WcStatus(21).name(), "GENERAL_ERR");
        assert_eq!(WcStatus(500).name(), "UNKNOWN");
        assert!(WcStatus::SUCCESS.is_success());
        assert!(!WcStatus::WR_FLUSH_ERR.is_success());
    }

    #[test]
    fn an_error_completion_names_request_status_and_fix() {
        let err = WcError {
            wr_id: 42,
            opcode: Some(WcOpcode::RDMA_WRITE),
            status: WcStatus::REM_ACCESS_ERR,
            vendor_err: 0,
        };
        let text = err.to_string();
        assert!(
            text.starts_with(
                "work request 42 (RDMA_WRITE) failed: REM_ACCESS_ERR (remote access error)"
            ),
            "{text}"
        );
        assert!(text.contains("access flags"), "{text}");
        assert!(text.contains("outside the peer's region"), "{text}");
    }

    #[test]
    fn an_internal_failure_names_no_callers_request() {
        let err = WcError {
            wr_id: WcError::INTERNAL,
            opcode: Some(WcOpcode::SEND),
            status: WcStatus::RETRY_EXC_ERR,
            vendor_err: 0,
        };
        let text = err.to_string();
        assert!(
            text.starts_with("the engine's own work request (SEND) failed: RETRY_EXC_ERR"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod abi_tests {
    use super::WcStatus;

    /// Our table must say what libibverbs itself says for every status.
    #[test]
    fn status_texts_match_libibverbs() {
        for code in 0..=23u32 {
            assert_eq!(
                WcStatus(code).text(),
                crate::sys::wc_status_str(code),
                "status {code}"
            );
        }
    }
}
