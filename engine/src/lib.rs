//! pinpoll: a zero-allocation, busy-poll RDMA engine over libibverbs and
//! librdmacm.
//!
//! The module tree is the architecture:
//! - [`sys`] — the only module that calls into C: RAII owners of verbs and
//!   CM objects, each such block with its `// SAFETY:` reason.
//! - [`completion`], [`config`], [`error`] — plain data: statuses, tunables, errors.
//! - [`gid`] — which GID to use on RoCE, read from sysfs.
//! - [`connect`] — two ways to a connected queue pair: rdma_cm, and an
//!   out-of-band TCP exchange of a [`connect::ConnectionRecord`].
//! - [`endpoint`] — a connected queue pair with its CQs, and bounded waits.
//! - [`datapath`] — the fast path: rings, pre-built chains, selective
//!   signaling ([`Connection`], direct mode).
//! - [`worker`] — engine mode: a pinned busy-poll thread per queue pair
//!   ([`Engine`]).
//! - [`profile`] — every tunable in [`EngineConfig`], loadable from TOML.
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
//! use pinpoll::{connect::parse_socket_addr, Completion, Connection, Engine, EngineConfig};
//!
//! let mut cfg = EngineConfig::load("latency")?;
//! cfg.core = Some(1);
//! let conn = Connection::connect(parse_socket_addr("169.254.0.1", 7471)?, &cfg)?;
//! let mut engine = Engine::spawn(conn, &cfg)?;
//! engine.send(b"hello")?;
//! if let Completion::Received { data } = engine.wait()? {
//!     println!("{}", String::from_utf8_lossy(data));
//! }
//! engine.shutdown()?;               // drains in-flight work, joins the worker
//! # Ok::<(), pinpoll::Error>(())
//! ```
//!
//! The server side is [`Connection::accept`] on a
//! [`connect::cm::Listener`]; [`Connection::over_tcp`] connects without
//! rdma_cm. `engine/examples/first_message.rs` runs both modes end to end.
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod completion;
pub mod config;
pub mod connect;
pub mod datapath;
pub mod endpoint;
pub mod error;
pub mod gid;
pub mod profile;
pub mod sys;
mod wait;
pub mod worker;

pub use completion::{WcError, WcOpcode, WcStatus};
pub use config::QpConfig;
pub use datapath::{Batch, Connection, Event};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use profile::{EngineConfig, IdlePolicy};
pub use sys::mem::{Buffer, PageSize};
pub use sys::mr::{Access, LocalSlice, MemoryRegion, RemoteSlice};
pub use sys::qp::SendFlags;
pub use worker::{Completion, Engine, WorkerReport};
