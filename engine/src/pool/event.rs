//! What a poller hands its caller about one of its connections.

use super::ending::Proof;
use crate::datapath::{Event, Stats};
use crate::status::WcError;

/// Something that happened on one connection of a poller, lent to the
/// callback of [`Poller::poll`](super::poller::Poller::poll).
#[derive(Debug)]
pub(crate) enum PoolEvent<'a> {
    /// An accepted rdma_cm connection is established (a join over TCP
    /// returns established: it sends none).
    Joined,
    /// What a [`Connection`](crate::Connection) reports, on this one.
    Conn(Event<'a>),
    /// The connection ended (the poller decided it: a failure, or a
    /// [`close`](super::poller::Poller::close) that finished). Its id is
    /// stale from now on; nothing of it is handed on but
    /// [`PoolEvent::Closed`]. An [`abort`](super::poller::Poller::abort),
    /// the caller's own decision, ends at once and sends no `Ended`.
    Ended(EndCause),
    /// The ended connection's queue pair is destroyed and its rings are
    /// freed: its last event.
    Closed {
        /// Its counts, final.
        stats: Stats,
        /// What was proven before its queue pair was destroyed.
        proof: Proof,
    },
}

/// Why a connection of a poller ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndCause {
    /// [`close`](super::poller::Poller::close): everything it had posted
    /// completed first (delivered to the peer's NIC).
    Closed,
    /// A `close` whose requests did not all complete within the
    /// completion timeout: what was still queued may not have reached
    /// the peer.
    CloseTimedOut,
    /// [`abort`](super::poller::Poller::abort).
    Aborted,
    /// A request or receive of it failed (the first failure); its queue
    /// pair is in ERR.
    Failed(WcError),
    /// A post failed without naming the refused request (the queue pair
    /// was moved to ERR so that every request it holds flushes).
    PostIndeterminate,
    /// rdma_cm says the peer disconnected (or the device went).
    Disconnected,
    /// An accepted connection's handshake failed (the client rejected
    /// the reply, or it never came through).
    HandshakeFailed,
    /// An accepted connection was not established within the connect
    /// timeout: a client that stalls its handshake holds nothing longer.
    HandshakeTimedOut,
}
