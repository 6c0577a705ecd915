//! A queue pair with its completion queues, and bounded waits on them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::completion::WcOpcode;
use crate::config::QpConfig;
use crate::error::{Error, Result};
use crate::sys::cm::CmId;
use crate::sys::cq::{CompletionQueue, WorkCompletion};
use crate::sys::device::{Context, PortAttr};
use crate::sys::mem::{Buffer, PageSize};
use crate::sys::mr::{Access, MemoryRegion, RemoteSlice};
use crate::sys::pd::ProtectionDomain;
use crate::sys::qp::{QpState, QueuePair};
use crate::wait::BoundedWait;

/// A successful completion, copied out of the CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
}

/// A reliable-connected queue pair, its send and receive CQs, and its PD.
///
/// Built unconnected by [`crate::connect::cm`] or [`crate::connect::oob`],
/// so memory can be registered and receives posted before the peer can send.
pub struct Endpoint {
    // Field order is drop order: the QP goes before its CQs, PD and CM id.
    qp: QueuePair,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
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
        let send_cq = CompletionQueue::new(ctx, cfg.cq_depth)?;
        let recv_cq = CompletionQueue::new(ctx, cfg.cq_depth)?;
        let qp = match &cm_id {
            Some(id) => QueuePair::with_cm_id(id, &pd, &send_cq, &recv_cq, cfg)?,
            None => QueuePair::new(&pd, &send_cq, &recv_cq, cfg)?,
        };
        Ok(Endpoint {
            qp,
            send_cq,
            recv_cq,
            pd,
            cm_id,
            port,
            port_attr,
            peer_private_data: Vec::new(),
            remote_region: None,
            connected: false,
            ever_connected: false,
            ended_by: None,
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

    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn device_name(&self) -> &str {
        self.pd.context().name()
    }

    pub fn port(&self) -> u8 {
        self.port
    }

    pub fn port_attr(&self) -> &PortAttr {
        &self.port_attr
    }

    /// Inline bytes the QP accepts per work request.
    pub fn max_inline(&self) -> u32 {
        self.qp.max_inline()
    }

    pub fn state(&self) -> Result<QpState> {
        self.qp.state()
    }

    /// Maps `len` bytes and registers them on this endpoint's PD. Fails
    /// first with [`crate::Error::Memlock`] when the locked-memory limit
    /// cannot take them (the kernel would refuse with a bare ENOMEM).
    pub fn register(&self, len: usize, page: PageSize, access: Access) -> Result<MemoryRegion> {
        let pages = len.max(1).div_ceil(page.bytes()) * page.bytes();
        crate::sys::mem::check_memlock(pages as u64)?;
        MemoryRegion::register(&self.pd, Buffer::new(len, page)?, access)
    }

    /// The private data the peer sent in the rdma_cm handshake.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// The region the peer exposed (out-of-band record), if any.
    pub fn remote_region(&self) -> Option<RemoteSlice> {
        self.remote_region
    }

    pub fn poll_send<'a>(&self, out: &'a mut [WorkCompletion]) -> Result<&'a [WorkCompletion]> {
        self.send_cq.poll(out)
    }

    pub fn poll_recv<'a>(&self, out: &'a mut [WorkCompletion]) -> Result<&'a [WorkCompletion]> {
        self.recv_cq.poll(out)
    }

    /// Busy-polls the send CQ for one completion until `timeout` passes.
    /// An error completion becomes [`Error::Completion`].
    pub fn wait_send(&mut self, timeout: Duration) -> Result<Completion> {
        self.wait_one(true, timeout, "a send-queue completion")
    }

    /// Busy-polls the receive CQ for one completion until `timeout` passes.
    pub fn wait_recv(&mut self, timeout: Duration) -> Result<Completion> {
        self.wait_one(false, timeout, "a receive completion")
    }

    /// Whether this endpoint was connected and is no longer (either side
    /// disconnected, or the peer was found gone).
    pub fn was_disconnected(&self) -> bool {
        self.ever_connected && !self.connected
    }

    /// Why the connection ended, as an error: a device event, or the peer.
    pub fn end_error(&self) -> Error {
        match self.ended_by {
            Some(event) => Error::DeviceEvent {
                device: self.device_name().to_owned(),
                event,
            },
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
        // connection whichever way it was made.
        while let Some(ev) = self.pd.context().try_async_event()? {
            if ev.ends_connection(self.qp.handle()) {
                tracing::debug!(event = ev.name(), "device event ends the connection");
                self.connected = false;
                self.ended_by = Some(ev.name());
                let _ = self.qp.to_error();
                if let Some(id) = &self.cm_id {
                    let _ = id.disconnect();
                }
                return Ok(true);
            }
            tracing::debug!(event = ev.name(), "device event");
        }
        let Some(id) = &self.cm_id else {
            return Ok(false);
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
                    let _ = self.qp.to_error();
                }
                let _ = id.disconnect();
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Busy-polls one CQ for one completion, noticing an rdma_cm disconnect
    /// (which flushes the QP, so the wait ends with the error).
    fn wait_one(&mut self, send: bool, limit: Duration, what: &'static str) -> Result<Completion> {
        let mut wc = [WorkCompletion::zeroed()];
        let mut wait = BoundedWait::new(limit, what);
        let mut gone = false;
        loop {
            let cq = if send { &self.send_cq } else { &self.recv_cq };
            if let Some(c) = cq.poll(&mut wc)?.first() {
                return match c.result(None) {
                    Ok(()) => Ok(Completion {
                        wr_id: c.wr_id(),
                        opcode: c.opcode(),
                        byte_len: c.byte_len(),
                        imm: c.imm(),
                    }),
                    // Flushed because the peer or the port went: say that.
                    Err(e) if gone && e.status == crate::completion::WcStatus::WR_FLUSH_ERR => {
                        Err(self.end_error())
                    }
                    Err(e) => Err(e.into()),
                };
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
            None => self.qp.to_error(),
        }
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
