//! What a connection reports: events lent to a callback, a received
//! message, and counters.

use crate::status::{WcError, WcOpcode};

/// Counters of everything that completed, for accounting and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Send-queue work requests posted.
    pub posted: u64,
    /// Retired successfully (signaled or covered by a later signal).
    pub completed: u64,
    /// Completed with an error other than a flush (at most one per QP).
    pub failed: u64,
    /// Flushed after the failure.
    pub flushed: u64,
    /// The caller's requests (not the engine's own markers and
    /// heartbeats) among `failed` and `flushed`: never delivered.
    pub undelivered: u64,
    /// Messages and immediates received.
    pub received: u64,
    /// Receives flushed after the failure.
    pub recv_flushed: u64,
    /// Doorbells rung (ibv_post_send calls).
    pub doorbells: u64,
    /// Turns of this connection's own busy-waits (`recv`, send-queue
    /// room, `wait_retired`, `wait_idle`, the drains of `close`) that found
    /// nothing: how long the waits lasted, in
    /// polls. Timing, not work — reported so that a measurement can take
    /// the waiting out of a count of instructions exactly.
    pub wait_turns: u64,
}

/// Something that happened on the connection, lent to a callback.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A SEND arrived; `data` lives in the receive ring until the callback returns.
    Received {
        /// The message's bytes, in its receive slot.
        data: &'a [u8],
    },
    /// A WRITE_WITH_IMM arrived: `len` bytes landed in the target ring.
    WriteImm {
        /// The immediate value, in host order.
        imm: u32,
        /// Bytes the peer's WRITE put into this side's target ring.
        len: u32,
    },
    /// A signaled request completed (and every request before it).
    Completed {
        /// The request's sequence number, as its post returned it.
        seq: u64,
        /// What it was: `SEND`, or `RDMA_WRITE` (with or without an
        /// immediate); a READ reports [`Event::ReadCompleted`] instead.
        opcode: WcOpcode,
    },
    /// A READ completed with `data`.
    ReadCompleted {
        /// The READ's sequence number, as its post returned it.
        seq: u64,
        /// The bytes read, in the READ ring's slot, lent until the callback
        /// returns.
        data: &'a [u8],
    },
    /// The first error on this connection; the QP is now in error.
    Failed(WcError),
    /// A send request flushed because of the earlier failure.
    Flushed {
        /// The request's sequence number, as its post returned it.
        seq: u64,
        /// What the request was, as posted (`SEND`, `RDMA_WRITE`,
        /// `RDMA_READ`).
        opcode: Option<WcOpcode>,
    },
    /// A posted receive flushed because of the earlier failure.
    RecvFlushed,
}

/// A message or immediate taken by [`crate::Connection::recv`]; its
/// receive slot is posted again only after this borrow ends.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// The SEND's payload (empty for WRITE_WITH_IMM).
    pub data: &'a [u8],
    /// The immediate of a WRITE_WITH_IMM.
    pub imm: Option<u32>,
    /// Bytes transferred (for WRITE_WITH_IMM: bytes written to the target ring).
    pub len: u32,
}
