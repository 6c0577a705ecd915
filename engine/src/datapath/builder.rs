//! A connection's registered rings, and the ways to a connected
//! [`Connection`]: rdma_cm (connect, accept) and an out-of-band TCP
//! exchange, each with the remote access and handshake data it needs.
//!
//! The rings are registered, and every receive posted, before the peer
//! can send. In the rdma_cm handshake each side's private data is its
//! target ring's [`RegionDescriptor`] followed by up to
//! [`MAX_PRIVATE_DATA`] bytes of the application's own.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::Connection;
use crate::config::EngineConfig;
use crate::connect::cm::{Connector, Listener, Request};
use crate::connect::oob::Prepared;
use crate::connect::RegionDescriptor;
use crate::endpoint::Endpoint;
use crate::error::{Error, Misuse, Result};
use crate::sys::cq::Reaper;
use crate::sys::layout::SlotLayout;
use crate::sys::mr::{Access, RemoteSlice};
use crate::sys::recv_queue::RecvQueue;
use crate::sys::region::SharedRegion;
use crate::sys::send_queue::SendQueue;

/// Application bytes a side may add to its handshake (an RC connect
/// request carries 56 bytes of private data; the descriptor takes 28).
pub const MAX_PRIVATE_DATA: usize = 56 - RegionDescriptor::LEN;

/// The registered rings of one connection, prepared (receives posted)
/// before connecting.
#[derive(Debug)]
pub(crate) struct Rings {
    pub(super) sq: SendQueue,
    pub(super) rq: RecvQueue,
    pub(super) target: SharedRegion,
}

impl Rings {
    /// Registers the four rings on `ep`'s PD with the least access each
    /// needs, takes the endpoint's CQs and posts a receive for every
    /// receive slot. The target ring allows the peer `remote_access`
    /// (REMOTE_WRITE and/or REMOTE_READ, or neither).
    pub(crate) fn prepare(
        ep: &mut Endpoint,
        cfg: &EngineConfig,
        remote_access: Access,
    ) -> Result<Rings> {
        cfg.validate()?;
        let layout = SlotLayout::new(cfg.slot_size as usize, cfg.slot_count as usize)?;
        let recv_layout = SlotLayout::new(cfg.slot_size as usize, cfg.qp.max_recv_wr as usize)?;
        crate::sys::mem::check_memlock(cfg.registered_bytes())?;
        let send = ep.register_raw(layout.bytes(), cfg.pages, Access::LOCAL_READ)?;
        let recv = ep.register_raw(recv_layout.bytes(), cfg.pages, Access::LOCAL_WRITE)?;
        let read = ep.register_raw(layout.bytes(), cfg.pages, Access::LOCAL_WRITE)?;
        let target = ep.register_raw(
            layout.bytes(),
            cfg.pages,
            Access::LOCAL_WRITE | remote_access,
        )?;
        let pollers = ep.take_pollers()?;
        let batch = cfg.batch_size.max(1) as usize;
        let inline_threshold = cfg.inline_threshold.min(ep.max_inline()) as usize;
        let sq = SendQueue::new(
            Reaper::new(pollers.send),
            send,
            read,
            layout,
            cfg.qp.max_send_wr,
            cfg.signal_interval,
            batch,
            inline_threshold,
        );
        let mut rq = RecvQueue::new(Reaper::new(pollers.recv), recv, recv_layout, batch);
        if let Err(e) = rq.refill(ep.qp()) {
            // Some receives may be queued on the QP, which outlives this
            // call: the ring they write into must outlive the QP.
            ep.park(rq.into_ring());
            return Err(e);
        }
        Ok(Rings {
            sq,
            rq,
            target: SharedRegion::new(target),
        })
    }

    /// The target ring, as the peer must address it.
    fn descriptor(&self) -> RemoteSlice {
        self.target
            .remote(0..self.target.len())
            .expect("the whole region is in range")
    }

    /// The handshake's private data: the descriptor, then `data`.
    fn private_data(&self, data: &[u8]) -> Vec<u8> {
        let mut out = RegionDescriptor(self.descriptor()).encode().to_vec();
        out.extend_from_slice(data);
        out
    }
}

/// What a client that could not be accepted is told, when the reason is
/// this side's (its configuration, memory, device): the details stay in
/// this side's log, not with an unauthenticated stranger.
const REJECTED_FOR_OUR_REASONS: &str = "server: cannot serve this connection now; try again later";

/// `err` as a reject's private data: NUL-terminated text, cut to what a
/// reject carries (148 bytes). Only an error the client caused (what it
/// sent) is told in full, with its causes (a wire error
/// names the field only in its source); any other reason is logged here
/// and the client hears [`REJECTED_FOR_OUR_REASONS`].
fn rejection(err: &Error) -> Vec<u8> {
    const MAX: usize = 148;
    let mut text = if matches!(err, Error::Wire(_) | Error::BadRecord(_)) {
        format!("server: {}", with_causes(err))
    } else {
        tracing::warn!(error = %with_causes(err), "rejected a connect request");
        REJECTED_FOR_OUR_REASONS.to_owned()
    };
    let mut end = text.len().min(MAX - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    let mut bytes = text.into_bytes();
    bytes.push(0);
    bytes
}

/// `err`'s text followed by its sources', `: `-separated.
fn with_causes(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// How to connect: what the peer may do to this side's target ring, what
/// to add to the handshake, and on which device.
#[derive(Debug, Clone)]
pub struct ConnectionBuilder<'c> {
    cfg: &'c EngineConfig,
    remote_access: Access,
    private_data: Vec<u8>,
    device: Option<String>,
}

impl Connection {
    /// A builder with the defaults of [`Connection::connect`]: the peer may
    /// RDMA WRITE and READ this side's target ring.
    pub fn builder(cfg: &EngineConfig) -> ConnectionBuilder<'_> {
        ConnectionBuilder {
            cfg,
            remote_access: Access::REMOTE_WRITE | Access::REMOTE_READ,
            private_data: Vec::new(),
            device: None,
        }
    }

    /// Client side over rdma_cm, with the builder's defaults.
    pub fn connect(addr: SocketAddr, cfg: &EngineConfig) -> Result<Connection> {
        Connection::builder(cfg).connect(addr)
    }

    /// Server side over rdma_cm: waits up to `timeout` for the next client.
    pub fn accept(
        listener: &Listener,
        cfg: &EngineConfig,
        timeout: Duration,
    ) -> Result<Connection> {
        let request = listener.next_request(&cfg.qp, timeout)?;
        Connection::builder(cfg).accept(request)
    }

    /// Either side of an out-of-band TCP exchange (symmetric).
    pub fn over_tcp(
        stream: &mut TcpStream,
        device: Option<&str>,
        cfg: &EngineConfig,
    ) -> Result<Connection> {
        let mut builder = Connection::builder(cfg);
        builder.device = device.map(str::to_owned);
        builder.over_tcp(stream)
    }
}

impl ConnectionBuilder<'_> {
    /// What the peer may do to this side's target ring: any of
    /// `Access::REMOTE_WRITE`, `Access::REMOTE_READ`, or
    /// `Access::LOCAL_READ` for nothing at all.
    pub fn remote_access(mut self, access: Access) -> Self {
        self.remote_access = access;
        self
    }

    /// Bytes the peer finds in [`Connection::peer_data`] (rdma_cm only; at
    /// most [`MAX_PRIVATE_DATA`]).
    pub fn private_data(mut self, data: &[u8]) -> Self {
        self.private_data = data.to_vec();
        self
    }

    /// Refuses to connect through any device but `name`.
    pub fn device(mut self, name: Option<&str>) -> Self {
        self.device = name.map(str::to_owned);
        self
    }

    fn checks(&self, ep: &Endpoint) -> Result<()> {
        if self.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Misuse::HandshakeDataTooLong {
                len: self.private_data.len(),
                max: MAX_PRIVATE_DATA,
                beside: "beside the ring descriptor",
            }
            .into());
        }
        match &self.device {
            Some(wanted) if ep.device_name() != wanted => Err(Error::WrongDevice {
                wanted: wanted.clone(),
                got: ep.device_name().to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Client side over rdma_cm: resolves `addr`, prepares the rings,
    /// connects and reads the server's ring from its reply.
    pub fn connect(self, addr: SocketAddr) -> Result<Connection> {
        self.cfg.validate()?;
        let mut connector = Connector::resolve(addr, &self.cfg.qp)?;
        self.checks(connector.endpoint())?;
        let rings = Rings::prepare(connector.endpoint(), self.cfg, self.remote_access)?;
        let ep = connector.connect(&rings.private_data(&self.private_data))?;
        let peer = RegionDescriptor::decode(ep.peer_private_data())?.0;
        Ok(Connection::new(ep, rings, peer, self.cfg))
    }

    /// Server side over rdma_cm: accepts `request` (from
    /// [`Listener::next_request`], after looking at its private data) with
    /// this side's rings. A request that cannot be served is rejected. The
    /// client is told why when it caused it (its private data is no ring
    /// descriptor: the error's text, as much as fits); for a reason of this
    /// side's (configuration, memory, device) it hears only that the server
    /// cannot serve it now, and the reason is logged here (`tracing`,
    /// warn) and returned. A handshake that fails after this side's answer
    /// went (the client rejected it, left, or never finished it) is logged
    /// and returned too; the client hears whatever its own side saw. The
    /// handshake is waited for at most the lesser of this builder's
    /// `cfg.qp.connect_timeout` and the `connect_timeout` of the
    /// [`QpConfig`](crate::QpConfig) [`Listener::next_request`]
    /// was given, so a server can give a request less time than its
    /// listener's default (what is left of a deadline of its own).
    pub fn accept(self, mut request: Request) -> Result<Connection> {
        let prepared = self.cfg.validate().and_then(|()| {
            self.checks(request.endpoint())?;
            let peer = RegionDescriptor::decode(request.private_data())?.0;
            let rings = Rings::prepare(request.endpoint(), self.cfg, self.remote_access)?;
            Ok((peer, rings))
        });
        let (peer, rings) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                let _ = request.reject(&rejection(&e));
                return Err(e);
            }
        };
        let ep = request
            .accept_within(
                &rings.private_data(&self.private_data),
                self.cfg.qp.connect_timeout,
            )
            .inspect_err(|e| {
                // The client sees only the kernel's reject (or nothing):
                // the reason stays here. Debug-formatted: a client's own
                // reject text is in it, and must not forge log lines.
                tracing::warn!(error = ?with_causes(e), "accepting a connect request failed");
            })?;
        Ok(Connection::new(ep, rings, peer, self.cfg))
    }

    /// Either side of an out-of-band TCP exchange (symmetric); the
    /// connection record carries the ring, and there is no handshake data.
    pub fn over_tcp(self, stream: &mut TcpStream) -> Result<Connection> {
        self.cfg.validate()?;
        if !self.private_data.is_empty() {
            return Err(Misuse::HandshakeDataOverTcp.into());
        }
        let mut prepared = Prepared::new(self.device.as_deref(), &self.cfg.qp, self.remote_access)?;
        let rings = Rings::prepare(prepared.endpoint(), self.cfg, self.remote_access)?;
        let ep = prepared.handshake(stream, Some(rings.descriptor()))?;
        let peer = ep
            .remote_region()
            .ok_or_else(|| Error::BadRecord("the peer exposed no target ring".into()))?;
        Ok(Connection::new(ep, rings, peer, self.cfg))
    }
}

#[cfg(test)]
mod tests {
    use super::{rejection, REJECTED_FOR_OUR_REASONS};
    use crate::connect::RegionDescriptor;
    use crate::error::Error;

    fn text(bytes: Vec<u8>) -> String {
        assert_eq!(bytes.last(), Some(&0), "NUL-terminated");
        assert!(bytes.len() <= 148, "{} bytes", bytes.len());
        String::from_utf8(bytes[..bytes.len() - 1].to_vec()).unwrap()
    }

    #[test]
    fn a_client_hears_what_it_sent_wrong_with_the_field() {
        let err = RegionDescriptor::decode(b"XXXX").unwrap_err();
        let told = text(rejection(&err));
        assert!(told.starts_with("server: "), "{told}");
        let source = std::error::Error::source(&err).expect("a wire error's source");
        assert!(
            told.contains(&source.to_string()[..20]),
            "{told} lacks {source}"
        );
    }

    #[test]
    fn a_client_hears_nothing_of_the_servers_own_resources() {
        let errors = [
            Error::Memlock {
                need: 1 << 30,
                locked: 123_456,
                limit: 65_536,
            },
            Error::NoDevice,
            Error::WrongDevice {
                wanted: "mlx5_0".into(),
                got: "rxe0".into(),
            },
        ];
        for err in errors {
            let told = text(rejection(&err));
            assert_eq!(told, REJECTED_FOR_OUR_REASONS, "for {err}");
        }
    }
}
