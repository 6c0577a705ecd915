//! One error type for the whole engine: one variant per failing verb, each
//! carrying the `io::Error` the verb reported, plus a hint where the cause is
//! usually not the code but the machine (memlock, a missing device, ...).

use std::io;
use std::time::Duration;

use crate::status::WcError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to get an RDMA device on a machine that has none: commands of the
/// system's own tools, nothing of this repository's.
pub const HOW_TO_GET_A_DEVICE: &str = "load the NIC's RDMA driver (e.g. `modprobe mlx5_ib`) \
and rdma-core's user-space providers (package `ibverbs-providers` or `rdma-core`); for \
functional testing without a NIC, SoftRoCE on a kernel with rdma_rxe: \
`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <netdev>`; `ibv_devices` lists \
what the system sees";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("no RDMA device found; {HOW_TO_GET_A_DEVICE}")]
    NoDevice,
    #[error("RDMA device {name:?} not found (available: {available})")]
    DeviceNotFound { name: String, available: String },
    #[error("no RDMA device has an active port; check `ibv_devinfo` and the link of the netdev under the device")]
    NoActivePort,
    #[error("ibv_get_device_list failed; is the ib_uverbs module loaded? {HOW_TO_GET_A_DEVICE}")]
    GetDeviceList(#[source] io::Error),
    #[error("ibv_open_device({device}) failed")]
    OpenDevice { device: String, source: io::Error },
    #[error("ibv_query_device failed")]
    QueryDevice(#[source] io::Error),
    #[error("ibv_query_port(port {port}) failed")]
    QueryPort { port: u8, source: io::Error },
    #[error("port {port} of {device} is {state}, not ACTIVE; check the link of its netdev (`ip link`) and `ibv_devinfo`")]
    PortNotActive {
        device: String,
        port: u8,
        state: &'static str,
    },
    #[error("ibv_query_gid(port {port}, index {index}) failed")]
    QueryGid {
        port: u8,
        index: u32,
        source: io::Error,
    },
    #[error("no usable GID on port {port}; give the netdev an address (e.g. an IPv6 link-local one) so the RoCE GID table fills")]
    NoGid { port: u8 },
    #[error("ibv_alloc_pd failed")]
    AllocPd(#[source] io::Error),
    #[error("ibv_create_cq({depth} entries) failed")]
    CreateCq { depth: u32, source: io::Error },
    #[error("creating the queue pair failed (send {max_send_wr} WRs, recv {max_recv_wr} WRs, inline {max_inline} B); the device may not support that many work requests or that much inline data")]
    CreateQp {
        max_send_wr: u32,
        max_recv_wr: u32,
        max_inline: u32,
        source: io::Error,
    },
    #[error("ibv_modify_qp {from}->{to} failed (attribute mask {mask:#x}); {hint}")]
    ModifyQp {
        from: &'static str,
        to: &'static str,
        mask: u32,
        hint: &'static str,
        source: io::Error,
    },
    #[error("ibv_reg_mr({len} bytes, access {access}) failed; {hint}")]
    RegMr {
        len: usize,
        access: String,
        hint: String,
        source: io::Error,
    },
    #[error("{need} more bytes must be locked for registration ({locked} already locked by this process) but the locked-memory limit (ulimit -l, RLIMIT_MEMLOCK) is {limit} bytes; raise it with `ulimit -l unlimited` (or a memlock line in /etc/security/limits.conf, or LimitMEMLOCK= for a systemd service)")]
    Memlock { need: u64, locked: u64, limit: u64 },
    #[error("mapping {len} bytes of memory failed; {hint}")]
    Map {
        len: usize,
        hint: String,
        source: io::Error,
    },
    #[error("ibv_post_send refused work request {wr_id} ({posted} before it in the same call were posted); the send queue may be full or the queue pair not in RTS")]
    PostSend {
        wr_id: u64,
        posted: usize,
        source: io::Error,
    },
    #[error("ibv_post_recv refused receive {wr_id} ({posted} before it in the same call were posted); the receive queue may be full")]
    PostRecv {
        wr_id: u64,
        posted: usize,
        source: io::Error,
    },
    #[error("{call} failed without naming the request it refused, so all {requests} request(s) of the call are taken as posted: the queue pair was moved to ERR so that each completes (flushed) before its memory is used again; the connection is over")]
    PostIndeterminate {
        call: &'static str,
        requests: usize,
        source: io::Error,
    },
    #[error("a completion names work request {wr_id}, which this queue never posted or already retired (outstanding: {retired}..{posted}); was the connection's queue pair posted to by other code?")]
    ForeignCompletion {
        wr_id: u64,
        retired: u64,
        posted: u64,
    },
    #[error("the next completion is for work request {got}, not {expected}: requests on one queue complete in order, so complete them in the order they were posted (that completion is kept for its own request)")]
    UnexpectedCompletion { expected: u64, got: u64 },
    #[error("ibv_poll_cq failed")]
    PollCq(#[source] io::Error),
    #[error(transparent)]
    Completion(#[from] WcError),
    #[error("{what} is full; poll completions (Connection::poll / reap) and retry")]
    Full { what: &'static str },
    /// The batch carries as many requests as one doorbell can: post it,
    /// then start another (and call `signal_next` again if the refused
    /// request was to be signaled: the refusal took the request).
    /// Nothing is wrong with the connection.
    #[error("the batch holds its {capacity} requests (batch_size); post it and start another")]
    BatchFull { capacity: usize },
    #[error("{range} is outside the memory region of {len} bytes")]
    OutOfRegion { range: String, len: usize },
    #[error("{len} bytes do not fit a slot of {limit} bytes (slot_size)")]
    TooLarge { len: usize, limit: usize },
    #[error("filling a send-ring slot failed")]
    SlotFill { source: io::Error },
    #[error("the connection is on RDMA device {got}, not {wanted}")]
    WrongDevice { wanted: String, got: String },
    #[error("cannot pin the worker thread to core {core}; check the CPU set this process may use (taskset -p, cgroup cpuset)")]
    Pin { core: usize },
    #[error("cannot start the worker thread")]
    WorkerSpawn { source: io::Error },
    #[error("the worker thread has stopped (see its error from Engine::shutdown)")]
    WorkerStopped,
    #[error("the worker thread panicked")]
    WorkerPanicked,
    #[error("rdma_cm: {op} failed")]
    Cm { op: &'static str, source: io::Error },
    #[error(
        "rdma_cm: {op} failed: got event {got} (status {status}) instead of {expected}; {hint}"
    )]
    CmEvent {
        op: &'static str,
        expected: &'static str,
        got: String,
        status: i32,
        hint: &'static str,
    },
    #[error("connection rejected by the peer{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Rejected { reason: Option<String> },
    #[error("the peer disconnected")]
    Disconnected,
    /// A request failed as the peer went away: a process that dies has its
    /// memory regions and QP torn down by its kernel while its disconnect
    /// is on the way, so what is in flight fails at its end first.
    #[error("the peer disconnected; a request in flight failed with it: {0}")]
    PeerLeft(WcError),
    #[error("{device} reported {event}: the port or device failed (check `ibv_devinfo` and the netdev's link); the connection is closed")]
    DeviceEvent { device: String, event: &'static str },
    #[error("the peer did not answer a heartbeat for {waited:?} (heartbeat_interval x heartbeat_misses); it is dead or unreachable, the connection is closed")]
    PeerUnresponsive { waited: Duration },
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        what: &'static str,
        waited: Duration,
    },
    #[error("out-of-band connection exchange: {op} failed")]
    Exchange { op: &'static str, source: io::Error },
    #[error("bad connection record from the peer: {0}")]
    BadRecord(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{what} is not a valid socket address: {detail}")]
    Address { what: String, detail: String },
}

/// What a program can do about an [`Error`]: its remedy, whatever verb
/// failed. [`Error::kind`] gives it; `match` on it instead of on a
/// message or an errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No usable RDMA device, port or GID: the machine needs fixing
    /// ([`HOW_TO_GET_A_DEVICE`]).
    NoDevice,
    /// The device or the OS refused a resource (memory, a registration,
    /// a queue, locked memory, a thread, a core): limits or sizes need
    /// changing.
    Resources,
    /// The configuration is invalid; nothing was set up.
    Config,
    /// This call was wrong for this connection (outside the region, too
    /// large, completions taken out of order, the wrong device, a caller's
    /// fill closure failed); the connection is unharmed.
    Misuse,
    /// A queue or ring had no room ([`Error::Full`]): poll completions,
    /// then retry.
    Full,
    /// The batch is full ([`Error::BatchFull`]): post it, then go on.
    BatchFull,
    /// A bounded wait ran out; what it waited for may still come: wait
    /// again (or give up), never post the same request again.
    Timeout,
    /// Setting the connection up failed (address, route, the peer's
    /// answer, the out-of-band exchange): connect again later.
    Connect,
    /// The peer refused the connection ([`Error::Rejected`], its reason
    /// says whether trying later helps).
    Rejected,
    /// The peer sent a malformed connection record.
    Protocol,
    /// The connection is over: a request failed, the peer left or stopped
    /// answering, the device went away. Connect anew.
    ConnectionLost,
    /// The engine's worker thread stopped or panicked.
    Worker,
}

impl Error {
    /// What a program can do about this error.
    pub fn kind(&self) -> ErrorKind {
        use Error as E;
        match self {
            E::NoDevice
            | E::DeviceNotFound { .. }
            | E::NoActivePort
            | E::GetDeviceList(_)
            | E::PortNotActive { .. }
            | E::NoGid { .. } => ErrorKind::NoDevice,
            E::OpenDevice { .. }
            | E::QueryDevice(_)
            | E::QueryPort { .. }
            | E::QueryGid { .. }
            | E::AllocPd(_)
            | E::CreateCq { .. }
            | E::CreateQp { .. }
            | E::ModifyQp { .. }
            | E::RegMr { .. }
            | E::Memlock { .. }
            | E::Map { .. }
            | E::PollCq(_)
            | E::Pin { .. }
            | E::WorkerSpawn { .. } => ErrorKind::Resources,
            E::Config(_) => ErrorKind::Config,
            E::OutOfRegion { .. }
            | E::TooLarge { .. }
            | E::SlotFill { .. }
            | E::UnexpectedCompletion { .. }
            | E::ForeignCompletion { .. }
            | E::WrongDevice { .. }
            | E::Address { .. } => ErrorKind::Misuse,
            E::Full { .. } => ErrorKind::Full,
            E::BatchFull { .. } => ErrorKind::BatchFull,
            E::Timeout { .. } => ErrorKind::Timeout,
            E::Cm { .. } | E::CmEvent { .. } | E::Exchange { .. } => ErrorKind::Connect,
            E::Rejected { .. } => ErrorKind::Rejected,
            E::BadRecord(_) => ErrorKind::Protocol,
            E::PostSend { .. }
            | E::PostRecv { .. }
            | E::PostIndeterminate { .. }
            | E::Completion(_)
            | E::Disconnected
            | E::PeerLeft(_)
            | E::DeviceEvent { .. }
            | E::PeerUnresponsive { .. } => ErrorKind::ConnectionLost,
            E::WorkerStopped | E::WorkerPanicked => ErrorKind::Worker,
        }
    }

    /// Whether the call posted nothing and may succeed if made again once
    /// completions were polled ([`ErrorKind::Full`]: reap, then call
    /// again — inside a [`Batch`](crate::Batch) post the batch first, and
    /// for lent regions [`reclaim`](crate::Connection::reclaim)).
    ///
    /// A [`ErrorKind::Timeout`] is not: the wait ended, not the request,
    /// which may still complete — wait again, never post it again.
    /// Everything else needs a change first.
    pub fn is_retryable(&self) -> bool {
        self.kind() == ErrorKind::Full
    }

    /// The work completion behind this error, if it is one.
    pub fn completion(&self) -> Option<&WcError> {
        match self {
            Error::Completion(wc) | Error::PeerLeft(wc) => Some(wc),
            _ => None,
        }
    }
}

/// The calling thread's last OS error: verbs report failure through `errno`.
pub(crate) fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

/// Verbs that return a positive errno value instead of setting `errno`.
pub(crate) fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_names_its_remedy_and_only_a_full_queue_is_a_retry() {
        let full = Error::Full {
            what: "the send queue",
        };
        assert_eq!(full.kind(), ErrorKind::Full);
        assert!(full.is_retryable());
        let batch = Error::BatchFull { capacity: 16 };
        assert_eq!(batch.kind(), ErrorKind::BatchFull);
        assert!(!batch.is_retryable(), "post the batch first");
        assert!(batch.to_string().contains("post it"), "{batch}");
        let timeout = Error::Timeout {
            what: "a completion",
            waited: Duration::from_secs(1),
        };
        assert!(!timeout.is_retryable(), "the request may still complete");
        assert_eq!(Error::NoDevice.kind(), ErrorKind::NoDevice);
        let lost = Error::Disconnected;
        assert_eq!(lost.kind(), ErrorKind::ConnectionLost);
        assert!(!lost.is_retryable());
        let config = Error::Config("cq_depth = 0".into());
        assert_eq!(config.kind(), ErrorKind::Config);
        assert!(!config.is_retryable());
    }

    #[test]
    fn no_device_says_how_to_get_one_with_the_system_s_own_tools() {
        let text = Error::NoDevice.to_string();
        // A user's project has none of this repository's scripts.
        assert!(!text.contains("scripts/"), "{text}");
        assert!(text.contains("modprobe rdma_rxe"), "{text}");
        assert!(text.contains("ibv_devices"), "{text}");
    }
}
