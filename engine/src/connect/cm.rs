//! Connecting through librdmacm: address and route resolution, listen and
//! accept, private data, and disconnect — each wait bounded by the
//! configuration's connect timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::QpConfig;
use crate::endpoint::Endpoint;
use crate::error::{Error, Misuse, Result};
use crate::sys::cm::{event, CmEvent, CmId, ConnParam, EventChannel};

/// Waits for event `expected` on `id`'s channel; anything else is an error
/// that names what came instead and why that usually happens.
fn expect(id: &CmId, op: &'static str, expected: u32, deadline: Instant) -> Result<CmEvent> {
    let ev = id.channel().next_event(op, deadline)?;
    if ev.kind == expected {
        return Ok(ev);
    }
    if ev.kind == event::REJECTED {
        let reason = String::from_utf8(
            ev.private_data
                .iter()
                .copied()
                .take_while(|b| *b != 0)
                .collect(),
        )
        .ok()
        .filter(|s| !s.is_empty());
        return Err(Error::Rejected {
            reason: reason.or_else(|| {
                Some(format!(
                    "status {}; is a server listening on that address and port?",
                    ev.status
                ))
            }),
        });
    }
    Err(Error::CmEvent {
        op,
        expected: crate::sys::cm_event_str(expected),
        got: ev.name().to_owned(),
        status: ev.status,
        hint: match ev.kind {
            event::ADDR_ERROR => "the address is not reachable through an RDMA device: use an address of the RDMA netdev (rxe cannot route 127.0.0.0/8; use a link-local one)",
            event::ROUTE_ERROR => "no route to the peer over the RDMA netdev",
            event::UNREACHABLE => "the peer did not answer: no host at that address, or it is down",
            event::CONNECT_ERROR => "the connection failed while being established",
            event::DEVICE_REMOVAL => "the RDMA device was removed",
            event::DISCONNECTED => "the peer disconnected",
            _ => "unexpected event",
        },
    })
}

fn ms(d: Duration) -> i32 {
    d.as_millis().clamp(1, i32::MAX as u128) as i32
}

/// A listening CM id.
pub struct Listener {
    id: Arc<CmId>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.local_addr())
            .finish()
    }
}

impl Listener {
    /// Binds `addr` (port 0 picks a free port) and listens.
    pub fn bind(addr: SocketAddr) -> Result<Listener> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.bind(addr)?;
        id.listen(64)?;
        Ok(Listener { id })
    }

    /// The address it listens on, with the port bound (the one picked, when
    /// it bound port 0); `None` when rdma_cm holds no IPv4 or IPv6 address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Waits for the next connect request and builds its endpoint. A
    /// request whose resources cannot be created is rejected.
    pub fn next_request(&self, cfg: &QpConfig, timeout: Duration) -> Result<Request> {
        let deadline = crate::wait::deadline_after(timeout);
        let (id, ev) = self.take_request(Some(deadline))?.ok_or(Error::Timeout {
            what: "a connect request",
            waited: timeout,
        })?;
        let built = id
            .context()
            .ok_or(Error::Cm {
                op: "connect request without a device",
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            })
            .and_then(|ctx| Endpoint::create(&ctx, Some(Arc::clone(&id)), cfg));
        match built {
            Ok(endpoint) => Ok(Request {
                endpoint,
                id,
                event: ev,
                cfg: cfg.clone(),
            }),
            Err(err) => {
                let _ = id.reject(b"server could not create the connection's resources\0");
                Err(err)
            }
        }
    }
}

impl Listener {
    /// The next connect request, without an endpoint: its id on a channel
    /// of its own, for a poller to accept onto queues it shares
    /// (`pool::Poller::accept`). `None` if none came within `timeout`.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "issue 25's poller, crate-private, takes it")
    )]
    pub(crate) fn next_connect_request(&self, timeout: Duration) -> Result<Option<ConnectRequest>> {
        let deadline = crate::wait::deadline_after(timeout);
        Ok(self
            .take_request(Some(deadline))?
            .map(|(id, event)| ConnectRequest { id, event }))
    }

    /// The next connect request if one is queued; never waits.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "issue 25's poller, crate-private, takes it")
    )]
    pub(crate) fn try_connect_request(&self) -> Result<Option<ConnectRequest>> {
        // Asked first: a request's channel is made only for a request.
        if !self.id.channel().has_event()? {
            return Ok(None);
        }
        Ok(self
            .take_request(None)?
            .map(|(id, event)| ConnectRequest { id, event }))
    }

    /// Takes the next CONNECT_REQUEST (by `deadline`, or only one already
    /// queued) and moves its id to a channel of its own, so that its
    /// events never mix with the listener's and only its owner takes
    /// them. Other events of the listener are passed over.
    fn take_request(&self, deadline: Option<Instant>) -> Result<Option<(Arc<CmId>, CmEvent)>> {
        // The request's own channel comes first: once its event is taken,
        // a failure here (out of descriptors) would leave the request
        // neither accepted nor rejected, and its id never destroyed.
        let channel = EventChannel::new()?;
        let listener = self.id.channel();
        let ev = loop {
            let ev = match deadline {
                Some(deadline) => match listener.next_event("a connect request", deadline) {
                    Ok(ev) => ev,
                    Err(Error::Timeout { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                },
                None => match listener.try_event()? {
                    Some(ev) => ev,
                    None => return Ok(None),
                },
            };
            if ev.kind == event::CONNECT_REQUEST {
                break ev;
            }
            tracing::debug!(event = ev.name(), "ignoring listener event");
        };
        let id = CmId::from_request(&ev, &channel)?;
        Ok(Some((id, ev)))
    }
}

/// A connect request taken off a [`Listener`] with no endpoint yet: a
/// poller makes its queue pair on the queues it shares. Dropped, its id is
/// destroyed and the client hears a reject.
#[derive(Debug)]
pub(crate) struct ConnectRequest {
    id: Arc<CmId>,
    event: CmEvent,
}

impl ConnectRequest {
    /// The request's id, and its event (the client's private data and
    /// READ depths).
    pub(crate) fn into_parts(self) -> (Arc<CmId>, CmEvent) {
        (self.id, self.event)
    }
}

/// An incoming connection, not yet accepted.
#[derive(Debug)]
pub struct Request {
    endpoint: Endpoint,
    id: Arc<CmId>,
    event: CmEvent,
    cfg: QpConfig,
}

impl Request {
    /// The private data the client sent (rdma_cm pads it with zeros).
    pub fn private_data(&self) -> &[u8] {
        &self.event.private_data
    }

    /// What a client that connects with [`crate::ConnectionBuilder`] added
    /// after its ring's descriptor ([`crate::ConnectionBuilder::private_data`]),
    /// zero-padded; empty when the private data is shorter than a descriptor.
    pub fn peer_data(&self) -> &[u8] {
        self.event
            .private_data
            .get(super::RegionDescriptor::LEN..)
            .unwrap_or(&[])
    }

    /// The client's address as rdma_cm reports it; `None` when it holds no
    /// IPv4 or IPv6 address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.peer_addr()
    }

    /// Register memory and post receives here before accepting.
    pub fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.endpoint
    }

    /// Accepts the connection, sending `private_data` in the reply, and
    /// waits up to `connect_timeout` until it is established; returns the
    /// connected endpoint. The ACK timeout and retry counts are those of
    /// the configuration [`Listener::next_request`] was given; the READ
    /// depths are the lesser of its `max_rd_atomic` and the client's offer.
    pub fn accept(self, private_data: &[u8]) -> Result<Endpoint> {
        let timeout = self.cfg.connect_timeout;
        self.accept_within(private_data, timeout)
    }

    /// [`Request::accept`], waiting for the handshake at most `timeout`
    /// (or the configuration's `connect_timeout`, if that is shorter).
    pub(crate) fn accept_within(
        mut self,
        private_data: &[u8],
        timeout: std::time::Duration,
    ) -> Result<Endpoint> {
        self.id.set_ack_timeout(self.cfg.timeout)?;
        let ours = self.cfg.max_rd_atomic;
        let param = ConnParam {
            private_data,
            responder_resources: self.event.initiator_depth.min(ours),
            initiator_depth: self.event.responder_resources.min(ours),
            retry_count: self.cfg.retry_count,
            rnr_retry_count: self.cfg.rnr_retry,
        };
        self.id.accept(&param)?;
        expect(
            &self.id,
            "rdma_accept",
            event::ESTABLISHED,
            crate::wait::deadline_after(timeout.min(self.cfg.connect_timeout)),
        )?;
        let data = std::mem::take(&mut self.event.private_data);
        self.endpoint.mark_connected(data, None);
        Ok(self.endpoint)
    }

    /// Refuses the connection; the client sees `Error::Rejected` with this
    /// text (up to 148 bytes; end it with NUL to be safe).
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.reject(private_data)
    }
}

/// A client id with address and route resolved and its endpoint built.
#[derive(Debug)]
pub struct Connector {
    endpoint: Endpoint,
    id: Arc<CmId>,
    cfg: QpConfig,
}

impl Connector {
    /// Resolves the address and route to `dst` through rdma_cm, both
    /// within `cfg.connect_timeout`, and builds the endpoint on the device
    /// and port the route leaves from. Errs when `cfg` is invalid, when
    /// rdma_cm fails or answers with an error event, and when that port is
    /// not active.
    pub fn resolve(dst: SocketAddr, cfg: &QpConfig) -> Result<Connector> {
        cfg.validate()?;
        let deadline = crate::wait::deadline_after(cfg.connect_timeout);
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.resolve_addr(dst, ms(cfg.connect_timeout))?;
        expect(&id, "rdma_resolve_addr", event::ADDR_RESOLVED, deadline)?;
        id.resolve_route(ms(deadline.saturating_duration_since(Instant::now())))?;
        expect(&id, "rdma_resolve_route", event::ROUTE_RESOLVED, deadline)?;
        let ctx = id.context().ok_or(Error::Cm {
            op: "address resolution bound no device",
            source: std::io::Error::from_raw_os_error(libc::ENODEV),
        })?;
        let endpoint = Endpoint::create(&ctx, Some(Arc::clone(&id)), cfg)?;
        Ok(Connector {
            endpoint,
            id,
            cfg: cfg.clone(),
        })
    }

    /// Register memory and post receives here before connecting.
    pub fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.endpoint
    }

    /// Connects, sending `private_data` (at most 56 bytes for RC).
    pub fn connect(mut self, private_data: &[u8]) -> Result<Endpoint> {
        self.request(private_data)?;
        let ev = expect(
            &self.id,
            "rdma_connect",
            event::ESTABLISHED,
            crate::wait::deadline_after(self.cfg.connect_timeout),
        )?;
        self.endpoint.mark_connected(ev.private_data, None);
        Ok(self.endpoint)
    }

    /// Sends the connect request with `private_data` and returns without
    /// reading a single rdma_cm event: this side never answers the
    /// server's reply, so the handshake stays half-open until the returned
    /// value is dropped. What a client that stalls in its handshake does
    /// to a server — for tests of a server's bounds, never a connection.
    pub fn connect_half_open(self, private_data: &[u8]) -> Result<HalfOpen> {
        self.request(private_data)?;
        Ok(HalfOpen {
            _endpoint: self.endpoint,
            _id: self.id,
        })
    }

    fn request(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > 56 {
            return Err(Misuse::HandshakeDataTooLong {
                len: private_data.len(),
                max: 56,
                beside: "an RC connect request",
            }
            .into());
        }
        self.id.set_ack_timeout(self.cfg.timeout)?;
        let depth = self.cfg.max_rd_atomic;
        let param = ConnParam {
            private_data,
            responder_resources: depth,
            initiator_depth: depth,
            retry_count: self.cfg.retry_count,
            rnr_retry_count: self.cfg.rnr_retry,
        };
        self.id.connect(&param)
    }
}

/// A connect request sent and never followed up
/// ([`Connector::connect_half_open`]); dropping it destroys the id, which
/// ends the handshake.
#[derive(Debug)]
pub struct HalfOpen {
    // The endpoint (its queue pair) goes before the id it was made on.
    _endpoint: Endpoint,
    _id: Arc<CmId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server may take a request off its accept loop and complete the
    /// handshake (accept → ESTABLISHED) on the transfer's own thread.
    #[test]
    fn a_request_moves_to_another_thread() {
        fn send<T: Send>() {}
        send::<Request>();
        send::<Listener>();
    }
}
