//! Shared code of the pinpoll example programs, the classic RDMA teaching
//! examples done right:
//!
//! - `basic`: two peers connect over rdma_cm and swap a text message with
//!   SEND/RECV (each receive posted before the connection exists).
//! - `readwrite`: the peers swap memory-region descriptors with SEND/RECV,
//!   then the client RDMA-WRITEs into, or RDMA-READs from, the server's
//!   region, which is registered with exactly the access that mode needs.
//! - `filexfer`: file transfer over the engine's fast path, verified end
//!   to end, with a classic SEND/RECV + READ mode.
//!
//! The modules:
//! - [`cli`] — common flags and their parsers.
//! - [`output`] — stdout: progress lines (`-q` hides them), and received
//!   bytes printed safely.
//! - [`session`] — connecting a client, the server's accept loop
//!   ([`session::Accepting`], shared by every server), waits on
//!   completions that check what completed.
//! - [`shutdown`] — SIGINT/SIGTERM as a flag the server loop polls.
//! - [`protocol`] — `readwrite`'s wire formats: the connect header and the
//!   "done" message (on [`pinpoll::wire`]).
//! - [`filexfer`] — the `filexfer` program: its protocol, client, server,
//!   hashing and file handling.
//! - [`appkit`] (pinpoll-appkit, re-exported) and [`run`] — what every
//!   pinpoll program shares: `main`'s shape (one `error: ...` line, exit
//!   status 2 for bad usage), logging, core pinning.
#![forbid(unsafe_code)]

pub mod cli;
pub mod filexfer;
pub mod output;
pub mod protocol;
pub mod session;
pub mod shutdown;

pub use pinpoll_appkit as appkit;
/// `main`'s shape, shared with every pinpoll program.
pub use pinpoll_appkit::run;
