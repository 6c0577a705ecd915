//! Engine mode: one worker thread per queue pair, pinned to a core and
//! busy-polling. Application threads hand it operations through a bounded
//! lock-free queue (payload bytes through a single-producer ring of slots)
//! and get completions back the same way. A full queue is back-pressure
//! ([`Error::Full`]), never an allocation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rtrb::{Consumer, Producer, RingBuffer};

use crate::config::{EngineConfig, IdlePolicy};
use crate::datapath::{Connection, Event, Stats};
use crate::error::{Error, Remedy, Result};
use crate::status::{WcError, WcOpcode};
use crate::sys::cpu::current_affinity;
use crate::sys::handoff::{handoff_ring, SlotReader, SlotWriter};
use crate::sys::send_queue::POLL_BATCH;
use crate::wait::BoundedWait;

/// Empty polls between two checks (a system call) for an rdma_cm disconnect.
const PEER_CHECK_INTERVAL: u32 = 4096;

/// Payloads one poll may hand over through the rx ring: a message per
/// receive completion and a READ's data per send completion, each CQ
/// polled for at most [`POLL_BATCH`].
const PAYLOADS_PER_POLL: usize = 2 * POLL_BATCH;

#[derive(Debug, Clone, Copy)]
enum OpKind {
    Send,
    Write {
        remote_offset: u64,
        imm: Option<u32>,
    },
    Read {
        remote_offset: u64,
        len: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct Op {
    id: u64,
    kind: OpKind,
    signaled: bool,
}

/// An event as it crosses from the worker; payloads ride in the rx ring.
#[derive(Debug, Clone, Copy)]
enum Relayed {
    Received,
    WriteImm {
        imm: u32,
        len: u32,
    },
    Completed {
        id: u64,
        opcode: WcOpcode,
    },
    ReadCompleted {
        id: u64,
    },
    Failed(WcError),
    Flushed {
        id: u64,
    },
    RecvFlushed,
    /// The operation was never posted: the connection had already failed.
    Refused {
        id: u64,
    },
    /// The peer left or stopped answering heartbeats: the worker closed
    /// the connection.
    PeerLost,
}

/// What the worker hands back: the engine-mode counterpart of
/// [`Event`], its data borrowed from the engine until the next call to
/// [`Engine::poll`] or [`Engine::wait`].
#[derive(Debug)]
#[non_exhaustive]
pub enum EngineEvent<'a> {
    /// A SEND from the peer.
    Received {
        /// The message's bytes, copied into the engine's hand-off ring.
        data: &'a [u8],
    },
    /// A WRITE_WITH_IMM from the peer landed `len` bytes in the target ring.
    WriteImm {
        /// The immediate value, in host order.
        imm: u32,
        /// Bytes the peer's WRITE put into this side's target ring.
        len: u32,
    },
    /// Operation `id` (submitted signaled, or every K-th) completed, and
    /// every operation before it.
    Completed {
        /// The operation's id, as `try_send` or `try_write` returned it.
        id: u64,
        /// What it was: `SEND` or `RDMA_WRITE` (a READ reports
        /// [`EngineEvent::ReadCompleted`]).
        opcode: WcOpcode,
    },
    /// READ `id` completed with `data`.
    ReadCompleted {
        /// The READ's id, as [`Engine::try_read`] returned it.
        id: u64,
        /// The bytes read, copied into the engine's hand-off ring.
        data: &'a [u8],
    },
    /// The connection's first error; `wr_id` is the operation's id for a
    /// send-side request, the receive's ring position for a receive
    /// (`opcode` `RECV`), or [`WcError::INTERNAL`] for the engine's own.
    Failed(WcError),
    /// Operation `id` was flushed after the failure.
    Flushed {
        /// The flushed operation's id.
        id: u64,
    },
    /// A posted receive was flushed after the failure.
    RecvFlushed,
    /// Operation `id` was refused: the connection had already failed.
    Refused {
        /// The refused operation's id; it was never posted.
        id: u64,
    },
    /// The peer disconnected (or a device event ended the connection) or
    /// stopped answering heartbeats: the worker has stopped, after handing
    /// on everything that arrived or flushed before; operations still
    /// queued are never answered (nothing of the application's is posted
    /// once the worker knows of the end). Should what is in flight not
    /// retire within the completion timeout (a device that stopped
    /// producing completions), the worker ends the connection in place —
    /// itself bounded by the completion timeout, so about twice that in
    /// all — says `PeerLost` all the same, and [`Engine::shutdown`]
    /// returns [`Error::Timeout`]. A peer that dies without a word is
    /// usually seen first as a failed request ([`EngineEvent::Failed`],
    /// e.g. a heartbeat's RETRY_EXC_ERR), which is as final: the worker
    /// then refuses new operations until it is shut down.
    PeerLost,
}

/// What the worker did, returned when it is joined.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// The connection's counters when the worker stopped.
    pub stats: Stats,
    /// The CPUs the worker was allowed to run on, read inside it.
    pub affinity: Vec<usize>,
    /// The peer disconnected, and the worker ended once it had handed on
    /// everything that arrived or flushed ([`EngineEvent::PeerLost`]);
    /// otherwise it was shut down (also when the peer left while the
    /// shutdown drained).
    pub peer_left: bool,
}

/// The application's handle on a connection owned by a pinned worker.
/// `Send`, not `Sync`: one application thread submits and polls.
#[derive(Debug)]
pub struct Engine {
    ops: Producer<Op>,
    notes: Consumer<Relayed>,
    tx: SlotWriter,
    rx: SlotReader,
    rx_held: bool,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<WorkerReport>>>,
    affinity: Vec<usize>,
    next_id: u64,
    signal_next: bool,
    slot_size: usize,
    peer_len: u64,
    timeout: Duration,
}

impl Engine {
    /// Moves `conn` to a new worker thread, pinned to `cfg.core` when set,
    /// and returns once the worker runs (or failed to pin).
    ///
    /// From `cfg` the worker takes, and checks, its own settings (`core`,
    /// `handoff_depth`, `idle`, `completion_timeout`, heartbeats, and
    /// `batch_size` up to what the connection's batches carry); the queue
    /// depths are the connection's, whatever `cfg.qp` says, so operation
    /// ids never alias.
    pub fn spawn(conn: Connection, cfg: &EngineConfig) -> Result<Engine> {
        // Only what the worker takes from `cfg`: the connection was
        // checked against its own settings when it was built.
        cfg.validate_worker()?;
        let depth = cfg.handoff_depth as usize;
        let slots = depth.next_power_of_two();
        let slot_size = conn.slot_size();
        let (tx, tx_reader) = handoff_ring(slot_size, slots)?;
        let (rx_writer, rx) = handoff_ring(slot_size, slots)?;
        let (ops, ops_out) = RingBuffer::new(depth);
        // Room for every event one poll can make (see `collect`) even when
        // the whole send queue retires at once.
        // The connection's own depth, whatever `cfg` says: it decides how
        // many requests can be outstanding (and so the id map's size).
        let send_depth = conn.send_queue_depth();
        let batch_size = (cfg.batch_size as usize).clamp(1, conn.batch_capacity());
        let (notes_in, notes) = RingBuffer::new(depth.max(send_depth + POLL_BATCH));
        let stop = Arc::new(AtomicBool::new(false));
        let peer_len = conn.peer_ring().len;
        let worker = Worker {
            // A power of two at least the send-queue depth: an outstanding
            // request's sequence number maps to its entry with a mask.
            ids: vec![0; send_depth.next_power_of_two()].into_boxed_slice(),
            conn,
            ops: ops_out,
            notes: notes_in,
            tx: tx_reader,
            rx: rx_writer,
            stop: Arc::clone(&stop),
            pending: None,
            batch_size,
            idle: cfg.idle,
            drain_timeout: cfg.completion_timeout,
        };
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let core = cfg.core;
        let thread = std::thread::Builder::new()
            .name("pinpoll-worker".into())
            .spawn(move || match settle_in(core) {
                Ok(affinity) => {
                    let _ = started_tx.send(Ok(affinity.clone()));
                    worker.run(affinity)
                }
                // `spawn` returns it; nobody joins this thread.
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    Err(Error::WorkerStopped)
                }
            })
            .map_err(|source| Error::WorkerSpawn { source })?;
        let affinity = started_rx.recv().map_err(|_| Error::WorkerStopped)??;
        Ok(Engine {
            ops,
            notes,
            tx,
            rx,
            rx_held: false,
            stop,
            thread: Some(thread),
            affinity,
            next_id: 0,
            signal_next: false,
            slot_size,
            peer_len,
            timeout: cfg.completion_timeout,
        })
    }

    /// The CPUs the worker may run on, as it read them from the kernel.
    pub fn worker_affinity(&self) -> &[usize] {
        &self.affinity
    }

    /// Asks for a completion of the next operation submitted.
    pub fn signal_next(&mut self) -> &mut Self {
        self.signal_next = true;
        self
    }

    fn check(&self, len: usize, remote: Option<u64>) -> Result<()> {
        if len > self.slot_size {
            return Err(Error::TooLarge {
                len,
                limit: self.slot_size,
            });
        }
        if let Some(offset) = remote {
            if offset
                .checked_add(len as u64)
                .is_none_or(|end| end > self.peer_len)
            {
                return Err(Error::OutOfRegion {
                    range: format!("{offset}..{}", offset.saturating_add(len as u64)),
                    len: self.peer_len as usize,
                });
            }
        }
        if self.ops.is_full() {
            return Err(self.full("the engine's operation queue"));
        }
        Ok(())
    }

    /// A full hand-off queue: back-pressure while the worker runs; once it
    /// stopped nothing will ever drain it, and retrying would spin forever.
    #[cold]
    #[inline(never)]
    fn full(&self, what: &'static str) -> Error {
        if self.is_running() {
            Error::Full {
                what,
                remedy: Remedy::Poll,
            }
        } else {
            Error::WorkerStopped
        }
    }

    /// Whether the worker still runs. It stops when its peer left (after
    /// [`EngineEvent::PeerLost`]), when heartbeats go unanswered, on an
    /// error of its own, or when shut down. A failed connection alone
    /// does not stop it: it refuses the operations submitted then
    /// ([`EngineEvent::Refused`]).
    ///
    /// Once it stopped, [`poll`](Engine::poll) finds nothing more,
    /// operations submitted are never answered, and submitting returns
    /// [`Error::WorkerStopped`] as soon as the queue is full (checked only
    /// then: the submit path stays one check); [`shutdown`](Engine::shutdown)
    /// gives the worker's end.
    pub fn is_running(&self) -> bool {
        let running = self.thread.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            // `is_finished` reads, relaxed, what the thread's exit wrote
            // with release: this fence makes everything the worker did
            // before it ended (its last notes) visible here.
            std::sync::atomic::fence(Ordering::Acquire);
        }
        running
    }

    fn enqueue(&mut self, kind: OpKind) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let op = Op {
            id,
            kind,
            signaled: std::mem::take(&mut self.signal_next),
        };
        // Checked not full, and this is the only producer: cannot fail.
        let pushed = self.ops.push(op);
        debug_assert!(pushed.is_ok());
        id
    }

    fn submit_with_payload(&mut self, data: &[u8], kind: OpKind) -> Result<u64> {
        let remote = match kind {
            OpKind::Write { remote_offset, .. } => Some(remote_offset),
            _ => None,
        };
        self.check(data.len(), remote)?;
        if !self.tx.push(data) {
            return Err(self.full("the engine's payload ring"));
        }
        Ok(self.enqueue(kind))
    }

    /// Submits a SEND of `data`; returns the operation's id. Never waits:
    /// `Error::Full` when the worker's queues have no room (poll, then
    /// retry), like [`Connection::try_send`].
    #[inline]
    pub fn try_send(&mut self, data: &[u8]) -> Result<u64> {
        self.submit_with_payload(data, OpKind::Send)
    }

    /// Submits an RDMA WRITE (with `imm`: WRITE_WITH_IMM) of `data` to
    /// `remote_offset` of the peer's target ring. Never waits (see
    /// [`try_send`](Engine::try_send)).
    #[inline]
    pub fn try_write(&mut self, data: &[u8], remote_offset: u64, imm: Option<u32>) -> Result<u64> {
        self.submit_with_payload(data, OpKind::Write { remote_offset, imm })
    }

    /// Submits an RDMA READ; the data come back in
    /// [`EngineEvent::ReadCompleted`]. Never waits (see
    /// [`try_send`](Engine::try_send)).
    #[inline]
    pub fn try_read(&mut self, remote_offset: u64, len: usize) -> Result<u64> {
        self.check(len, Some(remote_offset))?;
        Ok(self.enqueue(OpKind::Read {
            remote_offset,
            len: len as u32,
        }))
    }

    /// The next completion, if the worker has handed one back.
    #[inline]
    pub fn poll(&mut self) -> Option<EngineEvent<'_>> {
        if std::mem::take(&mut self.rx_held) {
            self.rx.release();
        }
        let note = self.notes.pop().ok()?;
        Some(match note {
            Relayed::Received => {
                self.rx_held = true;
                EngineEvent::Received {
                    data: self.rx.peek().unwrap_or(&[]),
                }
            }
            Relayed::ReadCompleted { id } => {
                self.rx_held = true;
                EngineEvent::ReadCompleted {
                    id,
                    data: self.rx.peek().unwrap_or(&[]),
                }
            }
            Relayed::WriteImm { imm, len } => EngineEvent::WriteImm { imm, len },
            Relayed::Completed { id, opcode } => EngineEvent::Completed { id, opcode },
            Relayed::Failed(e) => EngineEvent::Failed(e),
            Relayed::Flushed { id } => EngineEvent::Flushed { id },
            Relayed::RecvFlushed => EngineEvent::RecvFlushed,
            Relayed::Refused { id } => EngineEvent::Refused { id },
            Relayed::PeerLost => EngineEvent::PeerLost,
        })
    }

    /// Spins for the next completion, up to the completion timeout.
    #[inline]
    pub fn wait(&mut self) -> Result<EngineEvent<'_>> {
        if std::mem::take(&mut self.rx_held) {
            self.rx.release();
        }
        let mut wait = BoundedWait::new(self.timeout, "a completion from the worker");
        while self.notes.is_empty() {
            // Looked at again once the worker is seen ended: its last note
            // (PeerLost) may have come between the two looks.
            if wait.tick()?.is_some() && !self.is_running() && self.notes.is_empty() {
                return Err(Error::WorkerStopped);
            }
        }
        Ok(self.poll().expect("a note is queued"))
    }

    /// Stops accepting work, lets the worker finish everything submitted
    /// and in flight, and joins it.
    pub fn shutdown(mut self) -> Result<WorkerReport> {
        self.join()
    }

    fn join(&mut self) -> Result<WorkerReport> {
        self.stop.store(true, Ordering::Release);
        // Keep taking (and dropping) completions so the worker always has
        // room to retire what is still in flight.
        while self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
            while self.poll().is_some() {}
            std::thread::yield_now();
        }
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| Error::WorkerPanicked)?,
            None => Err(Error::WorkerStopped),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.join() {
                tracing::warn!(error = %e, "worker ended with an error");
            }
        }
    }
}

/// Pins the calling thread to `core` (when given) and reads back the CPUs
/// it may run on.
fn settle_in(core: Option<usize>) -> Result<Vec<usize>> {
    if let Some(core) = core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
            return Err(Error::Pin { core });
        }
    }
    current_affinity()
}

struct Worker {
    conn: Connection,
    ops: Consumer<Op>,
    notes: Producer<Relayed>,
    tx: SlotReader,
    rx: SlotWriter,
    stop: Arc<AtomicBool>,
    /// Operation id by send-queue sequence number (masked to its length).
    ids: Box<[u64]>,
    pending: Option<Op>,
    batch_size: usize,
    idle: IdlePolicy,
    drain_timeout: Duration,
}

/// The worker's state once its connection ended under it.
struct AfterEnd {
    /// When the retirement of what was in flight began (its first step,
    /// which posts a marker when the newest request is unsignaled).
    retiring_since: Option<Instant>,
}

impl Worker {
    fn run(mut self, affinity: Vec<usize>) -> Result<WorkerReport> {
        // The worker serves this one connection for its life.
        let span = self.conn.span().clone();
        let _in = span.enter();
        // Consecutive empty turns (for the idle policy), and those since
        // the last look for a disconnect: a counter of its own, so the
        // looks never stop however long the worker idles.
        let mut empty = 0u32;
        let mut unchecked = 0u32;
        let mut stopping: Option<Instant> = None;
        let mut end: Option<AfterEnd> = None;
        loop {
            // Read before the poll, so an empty poll below came after the
            // end was known; from then on its flushes are expected, so what
            // the application sees does not depend on when the worker read
            // the end, and nothing more of the application's is posted
            // (what is still queued is never answered).
            if end.is_none() && self.conn.endpoint().was_disconnected() {
                self.conn.expect_flushes();
                end = Some(AfterEnd {
                    retiring_since: None,
                });
            }
            let submitted = if end.is_none() { self.submit()? } else { 0 };
            let collected = self.collect()?;
            // Looked at every turn: a peer whose messages keep every turn
            // busy cannot hold a shutdown.
            if stopping.is_none() && self.stop.load(Ordering::Acquire) {
                stopping = Some(Instant::now());
            }
            if let Some(since) = stopping {
                if self.drained(since, end.is_some())? {
                    break;
                }
            }
            if submitted + collected.unwrap_or(0) > 0 {
                (empty, unchecked) = (0, 0);
                continue;
            }
            empty = empty.saturating_add(1);
            unchecked += 1;
            if unchecked >= PEER_CHECK_INTERVAL || stopping.is_some() {
                unchecked = 0;
                self.look_at_the_peer(collected.is_some() && end.is_none())?;
            }
            if let (Some(after), Some(0)) = (&mut end, collected) {
                if self.after_end(after)? {
                    return Ok(self.report(affinity, true));
                }
            }
            match self.idle {
                // No PAUSE for a worker alone on its core (see `wait`).
                IdlePolicy::Spin => {}
                IdlePolicy::Backoff { spins } if empty > spins => std::thread::yield_now(),
                IdlePolicy::Backoff { .. } => std::hint::spin_loop(),
            }
        }
        Ok(self.report(affinity, false))
    }

    /// Looks for a disconnect (rdma_cm, device events) and, when
    /// `heartbeats`, keeps the heartbeat going. Heartbeats only while
    /// completions can be taken (a silence that is the application's —
    /// its queues full, nothing polled — is not the peer's) and never once
    /// the connection ended (a heartbeat to a dead queue pair, or a dead
    /// peer declared where it had said goodbye).
    fn look_at_the_peer(&mut self, heartbeats: bool) -> Result<()> {
        self.conn.peer_gone()?;
        if !heartbeats || self.conn.endpoint().was_disconnected() {
            return Ok(());
        }
        if let Err(e) = self.conn.keepalive() {
            // Room for it: the poll just had room for a batch.
            let _ = self.notes.push(Relayed::PeerLost);
            return Err(e);
        }
        Ok(())
    }

    /// One step after the connection ended under the worker (the peer
    /// disconnected, or a device event; whoever read the event, the
    /// endpoint remembers it), taken after a poll with room for all it
    /// could find found nothing. Requests that completed unsignaled before
    /// the end make no completion: a marker retires them (as `close`
    /// does). Once nothing is in flight and the application was told
    /// ([`EngineEvent::PeerLost`]), the worker ends: `true` after a
    /// disconnect, the error of a device event.
    ///
    /// A device that stops producing completions (mlx5 after a fatal
    /// error) does not keep it: once the retirement has waited the
    /// completion timeout — counted from its first step, and only ever
    /// judged right after a poll that found nothing, so a completion that
    /// came while the application paused is always taken first — the
    /// worker ends
    /// the connection in place (itself bounded by the completion timeout)
    /// and says so.
    fn after_end(&mut self, after: &mut AfterEnd) -> Result<bool> {
        if self.conn.outstanding() > 0 {
            let since = *after.retiring_since.get_or_insert_with(Instant::now);
            let retired = if since.elapsed() > self.drain_timeout {
                Err(Error::Timeout {
                    what: "the requests in flight to retire after the connection ended",
                    waited: since.elapsed(),
                })
            } else {
                self.conn.retire_after_end()
            };
            if let Err(e) = retired {
                let _ = self.notes.push(Relayed::PeerLost);
                let _ = self.conn.abort_in_place();
                return Err(e);
            }
            return Ok(false);
        }
        if self.notes.push(Relayed::PeerLost).is_err() {
            // The application has not taken its events yet: next turn.
            return Ok(false);
        }
        match self.conn.endpoint().end_error() {
            Error::Disconnected => Ok(true),
            other => Err(other),
        }
    }

    /// One step of draining after a stop (since `since`): whether nothing
    /// is left; an error once the drain took too long.
    fn drained(&mut self, since: Instant, ended: bool) -> Result<bool> {
        if self.ops.is_empty() && self.pending.is_none() {
            if self.conn.outstanding() == 0 {
                return Ok(true);
            }
            let retiring = if self.conn.failure().is_none() && !ended {
                self.conn.flush_tail()
            } else {
                self.conn.retire_after_end()
            };
            if let Err(e) = retiring {
                // As below: a drop would wait for the same requests again.
                let _ = self.conn.abort_in_place();
                return Err(e);
            }
        }
        if since.elapsed() > self.drain_timeout {
            // Dropping the connection would wait for the same requests
            // again: end it now.
            let _ = self.conn.abort_in_place();
            return Err(Error::Timeout {
                what: "the worker to drain its in-flight work",
                waited: since.elapsed(),
            });
        }
        Ok(false)
    }

    fn report(&self, affinity: Vec<usize>, peer_left: bool) -> WorkerReport {
        WorkerReport {
            stats: self.conn.stats(),
            affinity,
            peer_left,
        }
    }

    /// Moves queued operations into one batch and posts it.
    fn submit(&mut self) -> Result<usize> {
        if self.pending.is_none() {
            match self.ops.slots() {
                0 => return Ok(0),
                1 => return self.submit_alone(),
                _ => {}
            }
        }
        let mask = self.ids.len() - 1;
        let payloads = self.tx.published();
        let mut used = 0usize;
        let mut refused = 0usize;
        let mut batch = self.conn.batch();
        // An op may be refused, which is a note: take ops while there is
        // room for one.
        while batch.len() < self.batch_size && !self.notes.is_full() {
            let Some(op) = self.pending.take().or_else(|| self.ops.pop().ok()) else {
                break;
            };
            let has_payload = !matches!(op.kind, OpKind::Read { .. });
            // `payloads` was looked at before this op was popped: an op the
            // application queued since then has its payload published but
            // not in this view. It waits for the next batch (never posted
            // with a payload that is not its own).
            let data = match payloads.get(used) {
                Some(data) => data,
                None if has_payload => {
                    self.pending = Some(op);
                    break;
                }
                None => &[],
            };
            if op.signaled {
                batch.signal_next();
            }
            let result = match op.kind {
                OpKind::Send => batch.send(data),
                OpKind::Write { remote_offset, imm } => batch.write(data, remote_offset, imm),
                OpKind::Read { remote_offset, len } => batch.read(remote_offset, len as usize),
            };
            match result {
                Ok(seq) => {
                    self.ids[seq as usize & mask] = op.id;
                    used += usize::from(has_payload);
                }
                Err(Error::Full { .. }) => {
                    self.pending = Some(op);
                    break;
                }
                Err(_) => {
                    // The connection failed (or the op was malformed, which
                    // the application side already checks): never posted.
                    used += usize::from(has_payload);
                    refused += 1;
                    let _ = self.notes.push(Relayed::Refused { id: op.id });
                }
            }
        }
        let posted = batch.post()?;
        // The post copied or inlined every payload: the slots can go back.
        for _ in 0..used {
            self.tx.release();
        }
        Ok(posted + refused)
    }

    /// One op waiting — a latency-bound application, one request per
    /// round trip — goes out on the connection's batch-of-one fast path,
    /// the one direct mode uses: no `Batch` state is set up and torn down
    /// for a single request, so engine mode adds only the hand-off.
    fn submit_alone(&mut self) -> Result<usize> {
        // It may be refused, which is a note: only with room for it.
        if self.notes.is_full() {
            return Ok(0);
        }
        let Ok(op) = self.ops.pop() else {
            return Ok(0);
        };
        let has_payload = !matches!(op.kind, OpKind::Read { .. });
        // Popped after its payload was published (the application pushes
        // the payload first), so this view holds it.
        let data = if has_payload {
            match self.tx.published().get(0) {
                Some(data) => data,
                None => {
                    self.pending = Some(op);
                    return Ok(0);
                }
            }
        } else {
            &[]
        };
        let result = match op.kind {
            OpKind::Send => self.conn.send_one(data, op.signaled),
            OpKind::Write { remote_offset, imm } => {
                self.conn.write_one(data, remote_offset, imm, op.signaled)
            }
            OpKind::Read { remote_offset, len } => self.conn.try_read(remote_offset, len as usize),
        };
        match result {
            Ok(seq) => {
                let mask = self.ids.len() - 1;
                self.ids[seq as usize & mask] = op.id;
            }
            Err(Error::Full { .. }) => {
                self.pending = Some(op);
                return Ok(0);
            }
            // As in `submit`: never posted, and the application is told.
            Err(_) => {
                let _ = self.notes.push(Relayed::Refused { id: op.id });
            }
        }
        // Posted (copied or inlined) or refused: the slot can go back.
        if has_payload {
            self.tx.release();
        }
        Ok(1)
    }

    /// Polls both CQs and hands the events to the application, when it
    /// has room for every event the poll can make (otherwise the
    /// completions wait in the CQ): one per request retired, which a single
    /// completion may do for many (a flush that retires unsignaled requests
    /// before it), and one per receive.
    /// Returns the completions taken, or `None` when there was no room to
    /// poll.
    fn collect(&mut self) -> Result<Option<usize>> {
        if self.notes.slots() < self.conn.events_per_poll() || self.rx.free() < PAYLOADS_PER_POLL {
            return Ok(None);
        }
        let (notes, rx, ids) = (&mut self.notes, &mut self.rx, &self.ids);
        let id_of = |seq: u64| ids[seq as usize & (ids.len() - 1)];
        self.conn
            .poll(|ev| {
                let note = match ev {
                    Event::Received { data } => {
                        let pushed = rx.push(data);
                        debug_assert!(pushed);
                        Relayed::Received
                    }
                    Event::WriteImm { imm, len } => Relayed::WriteImm { imm, len },
                    Event::Completed { seq, opcode } => Relayed::Completed {
                        id: id_of(seq),
                        opcode,
                    },
                    Event::ReadCompleted { seq, data } => {
                        let pushed = rx.push(data);
                        debug_assert!(pushed);
                        Relayed::ReadCompleted { id: id_of(seq) }
                    }
                    Event::Failed(mut e) => {
                        if e.opcode != Some(WcOpcode::RECV) && e.wr_id != WcError::INTERNAL {
                            e.wr_id = id_of(e.wr_id);
                        }
                        Relayed::Failed(e)
                    }
                    Event::Flushed { seq, .. } => Relayed::Flushed { id: id_of(seq) },
                    Event::RecvFlushed => Relayed::RecvFlushed,
                };
                let pushed = notes.push(note);
                debug_assert!(pushed.is_ok(), "room was checked before polling");
            })
            .map(Some)
    }
}
