use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::ring::{RingCursor, SlotLayout};
use super::sq::SendQueueAccount;
use crate::completion::{WcError, WcOpcode, WcStatus};
use crate::connect::cm::{Connector, Listener};
use crate::connect::oob::Prepared;
use crate::connect::RegionDescriptor;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::profile::EngineConfig;
use crate::sys::chain::{Payload, RecvChain, SendChain, SendOpcode, SendRequest};
use crate::sys::cq::WorkCompletion;
use crate::sys::mr::{Access, MemoryRegion, RemoteSlice};
use crate::wait::BoundedWait;

/// Completions taken from a CQ per poll.
const POLL_BATCH: usize = 32;
/// A wait this long also asks rdma_cm whether the peer disconnected (a
/// system call, so never on a wait that is about to succeed).
const PEER_CHECK_AFTER: Duration = Duration::from_millis(1);
/// How long an error completion that a departing peer causes waits for
/// that peer's disconnect to arrive and name the cause.
const PEER_LEFT_GRACE: Duration = Duration::from_millis(200);
/// How long close waits for posted receives to come back flushed.
const RECV_FLUSH_GRACE: Duration = Duration::from_millis(500);

/// The registered rings of one connection, created (and all receives
/// posted) before the peer can send.
#[derive(Debug)]
pub struct Rings {
    /// Payloads above the inline threshold are copied here; the NIC reads it.
    send: MemoryRegion,
    /// SEND payloads arrive here, one slot per posted receive.
    recv: MemoryRegion,
    /// The peer RDMA-writes (and reads) here; its descriptor goes to the peer.
    target: MemoryRegion,
    /// RDMA READ results land here.
    read: MemoryRegion,
    layout: SlotLayout,
    recv_layout: SlotLayout,
    recv_chain: RecvChain,
    recv_posted: u64,
}

impl Rings {
    /// Registers the four rings on `ep`'s PD with the least access each
    /// needs, and posts a receive for every receive slot. The target ring
    /// allows the peer `remote_access` (REMOTE_WRITE and/or REMOTE_READ).
    pub fn prepare(ep: &mut Endpoint, cfg: &EngineConfig, remote_access: Access) -> Result<Rings> {
        cfg.validate()?;
        let layout = SlotLayout::new(cfg.slot_size as usize, cfg.slot_count as usize);
        let recv_layout = SlotLayout::new(cfg.slot_size as usize, cfg.qp.max_recv_wr as usize);
        crate::sys::mem::check_memlock(cfg.registered_bytes())?;
        let send = ep.register(layout.bytes(), cfg.pages, Access::LOCAL_READ)?;
        let recv = ep.register(recv_layout.bytes(), cfg.pages, Access::LOCAL_WRITE)?;
        let target = ep.register(
            layout.bytes(),
            cfg.pages,
            Access::LOCAL_WRITE | remote_access,
        )?;
        let read = ep.register(layout.bytes(), cfg.pages, Access::LOCAL_WRITE)?;
        let mut rings = Rings {
            send,
            recv,
            target,
            read,
            layout,
            recv_layout,
            recv_chain: RecvChain::new(cfg.batch_size.max(1) as usize),
            recv_posted: 0,
        };
        rings.refill(ep, 0)?;
        Ok(rings)
    }

    /// The target ring, as the peer must address it.
    pub fn descriptor(&self) -> RemoteSlice {
        RemoteSlice {
            addr: self.target.addr(),
            len: self.target.len() as u64,
            rkey: self.target.rkey(),
        }
    }

    /// Posts receives until `depth` are outstanding past `recv_done`, in
    /// batches of the chain's capacity.
    #[inline]
    fn refill(&mut self, ep: &mut Endpoint, recv_done: u64) -> Result<()> {
        let depth = self.recv_layout.count() as u64;
        while self.recv_posted - recv_done < depth {
            let want =
                (depth - (self.recv_posted - recv_done)).min(self.recv_chain.capacity() as u64);
            let (layout, recv, first) = (self.recv_layout, &self.recv, self.recv_posted);
            let items = (first..first + want).map(|pos| {
                let range = layout.range(layout.slot(pos), layout.size());
                (
                    pos,
                    Some(
                        recv.slice(range)
                            .expect("receive slot inside the receive ring"),
                    ),
                )
            });
            let n = self.recv_chain.post(ep.qp(), items)?;
            self.recv_posted += n as u64;
        }
        Ok(())
    }
}

/// Heartbeat state of an idle connection.
#[derive(Debug)]
struct Heartbeat {
    interval: Option<Duration>,
    misses: u32,
    last_activity: std::time::Instant,
    /// Completions + receives when last looked at: a change is activity.
    seen_activity: u64,
    /// The heartbeat in flight: its sequence number and when it was sent.
    outstanding: Option<(u64, std::time::Instant)>,
}

/// What a send-queue work request was, kept until it retires.
#[derive(Debug, Clone, Copy, Default)]
struct OpMeta {
    opcode: Option<WcOpcode>,
    signaled: bool,
    send_slot: bool,
    read_slot: bool,
    read_len: u32,
    /// Posted by the engine itself (heartbeat, drain marker): its
    /// completion is bookkeeping, not an application event.
    internal: bool,
}

impl OpMeta {
    /// An application request: `slots` are (send-ring slot claimed,
    /// read-ring slot claimed, READ length).
    #[inline]
    fn posted(opcode: SendOpcode, signaled: bool, slots: (bool, bool, u32)) -> OpMeta {
        OpMeta {
            opcode: Some(opcode.completion_opcode()),
            signaled,
            send_slot: slots.0,
            read_slot: slots.1,
            read_len: slots.2,
            internal: false,
        }
    }
}

/// Counters of everything that completed, for accounting and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Send-queue work requests posted.
    pub posted: u64,
    /// Retired successfully (signaled or covered by a later signal).
    pub completed: u64,
    /// Completed with an error other than a flush (at most one per QP).
    pub failed: u64,
    /// Flushed after the failure.
    pub flushed: u64,
    /// Messages and immediates received.
    pub received: u64,
    /// Receives flushed after the failure.
    pub recv_flushed: u64,
    /// Doorbells rung (ibv_post_send calls).
    pub doorbells: u64,
}

/// Something that happened on the connection, lent to a callback.
#[derive(Debug)]
pub enum Event<'a> {
    /// A SEND arrived; `data` lives in the receive ring until the callback returns.
    Received { data: &'a [u8] },
    /// A WRITE_WITH_IMM arrived: `len` bytes landed in the target ring.
    WriteImm { imm: u32, len: u32 },
    /// A signaled request completed (and every request before it).
    Completed { seq: u64, opcode: WcOpcode },
    /// A READ completed with `data`.
    ReadCompleted { seq: u64, data: &'a [u8] },
    /// The first error on this connection; the QP is now in error.
    Failed(WcError),
    /// A send request flushed because of the earlier failure.
    Flushed { seq: u64, opcode: Option<WcOpcode> },
    /// A posted receive flushed because of the earlier failure.
    RecvFlushed,
}

/// A message or immediate taken by [`Connection::recv`]; its receive slot
/// is re-posted after this borrow ends.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// The SEND's payload (empty for WRITE_WITH_IMM).
    pub data: &'a [u8],
    /// The immediate of a WRITE_WITH_IMM.
    pub imm: Option<u32>,
    /// Bytes transferred (for WRITE_WITH_IMM: bytes written to the target ring).
    pub len: u32,
}

/// A connected queue pair with its rings, pre-built chains and accounting:
/// the direct-mode fast path. The owning thread posts and polls; nothing
/// here allocates after construction.
#[derive(Debug)]
pub struct Connection {
    ep: Endpoint,
    rings: Rings,
    peer: RemoteSlice,
    chain: SendChain,
    sq: SendQueueAccount,
    meta: Box<[OpMeta]>,
    send_cursor: RingCursor,
    read_cursor: RingCursor,
    recv_done: u64,
    inline_threshold: usize,
    completion_timeout: Duration,
    failure: Option<WcError>,
    /// Set by close: flushes are then expected, not failures.
    closing: bool,
    heartbeat: Heartbeat,
    stats: Stats,
    wcs: [WorkCompletion; POLL_BATCH],
}

impl Connection {
    /// Builds the fast path over a connected endpoint whose rings were
    /// prepared before connecting. `peer` is the peer's target ring.
    pub fn new(
        ep: Endpoint,
        rings: Rings,
        peer: RemoteSlice,
        cfg: &EngineConfig,
    ) -> Result<Connection> {
        let depth = cfg.qp.max_send_wr;
        let inline_threshold = cfg.inline_threshold.min(ep.max_inline()) as usize;
        Ok(Connection {
            chain: SendChain::new(cfg.batch_size as usize),
            sq: SendQueueAccount::new(depth, cfg.signal_interval),
            // A power of two, so a sequence number maps to its entry with a
            // mask (a 64-bit division is a helper call under emulation).
            meta: vec![OpMeta::default(); (depth as usize).next_power_of_two()].into_boxed_slice(),
            send_cursor: RingCursor::default(),
            read_cursor: RingCursor::default(),
            recv_done: 0,
            inline_threshold,
            completion_timeout: cfg.completion_timeout,
            failure: None,
            closing: false,
            heartbeat: Heartbeat {
                interval: cfg.heartbeat_interval,
                misses: cfg.heartbeat_misses,
                last_activity: std::time::Instant::now(),
                seen_activity: 0,
                outstanding: None,
            },
            stats: Stats::default(),
            wcs: WorkCompletion::array(),
            ep,
            rings,
            peer,
        })
    }

    /// Client side over rdma_cm: the rings' descriptors travel in the
    /// connect request's and reply's private data.
    pub fn connect(addr: SocketAddr, cfg: &EngineConfig) -> Result<Connection> {
        cfg.validate()?;
        let mut conn = Connector::resolve(addr, &cfg.qp)?;
        let rings = Rings::prepare(
            conn.endpoint(),
            cfg,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )?;
        let ep = conn.connect(&RegionDescriptor(rings.descriptor()).encode())?;
        let peer = RegionDescriptor::decode(ep.peer_private_data())?.0;
        Connection::new(ep, rings, peer, cfg)
    }

    /// Server side over rdma_cm: waits for the next client.
    pub fn accept(
        listener: &Listener,
        cfg: &EngineConfig,
        timeout: Duration,
    ) -> Result<Connection> {
        cfg.validate()?;
        let mut req = listener.next_request(&cfg.qp, timeout)?;
        let peer = RegionDescriptor::decode(req.private_data())?.0;
        let rings = Rings::prepare(
            req.endpoint(),
            cfg,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )?;
        let ep = req.accept(&RegionDescriptor(rings.descriptor()).encode())?;
        Connection::new(ep, rings, peer, cfg)
    }

    /// Either side of an out-of-band TCP exchange (symmetric).
    pub fn over_tcp(
        stream: &mut TcpStream,
        device: Option<&str>,
        cfg: &EngineConfig,
    ) -> Result<Connection> {
        cfg.validate()?;
        let mut prepared =
            Prepared::new(device, &cfg.qp, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
        let rings = Rings::prepare(
            prepared.endpoint(),
            cfg,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )?;
        let ep = prepared.handshake(stream, Some(rings.descriptor()))?;
        let peer = ep
            .remote_region()
            .ok_or_else(|| Error::BadRecord("the peer exposed no target ring".into()))?;
        Connection::new(ep, rings, peer, cfg)
    }

    pub fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.ep
    }

    pub fn stats(&self) -> Stats {
        self.stats
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
        self.inline_threshold
    }

    /// Bytes per ring slot: the largest single operation.
    pub fn slot_size(&self) -> usize {
        self.rings.layout.size()
    }

    /// Slots per ring. Send-ring slots are claimed in order, so after this
    /// many [`Batch::write_from`] calls every slot has been filled once.
    pub fn slot_count(&self) -> usize {
        self.rings.layout.count()
    }

    /// The peer's target ring.
    pub fn peer_ring(&self) -> RemoteSlice {
        self.peer
    }

    /// This side's target ring, which the peer writes into. Read it only
    /// after the peer said (by message or immediate) that the bytes are there.
    pub fn target(&self) -> &[u8] {
        self.rings.target.as_slice()
    }

    /// Byte `offset` of this side's target ring, loaded from memory on
    /// every call: spin on it to see a peer's RDMA WRITE land (the last
    /// byte of a write arrives last on RC).
    #[inline]
    pub fn target_byte(&self, offset: usize) -> u8 {
        self.rings.target.load_byte(offset)
    }

    /// Write access to this side's target ring, e.g. to publish data the
    /// peer will RDMA READ.
    pub fn target_mut(&mut self) -> &mut [u8] {
        self.rings.target.as_mut_slice()
    }

    /// Send-queue requests admitted and not yet retired.
    pub fn outstanding(&self) -> u64 {
        self.sq.outstanding()
    }

    /// Whether request `seq` has retired (successfully or not).
    pub fn is_retired(&self, seq: u64) -> bool {
        seq < self.sq.retired()
    }

    /// Starts a batch: up to `batch_size` requests, one doorbell.
    #[inline]
    pub fn batch<'d>(&mut self) -> Batch<'_, 'd> {
        let mark = (self.sq.posted(), self.send_cursor, self.read_cursor);
        Batch {
            sends: Some(self.chain.batch(self.ep.qp())),
            sq: &mut self.sq,
            meta: &mut self.meta,
            send_cursor: &mut self.send_cursor,
            read_cursor: &mut self.read_cursor,
            send_ring: &mut self.rings.send,
            read_ring: &self.rings.read,
            layout: self.rings.layout,
            peer: self.peer,
            inline_threshold: self.inline_threshold,
            failure: self.failure.as_ref(),
            stats: &mut self.stats,
            mark,
            force_signal: false,
        }
    }

    /// SEND `data` on its own (one doorbell), reaping completions while the
    /// send queue or the send ring is full. Returns its sequence number.
    #[inline]
    pub fn send(&mut self, data: &[u8]) -> Result<u64> {
        self.with_room(|c| c.try_send(data))
    }

    /// RDMA WRITE `data` to `remote_offset` of the peer's target ring, with
    /// an optional immediate (which consumes a receive at the peer).
    #[inline]
    pub fn write(&mut self, data: &[u8], remote_offset: u64, imm: Option<u32>) -> Result<u64> {
        self.with_room(|c| c.try_write(data, remote_offset, imm))
    }

    /// RDMA READ `len` bytes at `remote_offset` of the peer's target ring,
    /// waiting for the data.
    #[inline]
    pub fn read(&mut self, remote_offset: u64, len: usize) -> Result<&[u8]> {
        let pos = self.read_cursor.head;
        let seq = self.with_room(|c| c.try_read(remote_offset, len))?;
        self.wait_retired(seq)?;
        // The slot was released at retirement, but only a later READ —
        // which needs `&mut self` — can overwrite it while this borrow lives.
        let slot = self.rings.layout.slot(pos);
        Ok(&self.rings.read.as_slice()[self.rings.layout.range(slot, len)])
    }

    /// SEND `data` on its own, now or not at all: [`Error::Full`] when the
    /// send queue (or, above the inline threshold, the send ring) has no
    /// room — reap completions and retry. The batch-of-one fast path: no
    /// [`Batch`] state, one doorbell, and no clock read.
    #[inline]
    pub fn try_send(&mut self, data: &[u8]) -> Result<u64> {
        self.send_one(data, false)
    }

    /// [`Connection::try_send`], signaled whatever the interval says when
    /// `must_signal` (the engine's worker, for an op the application
    /// asked a completion of).
    #[inline]
    pub(crate) fn send_one(&mut self, data: &[u8], must_signal: bool) -> Result<u64> {
        self.post_staged(SendOpcode::Send, None, must_signal, |c| c.stage(data))
    }

    /// RDMA WRITE (with `imm`: WRITE_WITH_IMM) on its own, now or not at
    /// all; see [`Connection::try_send`].
    #[inline]
    pub fn try_write(&mut self, data: &[u8], remote_offset: u64, imm: Option<u32>) -> Result<u64> {
        self.write_one(data, remote_offset, imm, false)
    }

    /// [`Connection::try_write`], signaled when `must_signal` (see
    /// [`Connection::send_one`]).
    #[inline]
    pub(crate) fn write_one(
        &mut self,
        data: &[u8],
        remote_offset: u64,
        imm: Option<u32>,
        must_signal: bool,
    ) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, data.len() as u64)?;
        let opcode = imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm);
        self.post_staged(opcode, Some(remote), must_signal, |c| c.stage(data))
    }

    /// RDMA WRITE (with `imm`: WRITE_WITH_IMM) of `len` bytes that `fill`
    /// writes straight into a registered send-ring slot, on its own, now
    /// or not at all (see [`Connection::try_send`] and
    /// [`Batch::write_from`]): no copy of a payload that is already where
    /// it belongs. An error from `fill` posts nothing.
    #[inline]
    pub fn try_write_from(
        &mut self,
        len: usize,
        remote_offset: u64,
        imm: Option<u32>,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, len as u64)?;
        let opcode = imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm);
        self.post_staged(opcode, Some(remote), false, |c| {
            ring_payload(
                &mut c.send_cursor,
                c.rings.layout,
                &mut c.rings.send,
                len,
                fill,
            )
        })
    }

    /// The batch-of-one SEND and WRITE: admits a request, lets `stage`
    /// place its payload (inline or in a send-ring slot; a failure gives
    /// the request back) and posts it.
    #[inline]
    fn post_staged<'d>(
        &mut self,
        opcode: SendOpcode,
        remote: Option<RemoteSlice>,
        must_signal: bool,
        stage: impl FnOnce(&mut Self) -> Result<(Payload<'d>, bool)>,
    ) -> Result<u64> {
        let (seq, signaled) = self.admit_one(must_signal)?;
        let (payload, slot) = match stage(self) {
            Ok(staged) => staged,
            Err(e) => {
                self.sq.rollback(seq);
                return Err(e);
            }
        };
        self.post_one(seq, signaled, opcode, payload, remote, (slot, false, 0))
    }

    /// RDMA READ on its own, now or not at all (see
    /// [`Connection::try_send`]); the data arrive with
    /// [`Event::ReadCompleted`] for the returned sequence number.
    #[inline]
    pub fn try_read(&mut self, remote_offset: u64, len: usize) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, len as u64)?;
        let (seq, signaled) = self.admit_one(true)?;
        let local = match claim_slot(
            &mut self.read_cursor,
            self.rings.layout,
            len,
            "the read ring",
        )
        .and_then(|range| self.rings.read.slice(range))
        {
            Ok(local) => local,
            Err(e) => {
                self.sq.rollback(seq);
                return Err(e);
            }
        };
        let payload = Payload::Registered(local);
        let slots = (false, true, len as u32);
        self.post_one(
            seq,
            signaled,
            SendOpcode::Read,
            payload,
            Some(remote),
            slots,
        )
    }

    /// Admits one send-queue request, unless the connection failed or the
    /// queue is full.
    #[inline]
    fn admit_one(&mut self, must_signal: bool) -> Result<(u64, bool)> {
        if let Some(f) = self.failure {
            return Err(Error::Completion(f));
        }
        // (Not `ok_or`: that builds and drops an Error on every call.)
        let Some(admitted) = self.sq.admit(must_signal) else {
            return Err(Error::Full {
                what: "the send queue",
            });
        };
        Ok(admitted)
    }

    /// `data` as a payload: inline when small, else copied into a
    /// send-ring slot.
    #[inline]
    fn stage<'d>(&mut self, data: &'d [u8]) -> Result<(Payload<'d>, bool)> {
        stage_payload(
            data,
            self.inline_threshold,
            &mut self.send_cursor,
            self.rings.layout,
            &mut self.rings.send,
        )
    }

    /// Posts admitted request `seq` alone and records what it was; when
    /// the post fails, the request and its ring slots are given back.
    #[inline]
    fn post_one(
        &mut self,
        seq: u64,
        signaled: bool,
        opcode: SendOpcode,
        payload: Payload<'_>,
        remote: Option<RemoteSlice>,
        slots: (bool, bool, u32),
    ) -> Result<u64> {
        let req = SendRequest {
            wr_id: seq,
            opcode,
            payload,
            remote,
            signaled,
        };
        if let Err(e) = self.chain.post_one(self.ep.qp(), &req) {
            self.sq.rollback(seq);
            self.send_cursor.head -= u64::from(slots.0);
            self.read_cursor.head -= u64::from(slots.1);
            return Err(e);
        }
        self.meta[meta_index(&self.meta, seq)] = OpMeta::posted(opcode, signaled, slots);
        self.stats.posted += 1;
        self.stats.doorbells += 1;
        Ok(seq)
    }

    /// Runs `post` until it is not refused for lack of room, reaping
    /// completions in between, within the completion timeout.
    #[inline]
    fn with_room(&mut self, mut post: impl FnMut(&mut Self) -> Result<u64>) -> Result<u64> {
        let mut wait = BoundedWait::new(self.completion_timeout, "send-queue room");
        loop {
            match post(self) {
                Err(Error::Full { .. }) => {
                    if self.reap()? == 0 {
                        if let Some(waited) = wait.tick()? {
                            self.check_peer(waited)?;
                        }
                    }
                }
                // A failure names why the connection ended, when it did.
                done => return done.map_err(|e| self.ended_error(e)),
            }
        }
    }

    /// Called from the slow path of every wait (when the clock is read):
    /// notices an rdma_cm disconnect, after which the QP flushes.
    #[inline(never)]
    fn check_peer(&mut self, waited: Duration) -> Result<()> {
        if waited >= PEER_CHECK_AFTER {
            self.ep.peer_gone()?;
            self.keepalive()?;
        }
        Ok(())
    }

    /// Heartbeats for idle connections (slow path: reads the clock). When
    /// nothing completed for `heartbeat_interval`, posts a signaled
    /// zero-length RDMA WRITE; if that stays unanswered for
    /// `heartbeat_interval × heartbeat_misses`, the peer is declared dead
    /// and the QP is moved to ERR. Called by the waits and the worker.
    pub fn keepalive(&mut self) -> Result<()> {
        let Some(interval) = self.heartbeat.interval else {
            return Ok(());
        };
        if self.failure.is_some() || self.closing {
            return Ok(());
        }
        let now = std::time::Instant::now();
        let activity = self.stats.completed + self.stats.received;
        if activity != self.heartbeat.seen_activity {
            self.heartbeat.seen_activity = activity;
            self.heartbeat.last_activity = now;
            self.heartbeat.outstanding = None;
            return Ok(());
        }
        match self.heartbeat.outstanding {
            Some((seq, _)) if self.is_retired(seq) => {
                self.heartbeat.outstanding = None;
                self.heartbeat.last_activity = now;
            }
            Some((_, sent)) => {
                let waited = now - sent;
                if waited >= interval * self.heartbeat.misses {
                    let _ = self.ep.disconnect();
                    return Err(Error::PeerUnresponsive { waited });
                }
            }
            None if now - self.heartbeat.last_activity >= interval && self.sq.room() > 0 => {
                let mut b = self.batch();
                b.signal_next();
                let seq = b.write(&[], 0, None)?;
                b.post()?;
                self.meta[meta_index(&self.meta, seq)].internal = true;
                self.heartbeat.outstanding = Some((seq, now));
            }
            None => {}
        }
        Ok(())
    }

    /// Polls the send CQ once for bookkeeping only (retire, free slots);
    /// completion events are dropped, an error is returned.
    #[inline]
    pub fn reap(&mut self) -> Result<usize> {
        let mut failure = None;
        let n = self.poll_send(&mut |ev| {
            if let Event::Failed(e) = ev {
                failure = Some(e);
            }
        })?;
        match failure {
            Some(e) => Err(self.completion_error(e)),
            None => Ok(n),
        }
    }

    /// The error for a failed work completion. A flush after the
    /// connection ended under this side — the peer left, or a device event
    /// (port error, device removal) — is reported as that end: the flush
    /// is only its consequence. Pending rdma_cm and device events are read
    /// first, so the cause is known even if no wait has looked yet.
    fn completion_error(&mut self, wc: WcError) -> Error {
        if wc.status == WcStatus::WR_FLUSH_ERR {
            let _ = self.ep.peer_gone();
            if self.ep.was_disconnected() {
                return self.ep.end_error();
            }
        }
        if matches!(
            wc.status,
            WcStatus::REM_ACCESS_ERR
                | WcStatus::REM_OP_ERR
                | WcStatus::REM_INV_REQ_ERR
                | WcStatus::RETRY_EXC_ERR
        ) {
            // What a peer process that dies leaves behind (its kernel tears
            // down its regions and QP while its disconnect is on the way)
            // fails like this. A disconnect close behind names the cause;
            // the status stays in the error.
            let mut grace = BoundedWait::new(PEER_LEFT_GRACE, "the peer's disconnect");
            loop {
                let _ = self.ep.peer_gone();
                if self.ep.was_disconnected() {
                    return match self.ep.end_error() {
                        Error::Disconnected => Error::PeerLeft(wc),
                        other => other,
                    };
                }
                if grace.tick().is_err() {
                    break;
                }
            }
        }
        Error::Completion(wc)
    }

    /// [`completion_error`](Self::completion_error) for any error.
    fn ended_error(&mut self, err: Error) -> Error {
        match err {
            Error::Completion(wc) => self.completion_error(wc),
            err => err,
        }
    }

    /// Polls until request `seq` retires, or the connection fails, or the
    /// completion timeout passes. `seq` (or a later request) must be signaled.
    pub fn wait_retired(&mut self, seq: u64) -> Result<()> {
        let mut wait = BoundedWait::new(self.completion_timeout, "a send completion");
        while !self.is_retired(seq) {
            if let Some(f) = self.failure {
                return Err(self.completion_error(f));
            }
            self.reap()?;
            if let Some(waited) = wait.tick()? {
                self.check_peer(waited)?;
            }
        }
        Ok(())
    }

    /// Ends the connection in order: disconnects (rdma_cm) or moves the QP
    /// to ERR, then polls until every posted send and receive has completed
    /// (flushed), so the NIC is done with every buffer before the QP, the
    /// rings and their registrations go. Bounded by the completion timeout.
    /// Dropping a connection does the same, ignoring errors.
    pub fn close(mut self) -> Result<Stats> {
        self.drain()?;
        Ok(self.stats)
    }

    fn drain(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.closing, true) {
            return Ok(());
        }
        let disconnected = self.ep.disconnect();
        // Unsignaled requests that completed before the QP went to ERR make
        // no completion, and flushed ones make one each, in order. A
        // signaled marker posted now (to the ERR QP: it flushes at once)
        // therefore retires exactly the requests that completed silently.
        if self.sq.outstanding() > 0 {
            self.post_marker()?;
        }
        let mut wait =
            BoundedWait::new(self.completion_timeout, "the send queue to flush at close");
        while self.sq.outstanding() > 0 {
            if self.poll(|_| {})? == 0 {
                if let Err(e) = wait.tick() {
                    tracing::warn!(sends = self.sq.outstanding(), "sends still posted at close");
                    return Err(e);
                }
            }
        }
        // Posted receives flush too, but rxe (Linux 6.1) flushes a receive
        // queue only when a packet arrives for it: give them a short grace.
        // What is left is released when the QP is destroyed — before the
        // rings are deregistered, so the NIC can no longer write into them.
        let mut grace = BoundedWait::new(RECV_FLUSH_GRACE, "receives to flush at close");
        while self.rings.recv_posted > self.recv_done {
            if self.poll(|_| {})? == 0 && grace.tick().is_err() {
                tracing::debug!(
                    receives = self.rings.recv_posted - self.recv_done,
                    "receives not flushed at close; destroying the QP releases them"
                );
                break;
            }
        }
        disconnected
    }

    /// A signaled zero-length RDMA WRITE, posted even after a failure.
    fn post_marker(&mut self) -> Result<()> {
        while self.sq.room() == 0 {
            self.poll(|_| {})?;
        }
        let (seq, _) = self.sq.admit(true).ok_or(Error::Full {
            what: "the send queue",
        })?;
        self.meta[meta_index(&self.meta, seq)] = OpMeta {
            opcode: Some(WcOpcode::RDMA_WRITE),
            signaled: true,
            internal: true,
            ..OpMeta::default()
        };
        let marker = SendRequest {
            wr_id: seq,
            opcode: SendOpcode::Write,
            payload: Payload::Inline(&[]),
            remote: Some(RemoteSlice {
                len: 0,
                ..self.peer
            }),
            signaled: true,
        };
        let mut batch = self.chain.batch(self.ep.qp());
        batch.push(marker)?;
        batch.post()?;
        self.stats.posted += 1;
        self.stats.doorbells += 1;
        Ok(())
    }

    /// Asks rdma_cm (without blocking) whether the peer disconnected; if
    /// so this side disconnects too and the QP flushes. Returns whether it did.
    pub fn peer_gone(&mut self) -> Result<bool> {
        self.ep.peer_gone()
    }

    /// Makes sure a completion is coming for everything posted: when the
    /// newest requests are unsignaled, posts a signaled zero-length RDMA
    /// WRITE behind them (its completion retires them all).
    pub fn flush_tail(&mut self) -> Result<()> {
        if self.sq.outstanding() == 0 || self.sq.signal_in_flight() {
            return Ok(());
        }
        while self.sq.room() == 0 {
            self.reap()?;
        }
        let mut b = self.batch();
        b.signal_next();
        let seq = b.write(&[], 0, None)?;
        b.post()?;
        let len = self.meta.len() as u64;
        self.meta[(seq % len) as usize].internal = true;
        Ok(())
    }

    /// Waits, up to the completion timeout, until every posted request has
    /// retired; completion events met meanwhile go to `on`.
    pub fn wait_idle(&mut self, mut on: impl FnMut(Event<'_>)) -> Result<()> {
        self.flush_tail()?;
        let mut wait = BoundedWait::new(self.completion_timeout, "the send queue to drain");
        while self.sq.outstanding() > 0 {
            self.poll_send(&mut on)?;
            if let Some(waited) = wait.tick()? {
                self.check_peer(waited)?;
            }
        }
        Ok(())
    }

    /// Polls both completion queues once and hands every event to `on`.
    /// Returns how many completions were taken.
    #[inline]
    pub fn poll(&mut self, mut on: impl FnMut(Event<'_>)) -> Result<usize> {
        let sent = self.poll_send(&mut on)?;
        let recvd = self.poll_recv(&mut on)?;
        Ok(sent + recvd)
    }

    #[inline]
    fn poll_send(&mut self, on: &mut impl FnMut(Event<'_>)) -> Result<usize> {
        let wcs = self.ep_send_poll()?;
        for i in 0..wcs {
            let (seq, status, vendor_err) = {
                let wc = &self.wcs[i];
                (wc.wr_id(), wc.status(), wc.vendor_err())
            };
            let range = self.sq.retire_through(seq);
            for s in range {
                let meta = self.meta[meta_index(&self.meta, s)];
                if meta.send_slot {
                    self.send_cursor.release(1);
                }
                let read_pos = if meta.read_slot {
                    let pos = self.read_cursor.tail;
                    self.read_cursor.release(1);
                    Some(pos)
                } else {
                    None
                };
                let ok = status.is_success() || (s < seq && self.failure.is_none());
                if ok {
                    self.stats.completed += 1;
                    if s == seq && meta.signaled {
                        match read_pos {
                            Some(pos) => {
                                let layout = self.rings.layout;
                                let range = layout.range(layout.slot(pos), meta.read_len as usize);
                                on(Event::ReadCompleted {
                                    seq,
                                    data: &self.rings.read.as_slice()[range],
                                });
                            }
                            None if meta.internal => {}
                            None => on(Event::Completed {
                                seq,
                                opcode: meta.opcode.unwrap_or(WcOpcode::SEND),
                            }),
                        }
                    }
                } else if self.failure.is_none()
                    && s == seq
                    && !(self.closing && status == WcStatus::WR_FLUSH_ERR)
                {
                    let err = WcError {
                        wr_id: seq,
                        opcode: meta.opcode,
                        status,
                        vendor_err,
                    };
                    self.failure = Some(err);
                    self.stats.failed += 1;
                    on(Event::Failed(err));
                } else {
                    // After the failure every request completes, flushed.
                    self.stats.flushed += 1;
                    on(Event::Flushed {
                        seq: s,
                        opcode: meta.opcode,
                    });
                }
            }
        }
        Ok(wcs)
    }

    #[inline]
    fn ep_send_poll(&mut self) -> Result<usize> {
        Ok(self.ep.poll_send(&mut self.wcs)?.len())
    }

    #[inline]
    fn poll_recv(&mut self, on: &mut impl FnMut(Event<'_>)) -> Result<usize> {
        let n = self.ep.poll_recv(&mut self.wcs)?.len();
        for i in 0..n {
            let wc = &self.wcs[i];
            let layout = self.rings.recv_layout;
            self.recv_done += 1;
            if wc.is_success() {
                self.stats.received += 1;
                match wc.imm() {
                    Some(imm) if wc.opcode() == WcOpcode::RECV_RDMA_WITH_IMM => {
                        on(Event::WriteImm {
                            imm,
                            len: wc.byte_len(),
                        })
                    }
                    _ => {
                        let range = layout.range(layout.slot(wc.wr_id()), wc.byte_len() as usize);
                        on(Event::Received {
                            data: &self.rings.recv.as_slice()[range],
                        });
                    }
                }
            } else if wc.status() == WcStatus::WR_FLUSH_ERR || self.failure.is_some() {
                self.stats.recv_flushed += 1;
                on(Event::RecvFlushed);
            } else {
                let err = WcError {
                    wr_id: wc.wr_id(),
                    opcode: Some(WcOpcode::RECV),
                    status: wc.status(),
                    vendor_err: wc.vendor_err(),
                };
                self.failure = Some(err);
                self.stats.failed += 1;
                on(Event::Failed(err));
            }
        }
        if n > 0 && self.failure.is_none() && !self.closing {
            self.rings.refill(&mut self.ep, self.recv_done)?;
        }
        Ok(n)
    }

    /// Waits for the next SEND or WRITE_WITH_IMM, up to the completion
    /// timeout. While it waits longer than a few polls it also reaps send
    /// completions (bookkeeping, and to surface a failed send).
    #[inline]
    pub fn recv(&mut self) -> Result<Incoming<'_>> {
        let mut wait = BoundedWait::new(self.completion_timeout, "a message from the peer");
        loop {
            match self.poll_one_recv() {
                Ok(Some(arrived)) => return Ok(self.incoming(arrived)),
                Ok(None) => {}
                Err(e) => return Err(self.ended_error(e)),
            }
            if let Some(waited) = wait.tick()? {
                if self.sq.outstanding() > 0 {
                    self.reap()?;
                }
                self.check_peer(waited)?;
            }
        }
    }

    /// The next SEND or WRITE_WITH_IMM if one has arrived: one poll of the
    /// receive CQ, no waiting. Send completions are left for [`reap`].
    ///
    /// [`reap`]: Connection::reap
    #[inline]
    pub fn try_recv(&mut self) -> Result<Option<Incoming<'_>>> {
        Ok(self.poll_one_recv()?.map(|arrived| self.incoming(arrived)))
    }

    /// Polls the receive CQ for one completion, after re-posting the
    /// receives that earlier calls consumed. An error completion fails the
    /// connection (a flushed one reports its cause).
    #[inline]
    fn poll_one_recv(&mut self) -> Result<Option<Arrived>> {
        if let Some(f) = self.failure {
            return Err(Error::Completion(f));
        }
        if self.rings.recv_posted - self.recv_done < self.rings.recv_layout.count() as u64 {
            self.rings.refill(&mut self.ep, self.recv_done)?;
        }
        if self.ep.poll_recv(&mut self.wcs[..1])?.is_empty() {
            return Ok(None);
        }
        let wc = &self.wcs[0];
        self.recv_done += 1;
        if !wc.is_success() {
            return Err(self.recv_failed());
        }
        self.stats.received += 1;
        Ok(Some(Arrived {
            imm: wc.imm(),
            len: wc.byte_len(),
            pos: wc.wr_id(),
            write_imm: wc.opcode() == WcOpcode::RECV_RDMA_WITH_IMM,
        }))
    }

    /// The error for the failed receive completion in `wcs[0]`.
    #[cold]
    #[inline(never)]
    fn recv_failed(&mut self) -> Error {
        let wc = &self.wcs[0];
        let err = WcError {
            wr_id: wc.wr_id(),
            opcode: Some(WcOpcode::RECV),
            status: wc.status(),
            vendor_err: wc.vendor_err(),
        };
        if err.status == WcStatus::WR_FLUSH_ERR {
            // A flushed receive is a consequence; the cause (a send that
            // failed) may still sit in the send CQ.
            self.stats.recv_flushed += 1;
            if self.failure.is_none() {
                if let Err(e) = self.poll_send(&mut |_| {}) {
                    return e;
                }
            }
            return match self.failure {
                Some(cause) => Error::Completion(cause),
                None if self.ep.was_disconnected() => self.ep.end_error(),
                None => Error::Completion(err),
            };
        }
        if self.failure.is_none() {
            self.failure = Some(err);
            self.stats.failed += 1;
        }
        Error::Completion(err)
    }

    /// What a receive completion delivered, as a borrow of the ring.
    #[inline]
    fn incoming(&self, arrived: Arrived) -> Incoming<'_> {
        if arrived.write_imm {
            return Incoming {
                data: &[],
                imm: arrived.imm,
                len: arrived.len,
            };
        }
        let layout = self.rings.recv_layout;
        let range = layout.range(layout.slot(arrived.pos), arrived.len as usize);
        Incoming {
            data: &self.rings.recv.as_slice()[range],
            imm: arrived.imm,
            len: arrived.len,
        }
    }
}

/// A successful receive completion, copied out of the CQ entry.
#[derive(Debug, Clone, Copy)]
struct Arrived {
    imm: Option<u32>,
    len: u32,
    /// The receive's position in the receive ring (its wr_id).
    pos: u64,
    write_imm: bool,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Err(e) = self.drain() {
            tracing::warn!(error = %e, "connection did not drain cleanly at close");
        }
    }
}

/// Where sequence number `seq` keeps its [`OpMeta`] (the table's length is
/// a power of two at least the send-queue depth).
#[inline]
fn meta_index(meta: &[OpMeta], seq: u64) -> usize {
    (seq as usize) & (meta.len() - 1)
}

/// `data` as a request's payload: inline up to `inline_threshold`, else
/// copied into the next send-ring slot (`true`: a slot was claimed).
#[inline]
fn stage_payload<'d>(
    data: &'d [u8],
    inline_threshold: usize,
    cursor: &mut RingCursor,
    layout: SlotLayout,
    ring: &mut MemoryRegion,
) -> Result<(Payload<'d>, bool)> {
    if data.len() <= inline_threshold {
        return Ok((Payload::Inline(data), false));
    }
    ring_payload(cursor, layout, ring, data.len(), |slot| {
        slot.copy_from_slice(data);
        Ok(())
    })
}

/// Claims a send-ring slot and lets `fill` write `len` bytes into it —
/// registered memory, so the NIC reads them from there with no copy. An
/// error from `fill` gives the slot back.
#[inline]
fn ring_payload<'d>(
    cursor: &mut RingCursor,
    layout: SlotLayout,
    ring: &mut MemoryRegion,
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
) -> Result<(Payload<'d>, bool)> {
    let range = claim_slot(cursor, layout, len, "the send ring")?;
    if let Err(source) = fill(&mut ring.as_mut_slice()[range.clone()]) {
        cursor.head -= 1;
        return Err(Error::Exchange {
            op: "filling a send-ring slot",
            source,
        });
    }
    Ok((Payload::Registered(ring.slice(range)?), true))
}

#[cold]
#[inline(never)]
fn too_big_for_slot(len: usize, slot_size: usize) -> Error {
    Error::Config(format!("{len} bytes exceed the slot size {slot_size}"))
}

/// Claims the next slot of a ring for `len` bytes: its byte range.
fn claim_slot(
    cursor: &mut RingCursor,
    layout: SlotLayout,
    len: usize,
    ring: &'static str,
) -> Result<std::ops::Range<usize>> {
    if len > layout.size() {
        return Err(too_big_for_slot(len, layout.size()));
    }
    let Some(pos) = cursor.claim(layout.count()) else {
        return Err(Error::Full { what: ring });
    };
    Ok(layout.range(layout.slot(pos), len))
}

/// Requests gathered for one doorbell. Dropping it unposted forgets them
/// (the accounting rolls back); nothing reaches the NIC.
#[must_use = "a batch posts nothing until .post() is called"]
pub struct Batch<'c, 'd> {
    // Some until posted.
    sends: Option<crate::sys::chain::SendBatch<'c, 'd>>,
    sq: &'c mut SendQueueAccount,
    meta: &'c mut [OpMeta],
    send_cursor: &'c mut RingCursor,
    read_cursor: &'c mut RingCursor,
    send_ring: &'c mut MemoryRegion,
    read_ring: &'c MemoryRegion,
    layout: SlotLayout,
    peer: RemoteSlice,
    inline_threshold: usize,
    failure: Option<&'c WcError>,
    stats: &'c mut Stats,
    mark: (u64, RingCursor, RingCursor),
    force_signal: bool,
}

impl std::fmt::Debug for Batch<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("len", &self.len()).finish()
    }
}

impl<'c, 'd> Batch<'c, 'd> {
    pub fn len(&self) -> usize {
        self.sends.as_ref().map_or(0, |b| b.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn sends(&mut self) -> &mut crate::sys::chain::SendBatch<'c, 'd> {
        self.sends
            .as_mut()
            .expect("a batch is used only until it is posted")
    }

    /// Requests a completion for the next request pushed.
    pub fn signal_next(&mut self) -> &mut Self {
        self.force_signal = true;
        self
    }

    fn payload(&mut self, data: &'d [u8]) -> Result<(Payload<'d>, bool)> {
        stage_payload(
            data,
            self.inline_threshold,
            self.send_cursor,
            self.layout,
            self.send_ring,
        )
    }

    /// Adds an RDMA WRITE (with `imm`: WRITE_WITH_IMM) of `len` bytes that
    /// `fill` writes straight into a registered send-ring slot — e.g. a
    /// file read with no intermediate buffer. An error from `fill` adds
    /// nothing.
    #[inline]
    pub fn write_from(
        &mut self,
        len: usize,
        remote_offset: u64,
        imm: Option<u32>,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, len as u64)?;
        let (payload, slot) =
            ring_payload(self.send_cursor, self.layout, self.send_ring, len, fill)?;
        let opcode = imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm);
        self.push(opcode, payload, Some(remote), (slot, false, 0))
    }

    /// Adds one request whose payload (and ring slots, per `slots`) were
    /// just claimed; when it cannot be added, the claims are undone, so a
    /// refused request holds no ring slot.
    fn push(
        &mut self,
        opcode: SendOpcode,
        payload: Payload<'d>,
        remote: Option<RemoteSlice>,
        slots: (bool, bool, u32),
    ) -> Result<u64> {
        let result = self.admit_and_patch(opcode, payload, remote, slots);
        if result.is_err() {
            // The claims were the newest ones: giving them back is exact.
            self.send_cursor.head -= u64::from(slots.0);
            self.read_cursor.head -= u64::from(slots.1);
        }
        result
    }

    fn admit_and_patch(
        &mut self,
        opcode: SendOpcode,
        payload: Payload<'d>,
        remote: Option<RemoteSlice>,
        slots: (bool, bool, u32),
    ) -> Result<u64> {
        if let Some(f) = self.failure {
            return Err(Error::Completion(*f));
        }
        if self.sends().is_full() {
            return Err(Error::Full { what: "the batch" });
        }
        let must_signal = std::mem::take(&mut self.force_signal) || opcode == SendOpcode::Read;
        let Some((seq, signaled)) = self.sq.admit(must_signal) else {
            return Err(Error::Full {
                what: "the send queue",
            });
        };
        if let Err(e) = self.sends().push(SendRequest {
            wr_id: seq,
            opcode,
            payload,
            remote,
            signaled,
        }) {
            self.sq.rollback(seq);
            return Err(e);
        }
        self.meta[meta_index(self.meta, seq)] = OpMeta::posted(opcode, signaled, slots);
        Ok(seq)
    }

    /// Adds a SEND of `data` (inline when small, else via the send ring).
    #[inline]
    pub fn send(&mut self, data: &'d [u8]) -> Result<u64> {
        let (payload, slot) = self.payload(data)?;
        self.push(SendOpcode::Send, payload, None, (slot, false, 0))
    }

    /// Adds a SEND of `len` bytes that `fill` writes straight into a
    /// registered send-ring slot (see [`Batch::write_from`]). An error
    /// from `fill` adds nothing.
    #[inline]
    pub fn send_from(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        let (payload, slot) =
            ring_payload(self.send_cursor, self.layout, self.send_ring, len, fill)?;
        self.push(SendOpcode::Send, payload, None, (slot, false, 0))
    }

    /// Adds an RDMA WRITE (with an immediate: WRITE_WITH_IMM) of `data` to
    /// `remote_offset` in the peer's target ring.
    #[inline]
    pub fn write(&mut self, data: &'d [u8], remote_offset: u64, imm: Option<u32>) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, data.len() as u64)?;
        let (payload, slot) = self.payload(data)?;
        let opcode = imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm);
        self.push(opcode, payload, Some(remote), (slot, false, 0))
    }

    /// Adds an RDMA WRITE of `data` to any region the peer advertised
    /// (not only its target ring). Nothing local can check `remote`: a
    /// wrong one fails at the peer's NIC with REM_ACCESS_ERR.
    #[inline]
    pub fn write_remote(
        &mut self,
        data: &'d [u8],
        remote: RemoteSlice,
        imm: Option<u32>,
    ) -> Result<u64> {
        let remote = remote.sub(0, data.len() as u64)?;
        let (payload, slot) = self.payload(data)?;
        let opcode = imm.map_or(SendOpcode::Write, SendOpcode::WriteWithImm);
        self.push(opcode, payload, Some(remote), (slot, false, 0))
    }

    /// Adds an RDMA READ of `len` bytes at `remote_offset` of the peer's
    /// target ring; the data arrive with [`Event::ReadCompleted`].
    #[inline]
    pub fn read(&mut self, remote_offset: u64, len: usize) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, len as u64)?;
        let range = claim_slot(self.read_cursor, self.layout, len, "the read ring")?;
        let local = self.read_ring.slice(range)?;
        self.push(
            SendOpcode::Read,
            Payload::Registered(local),
            Some(remote),
            (false, true, len as u32),
        )
    }

    /// Posts the batch with one doorbell. Returns how many requests went.
    #[inline]
    pub fn post(mut self) -> Result<usize> {
        let sends = self.sends.take().expect("posted once");
        match sends.post() {
            Ok(n) => {
                self.stats.posted += n as u64;
                self.stats.doorbells += u64::from(n > 0);
                Ok(n)
            }
            Err(Error::PostSend { wr_id, source }) if wr_id == self.mark.0 => {
                // Nothing reached the queue: forget the whole batch.
                self.rollback();
                Err(Error::PostSend { wr_id, source })
            }
            Err(e) => Err(e),
        }
    }

    fn rollback(&mut self) {
        self.sq.rollback(self.mark.0);
        *self.send_cursor = self.mark.1;
        *self.read_cursor = self.mark.2;
    }
}

impl Drop for Batch<'_, '_> {
    fn drop(&mut self) {
        if self.sends.is_some() {
            // Never posted: the NIC saw none of it.
            self.rollback();
        }
    }
}
