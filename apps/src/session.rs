//! Connections: a client's resolve-then-connect, the server's accept loop,
//! and completion waits that check what completed. Every wait is bounded by
//! `--timeout`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _};
use pinpoll::connect::cm::{Connector, Listener, Request};
use pinpoll::{Completed, Endpoint, Posted, QpConfig, WcOpcode};

use crate::cli::{show_addr, socket_addr, CommonArgs, ServerArgs};
use crate::output::Output;
use crate::run::{error_line, AlreadyReported};
use crate::shutdown::Shutdown;

/// How long the server waits for a connect request before it looks at the
/// shutdown flag again.
const ACCEPT_SLICE: Duration = Duration::from_millis(200);

/// The queue pair these examples need: a handful of work requests, and
/// `timeout` for address resolution and connection set-up.
pub fn qp_config(timeout: Duration) -> QpConfig {
    let mut built = QpConfig::default();
    built.max_send_wr = 8;
    built.max_recv_wr = 8;
    built.cq_depth = 16;
    built.connect_timeout = timeout;
    built
}

/// Fails unless an RDMA device named `name` exists, naming those that do.
pub fn device_exists(name: &str) -> anyhow::Result<()> {
    let devices = pinpoll::device::list_devices().context("listing RDMA devices")?;
    if devices.is_empty() {
        return Err(pinpoll::Error::NoDevice.into());
    }
    if devices.iter().any(|d| d.name == name) {
        return Ok(());
    }
    Err(pinpoll::Error::DeviceNotFound {
        name: name.to_owned(),
        available: devices
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    })
    .context("--device")
}

/// Fails if `--device` was given and the connection is on another device.
pub fn check_device(ep: &Endpoint, wanted: Option<&str>) -> anyhow::Result<()> {
    match wanted {
        Some(wanted) if ep.device_name() != wanted => bail!(
            "the connection is on RDMA device {}, not {wanted} (--device)",
            ep.device_name()
        ),
        _ => Ok(()),
    }
}

/// A client on its way to a connection: address and route resolved, the
/// endpoint built on the device the route goes through. Register memory
/// and post receives through [`Client::endpoint`], then [`Client::connect`].
#[derive(Debug)]
pub struct Client {
    conn: Connector,
    addr: SocketAddr,
}

impl Client {
    pub fn resolve(host: &str, port: u16, common: &CommonArgs) -> anyhow::Result<Client> {
        let addr = socket_addr(host, port)?;
        if let Some(device) = &common.device {
            device_exists(device)?;
        }
        let mut conn = Connector::resolve(addr, &qp_config(common.timeout))
            .map_err(|err| match err {
                // rxe (and most RoCE setups) cannot carry 127.0.0.0/8 or ::1.
                // (A machine without rdma_cm is Error::NoDevice already.)
                pinpoll::Error::Cm { .. } if addr.ip().is_loopback() => anyhow::Error::new(err)
                    .context(
                        "a loopback address is not reachable through an RDMA device; \
                     use the address of the RDMA netdev (e.g. its link-local address)",
                    ),
                err => err.into(),
            })
            .with_context(|| format!("connecting to {addr}"))?;
        check_device(conn.endpoint(), common.device.as_deref())
            .with_context(|| format!("connecting to {addr}"))?;
        tracing::debug!(%addr, device = conn.endpoint().device_name(), "route resolved");
        Ok(Client { conn, addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn endpoint(&mut self) -> &mut Endpoint {
        self.conn.endpoint()
    }

    /// Connects, sending `private_data` in the request.
    pub fn connect(self, private_data: &[u8]) -> anyhow::Result<Endpoint> {
        let addr = self.addr;
        self.conn
            .connect(private_data)
            .with_context(|| format!("connecting to {addr}"))
    }
}

/// Listens on `--bind`:`port` and hands each connect request to `serve_one`,
/// one client at a time, until `--count` clients were served or SIGINT or
/// SIGTERM arrives. A failed client is one `error: client ADDR: ...` line on
/// stderr and the server goes on; the result is an error if any failed.
pub fn serve(
    args: &ServerArgs,
    common: &CommonArgs,
    port: u16,
    out: Output,
    mut serve_one: impl FnMut(Request, &Output) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let addr = socket_addr(&args.bind, port).context("--bind")?;
    if let Some(device) = &common.device {
        device_exists(device)?;
    }
    let mut server = Accepting::listen(addr, args.count, qp_config(common.timeout), out)?;
    while server.open() {
        let Some(mut req) = server.next_client()? else {
            continue;
        };
        server.take();
        let peer = show_addr(req.peer_addr());
        let result = match check_device(req.endpoint(), common.device.as_deref()) {
            Ok(()) => {
                out.progress(format_args!("client {peer}: connecting"))?;
                serve_one(req, &out)
            }
            Err(err) => Err(refuse(req, err)),
        };
        match result {
            Ok(()) => out.progress(format_args!("client {peer}: done"))?,
            Err(err) => server.failed(&peer, &err),
        }
    }
    server.finish()
}

/// A server's accept loop, shared by every server: the listener, the stop
/// conditions (`--count` clients served, SIGINT or SIGTERM), the count of
/// clients served and failed, one `error: client ADDR: ...` line per
/// failed client, and the closing report.
pub struct Accepting {
    /// `None` once the server stopped listening (it only finishes).
    listener: Option<Listener>,
    shutdown: Shutdown,
    count: Option<u64>,
    qp: QpConfig,
    out: Output,
    served: u64,
    /// Admitted clients whose handshake has not ended yet (servers that
    /// hand it to another thread): no further client is admitted while
    /// they could still reach `--count`.
    handshaking: u64,
    failed: u64,
}

impl Accepting {
    /// Listens on `addr` (rdma_cm) for clients whose queue pairs take `qp`,
    /// and says so on stdout (`listening on ADDR`); SIGINT and SIGTERM end
    /// the loop from here on.
    pub fn listen(
        addr: SocketAddr,
        count: Option<u64>,
        qp: QpConfig,
        out: Output,
    ) -> anyhow::Result<Accepting> {
        let shutdown = Shutdown::install()?;
        let listener = Listener::bind(addr).with_context(|| format!("listening on {addr}"))?;
        out.progress(format_args!(
            "listening on {}",
            show_addr(listener.local_addr().or(Some(addr)))
        ))?;
        Ok(Accepting {
            listener: Some(listener),
            shutdown,
            count,
            qp,
            out,
            served: 0,
            handshaking: 0,
            failed: 0,
        })
    }

    /// Whether to wait for another client: `--count` not reached, no
    /// signal, still listening.
    pub fn open(&self) -> bool {
        self.listener.is_some()
            && !matches!(self.count, Some(n) if self.served >= n)
            && !self.shutdown.requested()
    }

    /// The next connect request, waiting a short slice. `None` when none
    /// came (look at the stop conditions and call again) or when one
    /// failed on its own, which is reported and counted as a failed client
    /// (not as one served: it never got a connection).
    pub fn next_client(&mut self) -> anyhow::Result<Option<Request>> {
        let Some(listener) = &self.listener else {
            return Ok(None);
        };
        match next_request(listener, &self.qp)? {
            Incoming::Request(req) => Ok(Some(*req)),
            Incoming::Idle => Ok(None),
            Incoming::Refused => {
                self.failed += 1;
                Ok(None)
            }
        }
    }

    /// Counts a request as a client served (towards `--count`).
    pub fn take(&mut self) {
        self.served += 1;
    }

    /// Whether another client may start a handshake: `--count` is not
    /// reached even if every handshake under way succeeds. (A failed one
    /// makes room again, so the loop goes on while this is false.)
    pub fn has_room(&self) -> bool {
        !matches!(self.count, Some(n) if self.served + self.handshaking >= n)
    }

    /// Counts a request whose handshake goes on elsewhere: it holds its
    /// place towards `--count` until [`handshake_ended`](Self::handshake_ended).
    pub fn handshaking(&mut self) {
        self.handshaking += 1;
    }

    /// A handshake counted by [`handshaking`](Self::handshaking) ended: an
    /// established one is a client served; a failed one is not.
    pub fn handshake_ended(&mut self, established: bool) {
        self.handshaking = self.handshaking.saturating_sub(1);
        self.served += u64::from(established);
    }

    /// Reports client `peer`'s failure, one line on stderr, and counts it.
    pub fn failed(&mut self, peer: &str, err: &anyhow::Error) {
        self.failed += 1;
        eprintln!("error: client {peer}: {}", error_line(err));
    }

    /// Counts `n` failed clients that were reported elsewhere.
    pub fn count_failed(&mut self, n: u64) {
        self.failed += n;
    }

    /// The listener, while listening.
    pub fn listener(&self) -> Option<&Listener> {
        self.listener.as_ref()
    }

    /// Stops listening: new clients are refused by the system from here on.
    pub fn stop_listening(&mut self) {
        self.listener = None;
    }

    /// Says how many clients were served when a signal ended the loop; an
    /// error (already reported) when any client failed.
    pub fn finish(self) -> anyhow::Result<()> {
        if self.shutdown.requested() {
            self.out.progress(format_args!(
                "interrupted: served {} client(s)",
                self.served
            ))?;
        }
        if self.failed > 0 {
            return Err(AlreadyReported.into());
        }
        Ok(())
    }
}

/// What one bounded wait on a listener produced.
pub enum Incoming {
    Request(Box<Request>),
    /// Nothing within the slice: check for shutdown and wait again.
    Idle,
    /// A request that could not get its resources (rejected, reported).
    Refused,
}

/// Waits up to a short slice for the next connect request (for a loop of
/// its own; [`Accepting::next_client`] counts what this reports). A broken
/// listener (nothing more will come) is an error; a request that failed
/// on its own is reported on stderr as one line and counted by the caller.
pub fn next_request(listener: &Listener, cfg: &QpConfig) -> anyhow::Result<Incoming> {
    match listener.next_request(cfg, ACCEPT_SLICE) {
        Ok(req) => Ok(Incoming::Request(Box::new(req))),
        Err(pinpoll::Error::Timeout { .. }) => Ok(Incoming::Idle),
        Err(err @ pinpoll::Error::Cm { op, .. })
            if op == "rdma_get_cm_event" || op == "poll on the event channel" =>
        {
            Err(err).context("waiting for clients")
        }
        Err(err) => {
            eprintln!(
                "error: {}",
                error_line(&anyhow::Error::new(err).context("a connect request"))
            );
            Ok(Incoming::Refused)
        }
    }
}

/// Rejects `req`, telling the client why (rdma_cm carries up to 148 bytes),
/// and returns `err` for the server's own report.
pub fn refuse(req: Request, err: anyhow::Error) -> anyhow::Error {
    let mut reason = error_line(&err);
    let mut cut = reason.len().min(147);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    reason.truncate(cut);
    let mut bytes = reason.into_bytes();
    bytes.push(0);
    if let Err(reject_err) = req.reject(&bytes) {
        tracing::warn!(error = %reject_err, "rejecting the connect request failed");
    }
    err.context("refused")
}

/// Waits for the completion of `posted` (which gives its region back),
/// which must be an `opcode`; `what` names it in errors. The wait ends
/// early with `Error::Disconnected` when rdma_cm reports that the peer
/// left.
pub fn complete(
    ep: &mut Endpoint,
    posted: Posted,
    timeout: Duration,
    opcode: WcOpcode,
    what: &str,
) -> anyhow::Result<Completed> {
    let c = ep
        .complete(posted, timeout)
        .map_err(|err| match pinpoll::Error::from(err) {
            pinpoll::Error::Timeout { .. } => anyhow::anyhow!(
                "timed out after {timeout:?} (--timeout); is the peer stuck or gone?"
            ),
            err => err.into(),
        })
        .with_context(|| format!("waiting for {what}"))?;
    if c.done.opcode != opcode {
        bail!(
            "waiting for {what}: got a {} completion, expected {opcode}",
            c.done.opcode
        );
    }
    Ok(c)
}

/// Disconnects, naming the peer in the error.
pub fn disconnect(mut ep: Endpoint) -> anyhow::Result<()> {
    ep.disconnect().context("disconnecting")
}
