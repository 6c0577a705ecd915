//! One error type for the whole engine: one variant per failing verb, each
//! carrying the `io::Error` the verb reported, plus a hint where the cause is
//! usually not the code but the machine (memlock, a missing device, ...).

use std::io;
use std::time::Duration;

use crate::status::WcError;

/// The engine's result type: [`Error`] unless a call says otherwise (a
/// post that gives its region back on refusal returns
/// [`RegionRefused`](crate::RegionRefused) instead).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to get an RDMA device on a machine that has none: commands of the
/// system's own tools, nothing of this repository's.
pub const HOW_TO_GET_A_DEVICE: &str = "load the NIC's RDMA driver (e.g. `modprobe mlx5_ib`) \
and rdma-core's user-space providers (package `ibverbs-providers` or `rdma-core`); for \
functional testing without a NIC, SoftRoCE on a kernel with rdma_rxe: \
`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <netdev>`; `ibv_devices` lists \
what the system sees";

/// Everything that can go wrong in the engine. [`Error::kind`] sorts the
/// variants by what a program can do about them; each message names what
/// failed and, where the cause is usually the same, what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// There is no RDMA device at all: the device list is empty, the
    /// kernel has no uverbs (ENOSYS), or rdma_cm finds no device when
    /// creating its event channel. The message says how to get one.
    #[error("no RDMA device found; {HOW_TO_GET_A_DEVICE}")]
    NoDevice,
    /// No device has the name that was asked for.
    #[error("RDMA device {name:?} not found (available: {available})")]
    DeviceNotFound {
        /// The device name asked for.
        name: String,
        /// The names of the devices there are, comma-separated.
        available: String,
    },
    /// No device was named, and no device's port 1 is active (the first
    /// device whose port 1 is active is the one opened).
    #[error("no RDMA device has port 1 active; check `ibv_devinfo` and the link of the netdev under the device")]
    NoActivePort,
    /// `ibv_get_device_list` failed, for another reason than a kernel
    /// without uverbs (which is [`Error::NoDevice`]).
    #[error("ibv_get_device_list failed; is the ib_uverbs module loaded? {HOW_TO_GET_A_DEVICE}")]
    GetDeviceList(#[source] io::Error),
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({device}) failed")]
    OpenDevice {
        /// The device's name.
        device: String,
        /// The OS error the call set.
        source: io::Error,
    },
    /// `ibv_query_device` failed; also how a failure to read the device's
    /// asynchronous events (polling their descriptor, or
    /// `ibv_get_async_event`) is reported.
    #[error("ibv_query_device failed")]
    QueryDevice(#[source] io::Error),
    /// `ibv_query_port` failed.
    #[error("ibv_query_port(port {port}) failed")]
    QueryPort {
        /// The port queried (1-based).
        port: u8,
        /// The error number the call returned.
        source: io::Error,
    },
    /// The port an endpoint would use (the configured one, or the one
    /// rdma_cm bound) is not ACTIVE: its link is down or not yet up.
    #[error("port {port} of {device} is {state}, not ACTIVE; check the link of its netdev (`ip link`) and `ibv_devinfo`")]
    PortNotActive {
        /// The device's name.
        device: String,
        /// The port (1-based).
        port: u8,
        /// The state it is in, by its verbs name (`DOWN`, `INIT`,
        /// `ARMED`, ...).
        state: &'static str,
    },
    /// `ibv_query_gid` failed (`Device::query_gid`; a GID table read
    /// skips the entries that fail).
    #[error("ibv_query_gid(port {port}, index {index}) failed")]
    QueryGid {
        /// The port queried (1-based).
        port: u8,
        /// The GID table index queried.
        index: u32,
        /// The OS error the call set.
        source: io::Error,
    },
    /// The port's GID table has no non-zero entry, so a RoCE queue pair
    /// has no address to route by.
    #[error("no usable GID on port {port}; give the netdev an address (e.g. an IPv6 link-local one) so the RoCE GID table fills")]
    NoGid {
        /// The port (1-based).
        port: u8,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd failed")]
    AllocPd(#[source] io::Error),
    /// `ibv_create_cq` failed, usually for more entries than the device
    /// allows (`max_cqe`).
    #[error("ibv_create_cq({depth} entries) failed")]
    CreateCq {
        /// The entries asked for (`cq_depth`).
        depth: u32,
        /// The OS error the call set.
        source: io::Error,
    },
    /// Creating the queue pair failed (`ibv_create_qp`, or `rdma_create_qp`
    /// on an rdma_cm id), usually because the device grants fewer work
    /// requests or less inline data than asked for.
    #[error("creating the queue pair failed (send {max_send_wr} WRs, recv {max_recv_wr} WRs, inline {max_inline} B); the device may not support that many work requests or that much inline data")]
    CreateQp {
        /// Send-queue depth asked for (`max_send_wr`).
        max_send_wr: u32,
        /// Receive-queue depth asked for (`max_recv_wr`).
        max_recv_wr: u32,
        /// Inline bytes asked for (`max_inline_data`).
        max_inline: u32,
        /// The OS error the call set.
        source: io::Error,
    },
    /// Creating a shared receive queue failed (`ibv_create_srq`): usually
    /// more receives than the device allows (`max_srq_wr`), or no shared
    /// receive queue left (`max_srq`).
    #[error("ibv_create_srq({max_wr} receives) failed; the device may allow fewer (max_srq_wr) or no more shared receive queues (max_srq): check `ibv_devinfo -v`")]
    CreateSrq {
        /// The receives asked for.
        max_wr: u32,
        /// The OS error the call set.
        source: io::Error,
    },
    /// Setting or reading a shared receive queue's attribute failed
    /// (`ibv_modify_srq`, `ibv_query_srq`).
    #[error("{call} on a shared receive queue failed ({what})")]
    SharedReceiveQueue {
        /// The verb that failed.
        call: &'static str,
        /// What it was to do.
        what: &'static str,
        /// The error it returned.
        source: io::Error,
    },
    /// A completion channel's verb failed (`ibv_create_comp_channel`,
    /// `ibv_req_notify_cq`, `ibv_get_cq_event`).
    #[error("{call} failed ({what})")]
    CompletionChannel {
        /// The verb that failed.
        call: &'static str,
        /// What it was to do.
        what: &'static str,
        /// The error it returned.
        source: io::Error,
    },
    /// `ibv_modify_qp` refused a state transition. A failed `ibv_query_qp`
    /// ([`Endpoint::state`](crate::Endpoint::state)) is reported as this
    /// too, with `from` and `to` both `"query"`.
    #[error("ibv_modify_qp {from}->{to} failed (attribute mask {mask:#x}); {hint}")]
    ModifyQp {
        /// The state the transition started from (`RESET`, `INIT`, `RTR`,
        /// or `any` for the move to ERR), or `query`.
        from: &'static str,
        /// The state it was to reach (`INIT`, `RTR`, `RTS`, `ERR`), or
        /// `query`.
        to: &'static str,
        /// The `ibv_qp_attr_mask` bits passed: which attributes the call
        /// carried.
        mask: u32,
        /// What usually makes this transition fail.
        hint: &'static str,
        /// The error number the call returned.
        source: io::Error,
    },
    /// `ibv_reg_mr` refused to register memory.
    #[error("ibv_reg_mr({len} bytes, access {access}) failed; {hint}")]
    RegMr {
        /// Bytes registered (at least 1: verbs refuse empty regions).
        len: usize,
        /// The access flags asked for, as text (`LOCAL_WRITE|REMOTE_WRITE`).
        access: String,
        /// What to check, judged from the error number: the locked-memory
        /// limit, the access flags, or the man page.
        hint: String,
        /// The OS error the call set.
        source: io::Error,
    },
    /// Registering would exceed the locked-memory limit
    /// (`RLIMIT_MEMLOCK`), counting what the process has pinned already.
    /// Checked before registering, because the kernel refuses with a bare
    /// ENOMEM; a process with CAP_IPC_LOCK is never refused.
    #[error("{need} more bytes must be locked for registration ({locked} already locked by this process) but the locked-memory limit (ulimit -l, RLIMIT_MEMLOCK) is {limit} bytes; raise it with `ulimit -l unlimited` (or a memlock line in /etc/security/limits.conf, or LimitMEMLOCK= for a systemd service)")]
    Memlock {
        /// Bytes the registration (or a connection's rings, all of them)
        /// would lock.
        need: u64,
        /// Bytes this process has pinned already (`VmPin` in
        /// `/proc/self/status`).
        locked: u64,
        /// The soft limit, in bytes.
        limit: u64,
    },
    /// Mapping memory for registration failed (`mmap`, or
    /// `madvise(MADV_DONTFORK)` on the new mapping), or the length asked
    /// for is more than one mapping can span.
    #[error("mapping {len} bytes of memory failed; {hint}")]
    Map {
        /// Bytes of the mapping (whole pages), or the length asked for
        /// when even that cannot be rounded up to pages.
        len: usize,
        /// Why, as far as the engine can tell: huge pages not reserved
        /// (and how to reserve them), memory or address space exhausted.
        hint: String,
        /// The OS error (ENOMEM for a length too large).
        source: io::Error,
    },
    /// `ibv_post_send` refused a request and said which: the requests
    /// before it in the same call were posted, it and those after it were
    /// not.
    #[error("ibv_post_send refused work request {wr_id} ({posted} before it in the same call were posted); the send queue may be full or the queue pair not in RTS")]
    PostSend {
        /// The refused request's `wr_id` as posted: a connection's
        /// sequence number, or for an [`Endpoint`](crate::Endpoint)'s
        /// posts an id with pinpoll's tag in its top bits.
        wr_id: u64,
        /// Requests of the same call before it, which were posted.
        posted: usize,
        /// The error number the call returned.
        source: io::Error,
    },
    /// `ibv_post_recv` refused a receive and said which: the receives
    /// before it in the same call were posted, it and those after it were
    /// not.
    #[error("ibv_post_recv refused receive {wr_id} ({posted} before it in the same call were posted); the receive queue may be full")]
    PostRecv {
        /// The refused receive's `wr_id` as posted: a connection's receive
        /// ring position, or for an [`Endpoint`](crate::Endpoint)'s posts
        /// an id with pinpoll's tag in its top bits.
        wr_id: u64,
        /// Receives of the same call before it, which were posted.
        posted: usize,
        /// The error number the call returned.
        source: io::Error,
    },
    /// A post failed without naming the request it refused (rdma-core's
    /// rxe does when its doorbell fails after queueing), so every request
    /// of the call may be queued: the queue pair was moved to ERR so that
    /// each completes, flushed, before its memory is used again. The
    /// connection is over.
    #[error("{call} failed without naming the request it refused, so all {requests} request(s) of the call are taken as posted: the queue pair was moved to ERR so that each completes (flushed) before its memory is used again; the connection is over")]
    PostIndeterminate {
        /// `ibv_post_send` or `ibv_post_recv`.
        call: &'static str,
        /// Requests in the call, all taken as posted.
        requests: usize,
        /// The error number the call returned.
        source: io::Error,
    },
    /// A post to a shared receive queue failed without naming the receive
    /// it refused, so every receive of the call is kept as posted. Unlike
    /// a queue pair, a shared receive queue has no error state that would
    /// flush them, so it takes no more receives: the ones posted still
    /// complete as messages arrive, and its connections must move to
    /// another shared receive queue for more.
    #[error("ibv_post_srq_recv failed without naming the receive it refused, so all {requests} receive(s) of the call are kept as posted; a shared receive queue has no error state to flush them, so it takes no more receives: its connections must move to another one")]
    SrqBroken {
        /// Receives in the failed call, all kept as posted.
        requests: usize,
        /// The error number the call returned.
        source: io::Error,
    },
    /// A completion on a connection's queue named a work request that the
    /// queue did not post or has retired already — another poster's, e.g.
    /// a raw request posted on the endpoint before the connection was
    /// built on it. It was passed over, after the completions polled with
    /// it were handled.
    #[error("a completion names work request {wr_id}, which this queue never posted or already retired (outstanding: {retired}..{posted}); was the connection's queue pair posted to by other code?")]
    ForeignCompletion {
        /// The `wr_id` the completion named.
        wr_id: u64,
        /// The queue's first outstanding id (every id below it is done).
        retired: u64,
        /// One past the queue's last posted id.
        posted: u64,
    },
    /// [`Endpoint::complete`](crate::Endpoint::complete): the next
    /// completion on the request's queue is another request's. That one
    /// is kept for its own request, and this request comes back in
    /// [`CompleteError::Pending`](crate::CompleteError::Pending).
    #[error("the next completion is for work request {got}, not {expected}: requests on one queue complete in order, so complete them in the order they were posted (that completion is kept for its own request)")]
    UnexpectedCompletion {
        /// The `wr_id` of the request being completed
        /// ([`Posted::wr_id`](crate::Posted::wr_id)).
        expected: u64,
        /// The `wr_id` the completion named.
        got: u64,
    },
    /// `ibv_poll_cq` returned an error.
    #[error("ibv_poll_cq failed")]
    PollCq(#[source] io::Error),
    /// A work request completed with an error status. The first such
    /// failure puts a reliable-connected queue pair in ERR, and a
    /// connection refuses new work with it from then on. When the failure
    /// is known to be the connection's end, that end is reported instead
    /// ([`Error::PeerLeft`], [`Error::Disconnected`], [`Error::DeviceEvent`]).
    #[error(transparent)]
    Completion(#[from] WcError),
    /// A queue or ring has no room; nothing was posted. `remedy` says
    /// what makes room.
    #[error("{what} is full; {remedy}")]
    Full {
        /// What is full: `the send queue`, `the send ring`, `the read
        /// ring`, `the lent regions`, or one of the engine's hand-off
        /// queues.
        what: &'static str,
        /// What makes room ([`Error::is_retryable`] when it is polling).
        remedy: Remedy,
    },
    /// A poller of many connections takes no more: `what` is at its
    /// `limit` (its connections, or the entries of the completion queue
    /// their send queues share, which must hold every one of their
    /// requests at once). Nothing was created; raise the limit in the
    /// poller's configuration, or end a connection first.
    #[error("the poller's {what} are all taken ({limit}); end a connection, or make the poller with a higher limit")]
    PoolFull {
        /// What is at its limit.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// The batch carries as many requests as one doorbell can: post it,
    /// then start another (and call `signal_next` again if the refused
    /// request was to be signaled: the refusal took the request).
    /// Nothing is wrong with the connection.
    #[error("the batch holds its {capacity} requests (batch_size); post it and start another")]
    BatchFull {
        /// Requests one batch carries (the connection's `batch_size`).
        capacity: usize,
    },
    /// A byte range outside the memory it addresses: a local region, or a
    /// remote range beyond what the peer advertised (its target ring, or a
    /// [`RemoteSlice`](crate::RemoteSlice)). A local range of more than
    /// `u32::MAX` bytes (one scatter/gather entry's most) is refused so too.
    #[error("{range} is outside the memory region of {len} bytes")]
    OutOfRegion {
        /// The range asked for, as text (`start..end`).
        range: String,
        /// Bytes of the region (of a remote one, as the peer advertised).
        len: usize,
    },
    /// A payload larger than one ring slot: the most a single operation
    /// of a [`Connection`](crate::Connection) or an
    /// [`Engine`](crate::Engine) moves.
    #[error("{len} bytes do not fit a slot of {limit} bytes (slot_size)")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// The slot size in bytes (`slot_size`).
        limit: usize,
    },
    /// The caller's closure that fills a send-ring slot (`send_from`,
    /// `write_from`, `try_write_from`) returned an error: nothing was
    /// posted.
    #[error("filling a send-ring slot failed")]
    SlotFill {
        /// The closure's error.
        source: io::Error,
    },
    /// [`ConnectionBuilder::device`](crate::ConnectionBuilder::device)
    /// named a device, and the connection came up on another (rdma_cm
    /// picks the device by the address).
    #[error("the connection is on RDMA device {got}, not {wanted}")]
    WrongDevice {
        /// The device asked for.
        wanted: String,
        /// The device the connection is on.
        got: String,
    },
    /// The worker thread could not be pinned to the configured core.
    #[error("cannot pin the worker thread to core {core}; check the CPU set this process may use (taskset -p, cgroup cpuset)")]
    Pin {
        /// The core asked for (`core`).
        core: usize,
    },
    /// The OS refused to start the worker thread.
    #[error("cannot start the worker thread")]
    WorkerSpawn {
        /// The error of `std::thread::Builder::spawn`.
        source: io::Error,
    },
    /// A callback given to `Connection::poll` panicked. While it was
    /// handed send completions: the completions that poll had taken were
    /// retired without their verdicts, so what they delivered (or that one
    /// of them failed) is unknown, and the connection takes no more
    /// requests. While it was handed receives: the receives that poll took
    /// after the panicking one were consumed unseen, and the connection
    /// hands on no more (a later message would hide the gap); `poll`,
    /// `recv` and `try_recv` return this error, while posts still go.
    /// Either way closing it says so.
    #[error("a callback of Connection::poll panicked: what that poll took was not all seen (the requests it retired got no verdict, or receives after the panic were consumed unseen); the connection is spent (after a panic among receives it may still send, but it hands on no message more): abort it and connect anew")]
    CallbackPanicked,
    /// The engine's worker thread has ended: it stopped on an error
    /// (which [`Engine::shutdown`](crate::Engine::shutdown) returns), or
    /// ended before it began to serve, or was joined already.
    #[error("the worker thread has stopped (see its error from Engine::shutdown)")]
    WorkerStopped,
    /// The worker thread panicked; joining it found out.
    #[error("the worker thread panicked")]
    WorkerPanicked,
    /// A librdmacm call failed.
    #[error("rdma_cm: {op} failed")]
    Cm {
        /// The call or step that failed (`rdma_resolve_addr`,
        /// `rdma_connect`, `poll on the event channel`, ...).
        op: &'static str,
        /// The OS error it reported.
        source: io::Error,
    },
    /// An rdma_cm step received another event than the one it waits for:
    /// an address or route error, an unreachable peer, a failed connect.
    #[error(
        "rdma_cm: {op} failed: got event {got} (status {status}) instead of {expected}; {hint}"
    )]
    CmEvent {
        /// The step that waited (`rdma_resolve_addr`,
        /// `rdma_resolve_route`, `rdma_connect`, `rdma_accept`).
        op: &'static str,
        /// The event it waited for, by librdmacm's name.
        expected: &'static str,
        /// The event that came instead, by librdmacm's name.
        got: String,
        /// That event's status, as librdmacm gave it (often a negative
        /// error number).
        status: i32,
        /// What that event usually means.
        hint: &'static str,
    },
    /// The peer refused the connection (rdma_cm's REJECTED event).
    #[error("connection rejected by the peer{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Rejected {
        /// The peer's reason: the reject's private data up to its first
        /// NUL, when that is non-empty UTF-8 text; otherwise the event's
        /// status and a guess (is anyone listening?).
        reason: Option<String>,
    },
    /// The connection ended: the peer disconnected (or this side did
    /// first), and the requests flushed by that end report it.
    #[error("the peer disconnected")]
    Disconnected,
    /// A request failed as the peer went away: a process that dies has its
    /// memory regions and QP torn down by its kernel while its disconnect
    /// is on the way, so what is in flight fails at its end first.
    /// The request's failure is the source.
    #[error("the peer disconnected; a request in flight failed with it")]
    PeerLeft(#[source] WcError),
    /// The device reported an event that ends the connection (a port
    /// error, a fatal device error, or an error of this queue pair or a
    /// CQ), or rdma_cm reported the device's removal. The queue pair was
    /// moved to ERR.
    #[error("{device} reported {event}: the port or device failed (check `ibv_devinfo` and the netdev's link); the connection is closed")]
    DeviceEvent {
        /// The device's name.
        device: String,
        /// The event's name: the verbs one (`PORT_ERR`, `DEVICE_FATAL`,
        /// `QP_FATAL`, ...) or librdmacm's for a device removal.
        event: &'static str,
    },
    /// A heartbeat stayed unanswered for `heartbeat_interval ×
    /// heartbeat_misses`; the connection was disconnected.
    #[error("the peer did not answer a heartbeat for {waited:?} (heartbeat_interval x heartbeat_misses); it is dead or unreachable, the connection is closed")]
    PeerUnresponsive {
        /// How long the heartbeat had been in flight.
        waited: Duration,
    },
    /// A bounded wait ran out (the completion timeout, the connect
    /// timeout, a drain); what it waited for may still come.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What the wait was for, e.g. `a message from the peer`.
        what: &'static str,
        /// How long the wait that ended it waited. For most waits that is
        /// their whole budget (for the out-of-band exchange, its connect
        /// timeout, which covers all its steps; `what` names the step it
        /// ended in); an rdma_cm step counts only its own wait, which may
        /// be short when earlier steps used most of a shared deadline.
        waited: Duration,
    },
    /// The TCP socket of the out-of-band exchange failed.
    #[error("out-of-band connection exchange: {op} failed")]
    Exchange {
        /// The step (`sending the connection record`, `waiting for the
        /// peer to be ready`, ...).
        op: &'static str,
        /// The socket's error.
        source: io::Error,
    },
    /// The peer's connection data are unusable though they decode: no
    /// target ring, or a wrong ready byte. The text says what was wrong.
    #[error("bad connection record from the peer: {0}")]
    BadRecord(String),
    /// A connection record or region descriptor from the peer that does
    /// not decode; the [`WireError`](crate::wire::WireError) (the source)
    /// names the field.
    #[error("bad connection record from the peer")]
    Wire(#[source] crate::wire::WireError),
    /// A setting has a value it cannot take; nothing was set up.
    /// `key` is its name in a profile, `field` its path in
    /// [`EngineConfig`](crate::EngineConfig) (the same where they agree).
    #[error("{} = {value} {problem}", setting_name(key, field))]
    Setting {
        /// The setting's profile key.
        key: &'static str,
        /// The setting's field in `EngineConfig`.
        field: &'static str,
        /// The value refused, as given.
        value: String,
        /// What is wrong with it and what is allowed.
        problem: String,
    },
    /// No profile has this name.
    #[error("no profile named {name:?}: the built-in ones are {builtin}{}; or give a path to a .toml file",
        dir.as_deref().map(|d| format!(", and none is in $PINPOLL_PROFILE_DIR ({})", d.display())).unwrap_or_default())]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The built-in profiles' names.
        builtin: String,
        /// `$PINPOLL_PROFILE_DIR`, where it is set.
        dir: Option<std::path::PathBuf>,
    },
    /// A profile file that cannot be read.
    #[error("cannot read profile {}", path.display())]
    ReadProfile {
        /// The profile's path.
        path: std::path::PathBuf,
        /// Why reading it failed.
        source: io::Error,
    },
    /// A profile's text is not valid TOML, or names a key no profile has,
    /// or gives a key a value of the wrong type.
    #[error("{}{message}", at.map(|(line, column)| format!("line {line}, column {column}: ")).unwrap_or_default())]
    ProfileSyntax {
        /// 1-based line and column, where the parser knows them.
        at: Option<(usize, usize)>,
        /// The parser's message.
        message: String,
    },
    /// An error in profile `profile` (a built-in's name or a path); the
    /// source says what.
    #[error("profile {profile}")]
    InProfile {
        /// `built-in NAME` or the file's path.
        profile: String,
        /// What is wrong in it.
        source: Box<Error>,
    },
    /// A call that is wrong for the object it was made on; nothing was
    /// done and the object is unharmed.
    #[error(transparent)]
    Misuse(#[from] Misuse),
    /// An allocation the set-up needs failed.
    #[error("no memory for {what}")]
    OutOfMemory {
        /// What the memory was for.
        what: String,
    },
    /// The CPUs this thread may run on could not be read.
    #[error("sched_getaffinity failed")]
    Affinity(#[source] io::Error),
    /// A host that [`parse_socket_addr`](crate::connect::parse_socket_addr)
    /// cannot use.
    #[error("{what} is not a valid socket address: {detail}")]
    Address {
        /// The host text given.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
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
    NeedsLocalWrite {
        /// What the NIC writes there: a READ's data or a receive.
        written_by: &'static str,
    },
    /// Memory a peer may write is a `SharedRegion`, never a
    /// `MemoryRegion` (which safe code borrows).
    #[error(
        "memory a peer may write is a SharedRegion (Endpoint::register_shared), not a MemoryRegion"
    )]
    PeerWritableRegion,
    /// A queue pair was to be made in one protection domain on
    /// completion queues of another device context, or on a shared
    /// receive queue of another protection domain or completing its
    /// receives on another completion queue than the one it was made for.
    #[error("a queue pair's completion queues and shared receive queue must be of its own device context and protection domain, and a queue pair on a shared receive queue must complete its receives on that queue's receive completion queue")]
    QueuesOfAnotherDomain,
    /// A queue was handed completions polled from another queue's
    /// completion queue, or asked to poll one: none of them is believed
    /// (an id of another queue's is no request of this one's). A bug in
    /// pinpoll, not in the program: no public call hands completions on.
    #[error("a queue was handed another completion queue's completions (none was believed); this is a bug in pinpoll: please report it")]
    OtherQueuesCompletions,
    /// A poller was asked for a connection that has ended: its id is
    /// stale (the slot may hold another connection now, which the id
    /// never reaches).
    #[error("the connection has ended: its id names no connection of the poller any more")]
    StaleConnection,
    /// A post on a connection of a poller that `close` was called on: it
    /// ends once what it had posted has completed, and takes nothing more.
    #[error("the connection is closing: nothing more can be posted on it")]
    ConnectionClosing,
    /// A raw work request id uses the two top bits pinpoll reserves.
    #[error("raw work request id {id:#x} uses the top two bits, which pinpoll reserves; use ids below 2^62")]
    ReservedId {
        /// The id given.
        id: u64,
    },
    /// More handshake data than fits the connection request.
    #[error("{len} bytes of handshake data; at most {max} fit {beside}")]
    HandshakeDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes that fit.
        max: usize,
        /// What they share the request with.
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
    /// requests retired. The refusal comes inside a batch: post or drop
    /// it, take completions, reclaim, then call again.
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
                "post or drop the batch, take completions and give lent regions back with Connection::reclaim, then call again"
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
    ///
    /// ```
    /// use pinpoll::{Error, ErrorKind};
    ///
    /// fn advice(err: &Error) -> &'static str {
    ///     match err.kind() {
    ///         ErrorKind::NoDevice => "no RDMA device: see pinpoll::error::HOW_TO_GET_A_DEVICE",
    ///         ErrorKind::Full if err.is_retryable() => "reap completions, then call again",
    ///         ErrorKind::BatchFull => "post the batch, then start another",
    ///         ErrorKind::Timeout => "wait again (never post the same request twice)",
    ///         ErrorKind::ConnectionLost => "connect anew",
    ///         _ => "fix what the message says",
    ///     }
    /// }
    /// assert_eq!(advice(&Error::NoDevice), "no RDMA device: see pinpoll::error::HOW_TO_GET_A_DEVICE");
    /// assert_eq!(advice(&Error::Disconnected), "connect anew");
    /// ```
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
            | E::CreateSrq { .. }
            | E::SharedReceiveQueue { .. }
            | E::CompletionChannel { .. }
            | E::RegMr { .. }
            | E::Memlock { .. }
            | E::Map { .. }
            | E::Pin { .. }
            | E::OutOfMemory { .. }
            | E::Affinity(_)
            | E::WorkerSpawn { .. }
            | E::PoolFull { .. } => ErrorKind::Resources,
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
            E::BadRecord(_) | E::Wire(_) => ErrorKind::Protocol,
            E::PostSend { .. }
            | E::PostRecv { .. }
            | E::PostIndeterminate { .. }
            | E::SrqBroken { .. }
            | E::Completion(_)
            | E::PollCq(_)
            | E::Disconnected
            | E::PeerLeft(_)
            | E::DeviceEvent { .. }
            | E::PeerUnresponsive { .. }
            | E::CallbackPanicked => ErrorKind::ConnectionLost,
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
            // Only when none of the call's requests went: a rebuilt retry
            // would post those twice.
            Error::PostSend { posted: 0, .. } | Error::PostRecv { posted: 0, .. } => {
                self.kind() == ErrorKind::Full
            }
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
        // Part of the call went: a retry of the whole would post it twice.
        let partly = Error::PostSend {
            wr_id: 3,
            posted: 2,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        assert_eq!(partly.kind(), ErrorKind::Full);
        assert!(!partly.is_retryable());
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
