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
    /// A queue or ring has no room; nothing was posted. `remedy` says
    /// what makes room.
    #[error("{what} is full; {remedy}")]
    Full { what: &'static str, remedy: Remedy },
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
    /// A setting has a value it cannot take; nothing was set up.
    /// `key` is its name in a profile, `field` its path in
    /// [`EngineConfig`](crate::EngineConfig) (the same where they agree).
    #[error("{} = {value} {problem}", setting_name(key, field))]
    Setting {
        key: &'static str,
        field: &'static str,
        value: String,
        problem: String,
    },
    /// No profile has this name.
    #[error("no profile named {name:?}: the built-in ones are {builtin}{}; or give a path to a .toml file",
        dir.as_deref().map(|d| format!(", and none is in $PINPOLL_PROFILE_DIR ({})", d.display())).unwrap_or_default())]
    UnknownProfile {
        name: String,
        builtin: String,
        dir: Option<std::path::PathBuf>,
    },
    /// A profile file that cannot be read.
    #[error("cannot read profile {}", path.display())]
    ReadProfile {
        path: std::path::PathBuf,
        source: io::Error,
    },
    /// A profile's text is not valid TOML, or names a key no profile has,
    /// or gives a key a value of the wrong type.
    #[error("{}{message}", at.map(|(line, column)| format!("line {line}, column {column}: ")).unwrap_or_default())]
    ProfileSyntax {
        /// 1-based line and column, where the parser knows them.
        at: Option<(usize, usize)>,
        message: String,
    },
    /// An error in profile `profile` (a built-in's name or a path); the
    /// source says what.
    #[error("profile {profile}")]
    InProfile { profile: String, source: Box<Error> },
    /// A call that is wrong for the object it was made on; nothing was
    /// done and the object is unharmed.
    #[error(transparent)]
    Misuse(#[from] Misuse),
    /// An allocation the set-up needs failed.
    #[error("no memory for {what}")]
    OutOfMemory { what: String },
    /// The CPUs this thread may run on could not be read.
    #[error("sched_getaffinity failed")]
    Affinity(#[source] io::Error),
    #[error("{what} is not a valid socket address: {detail}")]
    Address { what: String, detail: String },
}

/// How an error names a setting: both names where they differ, so a
/// profile's author and a program's both find it.
fn setting_name(key: &str, field: &str) -> String {
    if key == field {
        key.to_owned()
    } else {
        format!("{key} (field {field})")
    }
}

/// A call wrong for the object it was made on ([`Error::Misuse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Misuse {
    /// A request completed on an endpoint other than the one it was
    /// posted on.
    #[error("the request was posted on another endpoint")]
    OtherEndpoint,
    /// The endpoint belongs to a `Connection`, which takes its
    /// completions.
    #[error("this endpoint's completions belong to its Connection")]
    CompletionsTaken,
    /// The NIC writes into this region (a READ's data, a receive), so it
    /// must be registered with `Access::LOCAL_WRITE`.
    #[error("{written_by} writes into the region: register it with LOCAL_WRITE")]
    NeedsLocalWrite { written_by: &'static str },
    /// Memory a peer may write is a `SharedRegion`, never a
    /// `MemoryRegion` (which safe code borrows).
    #[error(
        "memory a peer may write is a SharedRegion (Endpoint::register_shared), not a MemoryRegion"
    )]
    PeerWritableRegion,
    /// A raw work request id uses the two top bits pinpoll reserves.
    #[error("raw work request id {id:#x} uses the top two bits, which pinpoll reserves; use ids below 2^62")]
    ReservedId { id: u64 },
    /// More handshake data than fits the connection request.
    #[error("{len} bytes of handshake data; at most {max} fit {beside}")]
    HandshakeDataTooLong {
        len: usize,
        max: usize,
        beside: &'static str,
    },
    /// Handshake data travel in rdma_cm's private data, which a TCP
    /// set-up has no place for.
    #[error("handshake data travel in rdma_cm's private data: not over TCP")]
    HandshakeDataOverTcp,
}

/// What makes room again after [`Error::Full`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Remedy {
    /// Take completions (`Connection::poll` or `reap`, `Engine::poll` or
    /// `wait`), then make the call again.
    Poll,
    /// The refusal came inside a [`Batch`](crate::Batch), which holds the
    /// connection, so nothing can retire while it lives: post the batch
    /// (or drop it), take completions, then start another.
    PostBatch,
    /// Regions lent to requests come back only through
    /// [`Connection::reclaim`](crate::Connection::reclaim), once their
    /// requests retired: take completions, reclaim, then call again.
    Reclaim,
}

impl std::fmt::Display for Remedy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Remedy::Poll => "take completions (poll or reap) and call again",
            Remedy::PostBatch => {
                "post the batch (nothing retires while a batch holds the connection), take completions, then start another"
            }
            Remedy::Reclaim => {
                "take completions and give lent regions back with Connection::reclaim, then call again"
            }
        })
    }
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
    /// A queue or ring had no room ([`Error::Full`]): its
    /// [`Remedy`] says what makes room.
    Full,
    /// The batch is full ([`Error::BatchFull`]), or a queue filled while
    /// a batch held the connection: post it, then go on.
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
            | E::RegMr { .. }
            | E::Memlock { .. }
            | E::Map { .. }
            | E::Pin { .. }
            | E::OutOfMemory { .. }
            | E::Affinity(_)
            | E::WorkerSpawn { .. } => ErrorKind::Resources,
            E::Setting { .. }
            | E::UnknownProfile { .. }
            | E::ReadProfile { .. }
            | E::ProfileSyntax { .. } => ErrorKind::Config,
            E::InProfile { source, .. } => source.kind(),
            E::Misuse(_)
            | E::OutOfRegion { .. }
            | E::TooLarge { .. }
            | E::SlotFill { .. }
            | E::UnexpectedCompletion { .. }
            | E::ForeignCompletion { .. }
            | E::WrongDevice { .. }
            | E::Address { .. } => ErrorKind::Misuse,
            E::Full {
                remedy: Remedy::PostBatch,
                ..
            }
            | E::BatchFull { .. } => ErrorKind::BatchFull,
            E::Full { .. } => ErrorKind::Full,
            E::Timeout { .. } => ErrorKind::Timeout,
            // A transition refused at set-up mostly comes from the
            // peer's record or the path to it.
            E::ModifyQp { .. } | E::Cm { .. } | E::CmEvent { .. } | E::Exchange { .. } => {
                ErrorKind::Connect
            }
            // A provider refuses a post with ENOMEM when its queue is full
            // (the raw `Endpoint` posts beside no ledger of its own).
            E::PostSend { source, .. } | E::PostRecv { source, .. }
                if source.raw_os_error() == Some(libc::ENOMEM) =>
            {
                ErrorKind::Full
            }
            E::Rejected { .. } => ErrorKind::Rejected,
            E::BadRecord(_) => ErrorKind::Protocol,
            E::PostSend { .. }
            | E::PostRecv { .. }
            | E::PostIndeterminate { .. }
            | E::Completion(_)
            | E::PollCq(_)
            | E::Disconnected
            | E::PeerLeft(_)
            | E::DeviceEvent { .. }
            | E::PeerUnresponsive { .. } => ErrorKind::ConnectionLost,
            E::WorkerStopped | E::WorkerPanicked => ErrorKind::Worker,
        }
    }

    /// Whether the call posted nothing and will succeed if made again
    /// once completions were taken: [`Error::Full`] with
    /// [`Remedy::Poll`]. Not inside a [`Batch`](crate::Batch), where
    /// nothing retires until it is posted ([`Remedy::PostBatch`]), nor
    /// for lent regions ([`Remedy::Reclaim`]).
    ///
    /// A [`ErrorKind::Timeout`] is not: the wait ended, not the request,
    /// which may still complete — wait again, never post it again.
    /// Everything else needs a change first.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Full { remedy, .. } => *remedy == Remedy::Poll,
            Error::PostSend { .. } | Error::PostRecv { .. } => self.kind() == ErrorKind::Full,
            _ => false,
        }
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
            remedy: Remedy::Poll,
        };
        assert_eq!(full.kind(), ErrorKind::Full);
        assert!(full.is_retryable());
        // Inside a batch nothing retires: retrying there spins forever.
        let in_batch = Error::Full {
            what: "the send queue",
            remedy: Remedy::PostBatch,
        };
        assert_eq!(in_batch.kind(), ErrorKind::BatchFull);
        assert!(!in_batch.is_retryable());
        assert!(
            in_batch.to_string().contains("post the batch"),
            "{in_batch}"
        );
        let lent = Error::Full {
            what: "the lent regions",
            remedy: Remedy::Reclaim,
        };
        assert_eq!(lent.kind(), ErrorKind::Full);
        assert!(!lent.is_retryable(), "polling alone frees no lent region");
        assert!(lent.to_string().contains("reclaim"), "{lent}");
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
        let config = Error::Setting {
            key: "cq_depth",
            field: "qp.cq_depth",
            value: "0".into(),
            problem: "is out of range 1..=1048576".into(),
        };
        assert_eq!(config.kind(), ErrorKind::Config);
        assert!(!config.is_retryable());
        assert_eq!(
            config.to_string(),
            "cq_depth (field qp.cq_depth) = 0 is out of range 1..=1048576"
        );
        let in_profile = Error::InProfile {
            profile: "built-in latency".into(),
            source: Box::new(config),
        };
        assert_eq!(in_profile.kind(), ErrorKind::Config, "the source's kind");
        assert!(std::error::Error::source(&in_profile).is_some());
        let misuse = Error::from(Misuse::OtherEndpoint);
        assert_eq!(misuse.kind(), ErrorKind::Misuse);
        // A full provider queue under the raw Endpoint is back-pressure;
        // any other refused post ends the connection.
        let full = Error::PostSend {
            wr_id: 3,
            posted: 0,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        assert_eq!(full.kind(), ErrorKind::Full);
        assert!(full.is_retryable());
        let refused = Error::PostSend {
            wr_id: 3,
            posted: 0,
            source: io::Error::from_raw_os_error(libc::EINVAL),
        };
        assert_eq!(refused.kind(), ErrorKind::ConnectionLost);
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
