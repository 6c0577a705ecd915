//! A queue pair with its completion queues, bounded waits on them, and
//! the low-level way to use it: registered regions handed to the NIC by a
//! post and given back by the completion ([`Endpoint::post`],
//! [`Endpoint::complete`]) — the classic examples' stop-and-wait style.
//! A [`crate::Connection`] builds its rings on an endpoint instead.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::PageSize;
use crate::config::QpConfig;
use crate::error::{Error, Misuse, Result};
use crate::status::{WcOpcode, WcStatus};
use crate::sys::cm::CmId;
use crate::sys::cq::{CompletionQueue, CqPoller, WorkCompletion};
use crate::sys::device::{Context, PortAttr};
use crate::sys::mr::{Access, Registration, RemoteSlice};
use crate::sys::parked::{ParkingLot, Request};
use crate::sys::pd::ProtectionDomain;
use crate::sys::posted::{post_region, post_region_recv, CompleteError, Posted};
use crate::sys::qp::{QpState, QueuePair, Queues};
use crate::sys::raw::RawQueuePair;
use crate::sys::region::{MemoryRegion, RegionOp, RegionRefused, SharedRegion};
use crate::sys::wr::Indeterminate;
use crate::sys::wr_id::{self, Owner};
use crate::wait::BoundedWait;

/// A successful work completion, copied out of the CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkDone {
    /// The request's id: the one a raw post was given (from
    /// [`Endpoint::wait_send`] and [`Endpoint::wait_recv`]), or
    /// [`Posted::wr_id`] for a region's request (from
    /// [`Endpoint::complete`]).
    pub wr_id: u64,
    /// What completed, as the completion says (`SEND`, `RDMA_WRITE`,
    /// `RDMA_READ`, `RECV`, `RECV_RDMA_WITH_IMM`).
    pub opcode: WcOpcode,
    /// Bytes the completion reports transferred (`byte_len`): for a
    /// receive, the length of the message that arrived (for
    /// `RECV_RDMA_WITH_IMM`, of the data the peer wrote). Rely on it for
    /// receives only: not every device fills it in for send-queue requests.
    pub byte_len: u32,
    /// The immediate value, in host order, when the completion carries one
    /// (a receive consumed by a WRITE_WITH_IMM or a SEND with immediate).
    pub imm: Option<u32>,
}

/// A [`Posted`] request's completion, with its region back.
#[derive(Debug)]
pub struct Completed {
    /// The region the request used (`None` for a receive posted without one).
    pub region: Option<MemoryRegion>,
    /// The request's successful completion.
    pub done: WorkDone,
}

/// A reliable-connected queue pair, its send and receive CQs, and its PD.
///
/// Built unconnected by [`crate::connect::cm`] or [`crate::connect::oob`],
/// so memory can be registered and receives posted before the peer can send.
pub struct Endpoint {
    // Field order is drop order: the QP goes before its CQs, PD and CM id.
    qp: QueuePair,
    send_cq: Option<CqPoller>,
    recv_cq: Option<CqPoller>,
    pd: Arc<ProtectionDomain>,
    cm_id: Option<Arc<CmId>>,
    port: u8,
    port_attr: PortAttr,
    peer_private_data: Vec<u8>,
    remote_region: Option<RemoteSlice>,
    connected: bool,
    ever_connected: bool,
    /// The device event that ended the connection, if one did.
    ended_by: Option<&'static str>,
    /// A post the provider may have queued without saying so, which moved
    /// the QP to ERR, if one did.
    failed_post: Option<Indeterminate>,
    /// Completions polled while waiting for another request's.
    stash: Stash,
}

/// Completions polled while waiting for another request's, per queue and
/// oldest first: a region's request takes its own from here
/// ([`Endpoint::complete`]), raw requests theirs
/// ([`Endpoint::wait_send`], [`Endpoint::wait_recv`]). Each holds at most
/// one completion per request posted, so at most the queues' depths.
#[derive(Debug, Default)]
struct Stash {
    send: VecDeque<WorkCompletion>,
    recv: VecDeque<WorkCompletion>,
}

impl Stash {
    /// Drops the kept completions of requests whose `Posted` was dropped
    /// since, freeing the regions parked for them in `lot`.
    fn free_parked(&mut self, lot: &ParkingLot) {
        for receive in [false, true] {
            self.queue(receive).retain(|wc| {
                let request = Request {
                    wr_id: wc.wr_id(),
                    receive,
                };
                !(wr_id::owner(wc.wr_id()) == Owner::Owned && lot.completed(request))
            });
        }
    }

    fn queue(&mut self, receive: bool) -> &mut VecDeque<WorkCompletion> {
        if receive {
            &mut self.recv
        } else {
            &mut self.send
        }
    }

    fn keep(&mut self, receive: bool, wc: WorkCompletion) {
        self.queue(receive).push_back(wc);
    }

    /// The oldest kept completion that `wanted` picks.
    fn take(
        &mut self,
        receive: bool,
        wanted: impl Fn(&WorkCompletion) -> bool,
    ) -> Option<WorkCompletion> {
        let queue = self.queue(receive);
        let at = queue.iter().position(wanted)?;
        queue.remove(at)
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("device", &self.pd.context().name())
            .field("qp_num", &self.qp.qp_num())
            .field("connected", &self.connected)
            .finish()
    }
}

/// The two pollers of an endpoint's CQs, taken by a connection.
#[derive(Debug)]
pub(crate) struct Pollers {
    pub send: CqPoller,
    pub recv: CqPoller,
}

impl Endpoint {
    pub(crate) fn create(
        ctx: &Arc<Context>,
        cm_id: Option<Arc<CmId>>,
        cfg: &QpConfig,
    ) -> Result<Endpoint> {
        cfg.validate()?;
        let port = cm_id
            .as_ref()
            .map(|id| id.port_num())
            .filter(|p| *p != 0)
            .unwrap_or(cfg.port);
        let port_attr = ctx.query_port(port)?;
        if !port_attr.is_active() {
            return Err(Error::PortNotActive {
                device: ctx.name().to_owned(),
                port,
                state: port_attr.state_name(),
            });
        }
        let pd = ProtectionDomain::new(ctx)?;
        let (send_owner, send_cq) = CompletionQueue::new(ctx, cfg.cq_depth)?;
        let (recv_owner, recv_cq) = CompletionQueue::new(ctx, cfg.cq_depth)?;
        let queues = Queues::own(&send_owner, &recv_owner);
        let mut endpoint = Endpoint::on(&pd, queues, cm_id, port, port_attr, cfg)?;
        endpoint.send_cq = Some(send_cq);
        endpoint.recv_cq = Some(recv_cq);
        Ok(endpoint)
    }

    /// An endpoint whose queue pair is made in `pd` on `queues` that
    /// others share (a shared receive queue, completion queues polled by
    /// their owner): it has no pollers of its own.
    pub(crate) fn create_shared(
        pd: &Arc<ProtectionDomain>,
        queues: Queues<'_>,
        cfg: &QpConfig,
    ) -> Result<Endpoint> {
        cfg.validate()?;
        let port_attr = pd.context().query_port(cfg.port)?;
        if !port_attr.is_active() {
            return Err(Error::PortNotActive {
                device: pd.context().name().to_owned(),
                port: cfg.port,
                state: port_attr.state_name(),
            });
        }
        Endpoint::on(pd, queues, None, cfg.port, port_attr, cfg)
    }

    /// [`create_shared`](Self::create_shared) for the id of an rdma_cm
    /// connect request (`pd` must be on the id's own context: librdmacm
    /// makes the queue pair, and `rdma_accept` moves it to RTS).
    pub(crate) fn create_shared_on_cm(
        pd: &Arc<ProtectionDomain>,
        queues: Queues<'_>,
        cm_id: Arc<CmId>,
        cfg: &QpConfig,
    ) -> Result<Endpoint> {
        cfg.validate()?;
        let port = Some(cm_id.port_num())
            .filter(|p| *p != 0)
            .unwrap_or(cfg.port);
        let port_attr = pd.context().query_port(port)?;
        if !port_attr.is_active() {
            return Err(Error::PortNotActive {
                device: pd.context().name().to_owned(),
                port,
                state: port_attr.state_name(),
            });
        }
        Endpoint::on(pd, queues, Some(cm_id), port, port_attr, cfg)
    }

    fn on(
        pd: &Arc<ProtectionDomain>,
        queues: Queues<'_>,
        cm_id: Option<Arc<CmId>>,
        port: u8,
        port_attr: PortAttr,
        cfg: &QpConfig,
    ) -> Result<Endpoint> {
        let qp = match &cm_id {
            Some(id) => QueuePair::with_cm_id(id, pd, queues, cfg)?,
            None => QueuePair::new(pd, queues, cfg)?,
        };
        Ok(Endpoint {
            qp,
            send_cq: None,
            recv_cq: None,
            pd: Arc::clone(pd),
            cm_id,
            port,
            port_attr,
            peer_private_data: Vec::new(),
            remote_region: None,
            connected: false,
            ever_connected: false,
            ended_by: None,
            failed_post: None,
            stash: Stash::default(),
        })
    }

    pub(crate) fn mark_connected(
        &mut self,
        peer_private_data: Vec<u8>,
        remote_region: Option<RemoteSlice>,
    ) {
        self.peer_private_data = peer_private_data;
        self.remote_region = remote_region;
        self.connected = true;
        self.ever_connected = true;
    }

    /// The device context its queue pair lives on.
    pub(crate) fn context(&self) -> &Arc<Context> {
        self.pd.context()
    }

    pub(crate) fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The pollers of both CQs, for a connection that now owns them (a
    /// second call finds none).
    pub(crate) fn take_pollers(&mut self) -> Result<Pollers> {
        match (self.send_cq.take(), self.recv_cq.take()) {
            (Some(send), Some(recv)) => Ok(Pollers { send, recv }),
            _ => Err(pollers_taken()),
        }
    }

    /// The name of the RDMA device the queue pair is on (e.g. `mlx5_0`,
    /// `rxe0`).
    pub fn device_name(&self) -> &str {
        self.pd.context().name()
    }

    /// The device port the queue pair uses (1-based): the one rdma_cm
    /// bound, or else [`QpConfig::port`].
    pub fn port(&self) -> u8 {
        self.port
    }

    /// What `ibv_query_port` said about that port when the endpoint was
    /// created; not refreshed since.
    pub fn port_attr(&self) -> &PortAttr {
        &self.port_attr
    }

    /// Inline bytes the QP accepts per work request.
    pub fn max_inline(&self) -> u32 {
        self.qp.max_inline()
    }

    /// The queue pair's number (24 bits), by which the peer addresses it.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The queue pair's state, as the device reports it now.
    ///
    /// ```no_run
    /// fn ready(ep: &pinpoll::Endpoint) -> pinpoll::Result<bool> {
    ///     Ok(ep.state()? == pinpoll::QpState::Rts)
    /// }
    /// ```
    pub fn state(&self) -> Result<QpState> {
        self.qp.state()
    }

    /// Maps and registers `len` bytes on this endpoint's PD, checking the
    /// locked-memory limit first (the kernel would refuse with a bare ENOMEM).
    pub(crate) fn register_raw(
        &self,
        len: usize,
        page: PageSize,
        access: Access,
    ) -> Result<Registration> {
        let pages = crate::sys::mem::mapped_len(len, page)?;
        crate::sys::mem::check_memlock(pages as u64)?;
        Registration::new(&self.pd, len, page, access)
    }

    /// Registers `len` bytes that only this side's own work requests reach
    /// (`access` without REMOTE_WRITE: use [`register_shared`] for memory
    /// a peer writes).
    ///
    /// [`register_shared`]: Endpoint::register_shared
    pub fn register(&self, len: usize, page: PageSize, access: Access) -> Result<MemoryRegion> {
        if access.contains(Access::REMOTE_WRITE) {
            return Err(MemoryRegion::shared_access_error());
        }
        MemoryRegion::new(self.register_raw(len, page, access)?)
    }

    /// Registers `len` bytes the peer may RDMA WRITE (and, with
    /// `remote_read`, RDMA READ).
    pub fn register_shared(
        &self,
        len: usize,
        page: PageSize,
        remote_read: bool,
    ) -> Result<SharedRegion> {
        let mut access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        if remote_read {
            access = access | Access::REMOTE_READ;
        }
        Ok(SharedRegion::new(self.register_raw(len, page, access)?))
    }

    /// Posts `op` on the first `len` bytes of `region`, signaled. The
    /// region is the NIC's until [`complete`](Endpoint::complete) gives it
    /// back with the request's completion; a refused post (a full send
    /// queue, a bad length) gives it back in the error.
    ///
    /// Should the provider fail without saying whether it took the request
    /// (rxe does, when its doorbell fails after queueing), the request is
    /// taken as queued: the queue pair is moved to ERR, the request
    /// completes flushed, and `complete` gives the region back with
    /// [`Error::PostIndeterminate`].
    ///
    /// ```no_run
    /// # fn run(ep: &mut pinpoll::Endpoint) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use pinpoll::{Access, PageSize, RegionOp};
    ///
    /// let mut region = ep.register(4096, PageSize::Base, Access::LOCAL_READ)?;
    /// region.as_mut_slice()[..5].copy_from_slice(b"hello");
    /// // The region moves to the NIC; a refusal hands it back in the error.
    /// let posted = ep.post(region, 5, RegionOp::Send).map_err(|refused| refused.error)?;
    /// let done = ep.complete(posted, Duration::from_secs(5))?;
    /// let region = done.region.expect("a SEND's region comes back"); // yours again
    /// # drop(region); Ok(()) }
    /// ```
    // The region comes back in the error unboxed: a full queue is ordinary
    // back-pressure.
    #[allow(clippy::result_large_err)]
    pub fn post(
        &mut self,
        region: MemoryRegion,
        len: usize,
        op: RegionOp,
    ) -> Result<Posted, RegionRefused> {
        let (posted, unknown) = post_region(&mut self.qp, op, region, len)?;
        self.note_failed_post(unknown);
        Ok(posted)
    }

    /// Posts a receive into all of `region`, or with `None` one without a
    /// buffer (enough for a WRITE_WITH_IMM's notification); as
    /// [`post`](Endpoint::post) for what a failure gives back.
    #[allow(clippy::result_large_err)] // as for post
    pub fn post_recv(
        &mut self,
        region: Option<MemoryRegion>,
    ) -> Result<Posted, RegionRefused<Option<MemoryRegion>>> {
        let (posted, unknown) = post_region_recv(&mut self.qp, region)?;
        self.note_failed_post(unknown);
        Ok(posted)
    }

    /// A post failed without naming the request it refused (`unknown`):
    /// the QP is in ERR now, and the connection over.
    fn note_failed_post(&mut self, unknown: Option<Indeterminate>) {
        let Some(unknown) = unknown else {
            return;
        };
        tracing::warn!(error = %unknown.error(), "the queue pair is in ERR");
        self.failed_post = Some(unknown);
        if std::mem::take(&mut self.connected) {
            if let Some(id) = &self.cm_id {
                let _ = id.disconnect();
            }
        }
    }

    /// Waits up to `timeout` for `posted`'s completion and gives its region
    /// back.
    ///
    /// Requests complete in order per queue, so the next completion on its
    /// queue should be its own. When it is not, or none comes in time, the
    /// request is given back in [`CompleteError::Pending`]: its region is
    /// still the NIC's. (The other request's completion is kept for it, and
    /// the completion of a request whose `Posted` was dropped only frees
    /// that region.) An error completion of its own gives the region back
    /// in [`CompleteError::Failed`].
    // The request comes back in the error unboxed: a timeout is ordinary.
    #[allow(clippy::result_large_err)]
    pub fn complete(
        &mut self,
        posted: Posted,
        timeout: Duration,
    ) -> std::result::Result<Completed, CompleteError> {
        if !posted.is_on(&self.qp) {
            return Err(CompleteError::Pending {
                error: Misuse::OtherEndpoint.into(),
                posted,
            });
        }
        self.stash.free_parked(self.qp.lot());
        let receive = posted.is_receive();
        let kept = self.stash.take(receive, |wc| posted.is_completed_by(wc));
        let mut wait = BoundedWait::new(timeout, waiting_for(receive));
        let wc = match kept.map_or_else(|| self.next_completion(receive, &mut wait), Ok) {
            Ok(wc) => wc,
            Err(error) => return Err(CompleteError::Pending { error, posted }),
        };
        match posted.finish(&wc) {
            Ok(region) => match self.done(&wc, wc.wr_id()) {
                Ok(done) => Ok(Completed { region, done }),
                Err(error) => Err(CompleteError::Failed { error, region }),
            },
            Err(posted) => {
                let error = Error::UnexpectedCompletion {
                    expected: posted.wr_id(),
                    got: wc.wr_id(),
                };
                self.stash.keep(receive, wc);
                Err(CompleteError::Pending { error, posted })
            }
        }
    }

    /// The next completion on one CQ, within `wait`, for anyone but a
    /// request whose `Posted` was dropped: that one frees its parked
    /// region, and the wait goes on.
    fn next_completion(&mut self, receive: bool, wait: &mut BoundedWait) -> Result<WorkCompletion> {
        loop {
            let wc = self.wait_one(receive, wait)?;
            let request = Request {
                wr_id: wc.wr_id(),
                receive,
            };
            if wr_id::owner(wc.wr_id()) == Owner::Owned && self.qp.lot().completed(request) {
                continue;
            }
            return Ok(wc);
        }
    }

    /// The next completion of a raw request (see [`RawQueuePair`]) on one
    /// CQ, its id as the poster gave it; regions' completions met on the
    /// way are kept for them.
    fn next_raw(&mut self, receive: bool, timeout: Duration) -> Result<WorkDone> {
        self.stash.free_parked(self.qp.lot());
        let raw = |wc: &WorkCompletion| wr_id::owner(wc.wr_id()) != Owner::Owned;
        let mut wait = BoundedWait::new(timeout, waiting_for(receive));
        let wc = match self.stash.take(receive, raw) {
            Some(wc) => wc,
            None => loop {
                let wc = self.next_completion(receive, &mut wait)?;
                if raw(&wc) {
                    break wc;
                }
                self.stash.keep(receive, wc);
            },
        };
        let shown = match wr_id::owner(wc.wr_id()) {
            Owner::Raw(id) => id,
            _ => wc.wr_id(),
        };
        self.done(&wc, shown)
    }

    /// Keeps `memory`, which queued requests of this QP may name, until
    /// the QP is destroyed.
    pub(crate) fn park(&self, memory: Registration) {
        self.qp.lot().park(None, memory);
    }

    /// Memory this queue pair keeps because its requests may still name
    /// it: the rings of a connection whose setup failed after posting
    /// receives (freed when the queue pair is destroyed), and regions of
    /// dropped [`Posted`]s — each freed once its request's completion has
    /// been polled here
    /// (by the next [`complete`](Endpoint::complete),
    /// [`wait_send`](Endpoint::wait_send) or
    /// [`wait_recv`](Endpoint::wait_recv) if it was polled before the
    /// drop), or when the queue pair is destroyed.
    pub fn parked_regions(&self) -> usize {
        self.qp.lot().len()
    }

    /// Raw posting for experts (`unsafe`: nothing checks who owns the
    /// memory); see [`RawQueuePair`]. Their completions come from
    /// [`wait_send`](Endpoint::wait_send) and [`wait_recv`](Endpoint::wait_recv).
    pub fn raw(&mut self) -> RawQueuePair<'_> {
        RawQueuePair::new(&mut self.qp)
    }

    /// The private data the peer sent in the rdma_cm handshake.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// The region the peer exposed (out-of-band record), if any.
    pub fn remote_region(&self) -> Option<RemoteSlice> {
        self.remote_region
    }

    /// Busy-polls the send CQ until the completion of a raw request
    /// ([`raw`](Endpoint::raw)) arrives or `timeout` passes; its `wr_id`
    /// is the one posted. An error completion becomes
    /// [`Error::Completion`].
    pub fn wait_send(&mut self, timeout: Duration) -> Result<WorkDone> {
        self.next_raw(false, timeout)
    }

    /// Busy-polls the receive CQ for a raw receive's completion until
    /// `timeout` passes.
    pub fn wait_recv(&mut self, timeout: Duration) -> Result<WorkDone> {
        self.next_raw(true, timeout)
    }

    /// A polled completion as a result, its id shown as `wr_id`: a flush
    /// after the connection ended under us reports that end.
    fn done(&self, wc: &WorkCompletion, wr_id: u64) -> Result<WorkDone> {
        match wc.result(None) {
            Ok(()) => Ok(WorkDone {
                wr_id,
                opcode: wc.opcode(),
                byte_len: wc.byte_len(),
                imm: wc.imm(),
            }),
            Err(e)
                if e.status == WcStatus::WR_FLUSH_ERR
                    && (self.was_disconnected() || self.failed_post.is_some()) =>
            {
                Err(self.end_error())
            }
            Err(e) => Err(crate::status::WcError { wr_id, ..e }.into()),
        }
    }

    /// Whether this endpoint was connected and is no longer (either side
    /// disconnected, or the peer was found gone).
    pub fn was_disconnected(&self) -> bool {
        self.ever_connected && !self.connected
    }

    /// Why the connection ended, as an error: a device event (a post that
    /// failed meanwhile failed because of it), a post that failed without
    /// naming the refused request, or the peer.
    pub fn end_error(&self) -> Error {
        if let Some(event) = self.ended_by {
            return Error::DeviceEvent {
                device: self.device_name().to_owned(),
                event,
            };
        }
        match self.failed_post {
            Some(failed) => failed.error(),
            None => Error::Disconnected,
        }
    }

    /// Whether the connection ended under us: the device reported a port
    /// error or a fatal error (any connection method), or rdma_cm reported
    /// that the peer disconnected. If so, this side disconnects too and the
    /// QP goes to ERR: every posted request then completes, flushed, so
    /// waits end. Non-blocking (a system call or two); a peer that dies
    /// silently shows as a transport timeout or an unanswered heartbeat.
    pub fn peer_gone(&mut self) -> Result<bool> {
        if !self.connected {
            return Ok(false);
        }
        // The device: a port that went down or a fatal error ends the
        // connection whichever way it was made. A failed read of its events
        // must not hide rdma_cm's: it is returned only if they end nothing.
        let mut device_events = Ok(());
        loop {
            let ev = match self.pd.context().try_async_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    device_events = Err(e);
                    break;
                }
            };
            if ev.ends_connection(self.qp.handle()) {
                tracing::debug!(event = ev.name(), "device event ends the connection");
                self.connected = false;
                self.ended_by = Some(ev.name());
                let _ = self.qp.enter_error();
                if let Some(id) = &self.cm_id {
                    let _ = id.disconnect();
                }
                return Ok(true);
            }
            tracing::debug!(event = ev.name(), "device event");
        }
        let Some(id) = &self.cm_id else {
            return device_events.map(|()| false);
        };
        while let Some(ev) = id.channel().try_event()? {
            use crate::sys::cm::event;
            if matches!(ev.kind, event::DISCONNECTED | event::DEVICE_REMOVAL) {
                tracing::debug!(event = ev.name(), "peer gone");
                self.connected = false;
                if ev.kind == event::DEVICE_REMOVAL {
                    // The device is going away under the connection (e.g.
                    // `rdma link delete`): that, not the peer, ended it.
                    // Nothing may flush by itself any more: move the QP to
                    // ERR so every posted request completes, flushed.
                    self.ended_by = Some(ev.name());
                    let _ = self.qp.enter_error();
                }
                let _ = id.disconnect();
                return Ok(true);
            }
        }
        device_events.map(|()| false)
    }

    /// Busy-polls one CQ for one completion within `wait`, noticing an
    /// rdma_cm disconnect (which flushes the QP, so the wait ends).
    fn wait_one(&mut self, receive: bool, wait: &mut BoundedWait) -> Result<WorkCompletion> {
        let mut gone = false;
        loop {
            let poller = if receive {
                self.recv_cq.as_mut()
            } else {
                self.send_cq.as_mut()
            };
            if let Some(wc) = poller.ok_or_else(pollers_taken)?.poll_one()? {
                return Ok(wc);
            }
            if wait
                .tick()?
                .is_some_and(|waited| waited >= Duration::from_millis(1))
                && !gone
            {
                gone = self.peer_gone()?;
            }
        }
    }

    /// Disconnects (rdma_cm) or moves the QP to ERR (out-of-band), so the
    /// peer and every posted request learn the connection is over.
    pub fn disconnect(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.connected) {
            return Ok(());
        }
        match &self.cm_id {
            Some(id) => {
                id.disconnect()?;
                // The DISCONNECTED event confirms; bounded, and best effort:
                // a peer that vanished never answers.
                let _ = id
                    .channel()
                    .next_event("DISCONNECTED", Instant::now() + Duration::from_secs(2));
                Ok(())
            }
            None => self.qp.enter_error(),
        }
    }
}

/// What a wait on one CQ waits for, for its timeout's message.
fn waiting_for(receive: bool) -> &'static str {
    if receive {
        "a receive completion"
    } else {
        "a send-queue completion"
    }
}

#[cold]
fn pollers_taken() -> Error {
    Misuse::CompletionsTaken.into()
}

impl Endpoint {
    /// Ends the connection without waiting for anything: rdma_cm's
    /// disconnect (which tells the peer) if it has a CM id, and the queue
    /// pair to ERR either way, so that every posted request flushes. What
    /// a poller does, whose CM ids share one event channel: it takes
    /// their events in its own turn ([`disconnect`](Self::disconnect)
    /// waits on the channel for the id's DISCONNECTED, and would take the
    /// others' events).
    pub(crate) fn disconnect_now(&mut self) -> Result<()> {
        let told = match (std::mem::take(&mut self.connected), &self.cm_id) {
            (true, Some(id)) => id.disconnect(),
            _ => Ok(()),
        };
        let err = self.qp.enter_error();
        told.and(err)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.connected {
            if let Some(id) = &self.cm_id {
                // Tell the peer at once rather than letting it time out.
                let _ = id.disconnect();
            }
        }
    }
}
