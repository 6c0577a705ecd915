//! The fast path, direct mode: the thread that owns a [`Connection`]
//! posts and polls, with no heap allocation, lock or system call per
//! operation.
//!
//! One operation's path runs through three files: `post` here (the
//! public `try_*` calls, and the waiting ones around them), then
//! `sys::send_queue`, which admits the request in the pure `sys::ledger`,
//! stages its payload (inline, or in a send-ring slot the ledger hands
//! it) and builds it with `sys::wr` for one doorbell. Completions come
//! back through `poll` (send queue) and `receive` (receive queue).
//!
//! The rest, by concern: `builder` (the rings and the ways to
//! connect), `batch` (several requests, one doorbell), `liveness`
//! (heartbeats, peer checks, what a failure is reported as), `close`
//! (draining at the end), `event` (what is reported).

mod batch;
mod builder;
mod close;
#[cfg(test)]
pub(crate) mod device_tests;
mod event;
mod liveness;
mod poll;
mod post;
mod receive;

use std::time::Duration;

pub use batch::Batch;
pub(crate) use builder::Rings;
pub use builder::{ConnectionBuilder, MAX_PRIVATE_DATA};
pub use event::{Event, Incoming, Stats};
pub(crate) use poll::Verdict;

use crate::config::EngineConfig;
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::status::WcError;
use crate::sys::mr::RemoteSlice;
use crate::sys::recv_queue::RecvQueue;
use crate::sys::region::{MemoryRegion, SharedRegion};
use crate::sys::send_queue::SendQueue;
use liveness::Heartbeat;

/// A connected queue pair with its rings, pre-built chains and accounting.
/// The owning thread posts and polls; nothing here allocates after
/// construction.
#[derive(Debug)]
pub struct Connection {
    // Field order is drop order: the QP (in the endpoint) goes first, so
    // the NIC is done with the rings before they are deregistered.
    ep: Endpoint,
    sq: SendQueue,
    rq: RecvQueue,
    /// The peer RDMA-writes (and reads) here; its descriptor went to the peer.
    target: SharedRegion,
    /// The peer's target ring.
    peer: RemoteSlice,
    completion_timeout: Duration,
    failure: Option<WcError>,
    /// A send completion named an error (see `poll.rs`'s `Verdict`).
    send_failed: bool,
    /// The connection is ending (close, or an end the worker saw):
    /// flushes are then expected, not failures, and nothing more is
    /// posted but the markers that retire what is in flight.
    closing: bool,
    /// `end` ran (close, abort, drop): a second call does nothing.
    ended: bool,
    /// A failure already waited (once per connection) for the event that
    /// names the connection's end.
    end_awaited: bool,
    heartbeat: Heartbeat,
    stats: Stats,
    /// Names the connection (device, queue pair) in what the engine logs
    /// about it; entered on the slow paths and by the worker.
    span: tracing::Span,
}

/// A connection's target ring, writable: [`copy_from`](TargetMut::copy_from)
/// changes its bytes; everything else of [`SharedRegion`] reads through.
/// It is not a `&mut SharedRegion`, so the ring cannot be swapped out (by
/// `mem::replace`) and dropped while the peer may still write it:
///
/// ```compile_fail
/// fn swap(conn: &mut pinpoll::Connection, other: pinpoll::SharedRegion) -> pinpoll::SharedRegion {
///     std::mem::replace(conn.target_mut(), other)
/// }
/// ```
#[derive(Debug)]
pub struct TargetMut<'c> {
    ring: &'c mut SharedRegion,
}

impl TargetMut<'_> {
    /// Copies `src` to `offset` of the ring (see [`SharedRegion::copy_from`]).
    #[inline]
    pub fn copy_from(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.ring.copy_from(offset, src)
    }
}

impl std::ops::Deref for TargetMut<'_> {
    type Target = SharedRegion;

    fn deref(&self) -> &SharedRegion {
        self.ring
    }
}

impl Connection {
    /// Builds the fast path over a connected endpoint whose rings were
    /// prepared before connecting. `peer` is the peer's target ring.
    pub(crate) fn new(
        ep: Endpoint,
        rings: Rings,
        peer: RemoteSlice,
        cfg: &EngineConfig,
    ) -> Connection {
        let Rings { sq, rq, target } = rings;
        // At error level so that it is on whenever the engine's warnings
        // are: an info span is filtered out under a `warn` filter, and the
        // warnings would lose the connection's name.
        let span = tracing::error_span!("connection", device = ep.device_name(), qp = ep.qp_num());
        Connection {
            ep,
            sq,
            rq,
            target,
            peer,
            completion_timeout: cfg.completion_timeout,
            failure: None,
            send_failed: false,
            closing: false,
            ended: false,
            end_awaited: false,
            heartbeat: Heartbeat::new(cfg),
            stats: Stats::default(),
            span,
        }
    }

    /// The span that names this connection in the engine's logs, to enter
    /// around an application's own events about it.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The connection's queue pair, for queries (device, state, why it ended).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// A copy of the connection's counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            posted: self.sq.ledger().committed(),
            ..self.stats
        }
    }

    /// The first error completion, once one happened.
    pub fn failure(&self) -> Option<&WcError> {
        self.failure.as_ref()
    }

    /// Changes the bound on every completion wait.
    pub fn set_completion_timeout(&mut self, timeout: Duration) {
        self.completion_timeout = timeout;
    }

    /// Largest payload that is posted inline.
    pub fn inline_threshold(&self) -> usize {
        self.sq.inline_threshold()
    }

    /// Bytes per ring slot: the largest single operation.
    pub fn slot_size(&self) -> usize {
        self.sq.layout().size()
    }

    /// Slots per ring. Send-ring slots are claimed in order, so after this
    /// many [`Batch::write_from`] calls every slot has been filled once.
    pub fn slot_count(&self) -> usize {
        self.sq.layout().count()
    }

    /// The peer's target ring.
    pub fn peer_ring(&self) -> RemoteSlice {
        self.peer
    }

    /// What the peer sent after its ring's descriptor in the rdma_cm
    /// handshake ([`ConnectionBuilder::private_data`]), zero-padded.
    pub fn peer_data(&self) -> &[u8] {
        self.ep
            .peer_private_data()
            .get(crate::connect::RegionDescriptor::LEN..)
            .unwrap_or(&[])
    }

    /// This side's target ring, which the peer writes into: read it by
    /// copying ([`SharedRegion::copy_to`]) once the peer said (by message
    /// or immediate) that the bytes are there.
    pub fn target(&self) -> &SharedRegion {
        &self.target
    }

    /// This side's target ring, to publish data the peer will RDMA READ:
    /// its bytes can change through the view, the ring itself cannot (the
    /// peer was told its address and key, and may write it at any time).
    pub fn target_mut(&mut self) -> TargetMut<'_> {
        TargetMut {
            ring: &mut self.target,
        }
    }

    /// Byte `offset` of this side's target ring, loaded from memory on
    /// every call: spin on it to see a peer's RDMA WRITE land (the last
    /// byte of a write arrives last on RC).
    #[inline]
    pub fn target_byte(&self, offset: usize) -> u8 {
        self.target.load_byte(offset)
    }

    #[cfg(feature = "engine")]
    /// The most requests this connection has outstanding at once.
    pub(crate) fn send_queue_depth(&self) -> usize {
        self.sq.ledger().depth() as usize
    }

    #[cfg(feature = "engine")]
    /// The most requests one of this connection's batches can carry.
    pub(crate) fn batch_capacity(&self) -> usize {
        self.sq.batch_capacity()
    }

    /// Send-queue requests admitted and not yet retired.
    #[inline]
    pub fn outstanding(&self) -> u64 {
        self.sq.ledger().in_flight()
    }

    /// The oldest region lent by [`Batch::write_region`] whose request
    /// has retired (or never went), in lending order; `None` while the
    /// oldest is still the NIC's. Requests retire as completions are
    /// polled ([`reap`](Connection::reap), [`poll`](Connection::poll)).
    #[inline]
    pub fn reclaim(&mut self) -> Option<MemoryRegion> {
        self.sq.reclaim()
    }

    /// Regions lent by [`Batch::write_region`] and not yet reclaimed.
    #[inline]
    pub fn lent_regions(&self) -> usize {
        self.sq.lent()
    }

    /// Whether request `seq` has retired (successfully or not).
    #[inline]
    pub fn is_retired(&self, seq: u64) -> bool {
        seq < self.sq.ledger().retired()
    }

    /// The first failure as an error, for refusing new work: named as the
    /// connection's end (the peer left, the device went) when that is what
    /// it was, as every other report of it is.
    #[cold]
    #[inline(never)]
    fn failed(&mut self) -> crate::Error {
        let failure = self.failure.expect("called after a failure");
        self.completion_error(failure)
    }

    /// Fails with the connection's first failure, if it has one.
    #[inline(always)]
    fn check_failure(&mut self) -> Result<()> {
        match self.failure {
            None => Ok(()),
            Some(_) => Err(self.failed()),
        }
    }
}
