//! pinpoll: a zero-allocation, busy-poll RDMA engine over libibverbs and
//! librdmacm.
//!
//! The module tree is the architecture:
//! - `sys` (private) — the only module that calls into C or holds `unsafe`:
//!   RAII owners of verbs and CM objects, and the code that hands
//!   registered memory between the CPU and the NIC. What users need of it
//!   is re-exported here on purpose: [`memory`], [`device`], [`handoff`],
//!   [`alloc`].
//! - [`status`], [`config`], [`error`] — plain data: completion statuses,
//!   tunables and profiles, errors.
//! - [`gid`] — which GID to use on RoCE, read from sysfs.
//! - [`connect`] — two ways to a connected queue pair: rdma_cm, and an
//!   out-of-band TCP exchange of a [`connect::ConnectionRecord`].
//! - [`wire`] — how every fixed wire format (the connection records, the
//!   applications' headers) checks its magic, version and length.
//! - [`endpoint`] — a connected queue pair with its CQs, bounded waits, and
//!   stop-and-wait posting of whole [`MemoryRegion`]s.
//! - [`datapath`] — the fast path: rings, pre-built chains, selective
//!   signaling ([`Connection`], direct mode).
//! - [`worker`] — engine mode: a pinned busy-poll thread per queue pair
//!   ([`Engine`]).
//!
//! # Your first message
//!
//! Direct mode: the thread that owns the [`Connection`] posts and polls —
//! the lowest latency.
//!
//! ```no_run
//! use pinpoll::{connect::parse_socket_addr, Connection, EngineConfig};
//!
//! let cfg = EngineConfig::load("latency")?;
//! let mut conn = Connection::connect(parse_socket_addr("169.254.0.1", 7471)?, &cfg)?;
//! conn.send(b"hello")?;            // inline: no copy, one doorbell
//! let reply = conn.recv()?;        // spins, bounded by cfg.completion_timeout
//! println!("{}", String::from_utf8_lossy(reply.data));
//! # Ok::<(), pinpoll::Error>(())
//! ```
//!
//! Three ways to post, from the leanest: `try_send`/`try_write`/`try_read`
//! post one request now or refuse with [`Error::Full`] (reap, then retry);
//! `send`/`write`/`read` wait for room (bounded); [`Connection::batch`]
//! gathers up to `batch_size` requests for one doorbell. `try_recv` polls
//! for a message once; `recv` waits for one.
//!
//! Engine mode: a worker thread, pinned to `cfg.core`, owns the connection;
//! any one application thread hands it work through lock-free queues.
//!
//! ```no_run
//! use pinpoll::{connect::parse_socket_addr, Connection, Engine, EngineConfig, EngineEvent};
//!
//! let mut cfg = EngineConfig::load("latency")?;
//! cfg.core = Some(1);
//! let conn = Connection::connect(parse_socket_addr("169.254.0.1", 7471)?, &cfg)?;
//! let mut engine = Engine::spawn(conn, &cfg)?;
//! engine.try_send(b"hello")?;
//! if let EngineEvent::Received { data } = engine.wait()? {
//!     println!("{}", String::from_utf8_lossy(data));
//! }
//! engine.shutdown()?;               // drains in-flight work, joins the worker
//! # Ok::<(), pinpoll::Error>(())
//! ```
//!
//! The server side is [`Connection::accept`] on a
//! [`connect::cm::Listener`]; [`Connection::over_tcp`] connects without
//! rdma_cm. `engine/examples/first_message.rs` runs both modes end to end;
//! `echo_server.rs` and `echo_client.rs` are two programs over the TCP
//! set-up.
//!
//! # Errors
//!
//! [`Error::kind`] says what a program can do ([`ErrorKind`]);
//! [`Error::is_retryable`] says whether the same call may simply be made
//! again once completions were taken (a full queue, [`Remedy::Poll`]).
//!
//! # Features
//!
//! Both on by default; without them the crate is direct mode alone.
//! - `profiles` — [`EngineConfig::load`] / [`EngineConfig::from_toml`] and
//!   the built-in profiles (brings `serde` and `toml`).
//! - `engine` — engine mode: [`Engine`], its pinned worker and the
//!   `handoff` rings (brings `rtrb`, `crossbeam`, `core_affinity`).
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]
#![deny(missing_docs)]
// The docs are written for the full crate (docs.rs builds it with every
// feature); without a feature, links to what it gates have no target.
#![cfg_attr(
    not(all(feature = "profiles", feature = "engine")),
    allow(rustdoc::broken_intra_doc_links)
)]

pub mod config;
pub mod connect;
pub mod datapath;
pub mod device;
pub mod endpoint;
pub mod error;
pub mod gid;
#[cfg(feature = "engine")]
pub mod handoff;
pub mod memory;
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "issue 25's poller is built from it; only its tests use it yet"
    )
)]
mod pool;
pub mod status;
mod sys;
mod wait;
pub mod wire;
#[cfg(feature = "engine")]
pub mod worker;

/// A counting global allocator, for proving that a data path never
/// allocates (see `engine/tests/zero_alloc.rs`).
pub mod alloc {
    pub use crate::sys::alloc::CountingAllocator;
}

pub use config::{EngineConfig, IdlePolicy, QpConfig};
pub use datapath::{Batch, Connection, ConnectionBuilder, Event, Incoming, Stats, TargetMut};
pub use endpoint::{Completed, Endpoint, WorkDone};
pub use error::{Error, ErrorKind, Misuse, Remedy, Result};
pub use memory::{
    Access, CompleteError, MemoryRegion, PageSize, Posted, RegionOp, RegionRefused, RemoteSlice,
    SharedRegion,
};
pub use status::{WcError, WcOpcode, WcStatus};
/// What [`Endpoint::state`] reports.
pub use sys::qp::QpState;
#[cfg(feature = "engine")]
pub use worker::{Engine, EngineEvent, WorkerReport};

#[cfg(test)]
mod tests {
    /// Each handle moves to another thread (the worker takes a
    /// `Connection`; an application thread may own the `Engine`); the
    /// hand-off halves and the listener too.
    #[test]
    #[cfg(feature = "engine")]
    fn handles_that_cross_threads_are_send() {
        fn send<T: Send>() {}
        send::<crate::Connection>();
        send::<crate::Engine>();
        send::<crate::Endpoint>();
        send::<crate::MemoryRegion>();
        send::<crate::handoff::SlotWriter>();
        send::<crate::handoff::SlotReader>();
        send::<crate::connect::cm::Listener>();
    }
}
