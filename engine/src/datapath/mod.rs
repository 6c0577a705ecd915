//! The fast path: registered rings, pre-built work-request chains,
//! selective signaling and bounded completion polling, with no heap
//! allocation, lock or system call per operation.
//!
//! - [`Connection`]: direct mode — the calling thread posts and polls.
//! - [`crate::worker`]: engine mode — a pinned thread owns the connection.

mod connection;
pub mod ring;
pub mod sq;

pub use connection::{Batch, Connection, Event, Incoming, Rings, Stats};
