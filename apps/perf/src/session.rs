//! Running measurements: both sides in this process (`--loopback`, and
//! the criterion benches), the client of a server elsewhere, or that server.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use pinpoll::connect::cm::Listener;
use pinpoll::connect::parse_socket_addr;
use pinpoll::{Connection, EngineConfig};

use crate::admit::{show_bytes, Limits};
use crate::cli::{Role, Settings, Transport};
use crate::clock;
use crate::control::{control_config, BadMessage, Control, DeadlineStream, Msg};
use crate::driver::{self, Driver, Served};
use crate::plan::{data_config, Kind, Mode, Params, Plan, WireConfig};
use crate::report::{self, Bandwidth, Doorbells, Point, RawSamples, Report, RunInfo, Samples};

pub use pinpoll_appkit::pin;

/// Accepts one TCP connection, waiting at most `timeout`.
fn accept_within(listener: &TcpListener, timeout: Duration, what: &str) -> Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > timeout {
                    bail!("timed out after {timeout:?} waiting for {what}");
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e).with_context(|| format!("accepting {what}")),
        }
    }
}

/// Two connected connections in this process over the TCP exchange on
/// 127.0.0.1: (client, server).
pub fn loopback_pair(cfg: &EngineConfig, device: Option<&str>) -> Result<(Connection, Connection)> {
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding 127.0.0.1")?;
    let addr = tcp.local_addr()?;
    let (scfg, dev) = (cfg.clone(), device.map(str::to_owned));
    let timeout = cfg.qp.connect_timeout;
    let server = std::thread::Builder::new()
        .name("pinpoll-perf-accept".into())
        .spawn(move || -> Result<Connection> {
            let mut s = accept_within(&tcp, timeout, "the loopback client")?;
            Ok(Connection::over_tcp(&mut s, dev.as_deref(), &scfg)?)
        })?;
    let client = TcpStream::connect(addr)
        .context("connecting to 127.0.0.1")
        .and_then(|mut s| Ok(Connection::over_tcp(&mut s, device, cfg)?));
    let server = server
        .join()
        .map_err(|_| anyhow!("the loopback server thread panicked"))?;
    match (client, server) {
        (Ok(c), Ok(s)) => Ok((c, s)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// A server thread of this process serving one plan until dropped.
#[derive(Debug)]
pub struct ServerThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(Served, Connection)>>>,
}

impl ServerThread {
    /// Serves `plan` on `conn` on a new thread pinned to `core`.
    pub fn spawn(
        mut conn: Connection,
        plan: Plan,
        core: Option<usize>,
        timeout: Duration,
    ) -> Result<ServerThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("pinpoll-perf-server".into())
            .spawn(move || -> Result<(Served, Connection)> {
                if let Some(c) = core {
                    pin(c)?;
                }
                // In this process nothing is lost if the client stalls:
                // the client's own waits are bounded; the server waits
                // only for the stop flag.
                let idle = Duration::from_secs(24 * 3600);
                let until = driver::Until(None);
                let served = driver::serve(&mut conn, plan, timeout, idle, until, &mut || {
                    Ok(flag.load(Ordering::Relaxed))
                })?;
                // The connection goes back to the caller, who drops it
                // only after the client side has finished with its own.
                Ok((served, conn))
            })?;
        Ok(ServerThread {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the server (once it has no work in flight) and returns what
    /// it did, with its connection still open.
    pub fn finish(mut self) -> Result<(Served, Connection)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| anyhow!("the server thread panicked"))?
            .context("server side")
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Both sides of one plan in this process: the client driver on the
/// calling thread, the server on a pinned thread.
pub struct Loopback {
    pub driver: Box<dyn Driver + Send>,
    pub server: ServerThread,
}

impl std::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback").finish_non_exhaustive()
    }
}

impl Loopback {
    /// Connects a pair on `device` and starts the server thread. In
    /// engine mode the worker is pinned to `cfg.core`.
    pub fn start(
        plan: Plan,
        cfg: &EngineConfig,
        device: Option<&str>,
        server_core: Option<usize>,
    ) -> Result<Loopback> {
        let (client, server) = loopback_pair(cfg, device)?;
        let server = ServerThread::spawn(server, plan, server_core, cfg.completion_timeout)?;
        let driver = driver::client(client, plan, cfg)?;
        Ok(Loopback { driver, server })
    }

    /// Ends both sides in the order that leaves nothing unacknowledged:
    /// the client's work completes, the server stops and drains, the
    /// client closes, then the server's connection closes. Returns the
    /// client's counters.
    pub fn finish(mut self) -> Result<pinpoll::datapath::Stats> {
        let quiet = self.driver.quiesce();
        let server = self.server.finish();
        let client = self.driver.finish();
        quiet.context("client side")?;
        let stats = client.context("client side")?;
        server?;
        Ok(stats)
    }
}

/// The measured figures of one size.
pub struct Figures {
    pub latency: Option<report::Latency>,
    pub bandwidth: Option<Bandwidth>,
    /// Latency: every measured round trip, in clock ticks.
    pub round_trip_ticks: Vec<u64>,
}

/// Runs the warm-up and the measured iterations of `kind` on `driver`.
pub fn measure(
    driver: &mut dyn Driver,
    kind: Kind,
    size: usize,
    iters: u64,
    warmup: u64,
) -> anyhow::Result<Figures> {
    // The clock's scale is measured before anything is timed.
    clock::ns_per_tick();
    if kind.is_latency() {
        for _ in 0..warmup {
            driver.round_trip()?;
        }
        let (samples, deltas) = round_trips(driver, iters, SAMPLE_BATCH)?;
        let factor = if kind.reports_half_round_trip() {
            0.5
        } else {
            1.0
        };
        Ok(Figures {
            latency: Some(samples.summary(factor)),
            bandwidth: None,
            round_trip_ticks: deltas,
        })
    } else {
        if warmup > 0 {
            driver.stream(warmup)?;
        }
        let elapsed = clock::to_duration(crate::driver::timed_stream(driver, iters)?);
        Ok(Figures {
            latency: None,
            bandwidth: Some(Bandwidth::new(size, iters, elapsed)),
            round_trip_ticks: Vec::new(),
        })
    }
}

/// Latency samples kept between two fills of the histogram: 128 MiB of
/// deltas, whatever `-n` is.
const SAMPLE_BATCH: u64 = 1 << 24;

/// Times `iters` round trips on `driver`. One TSC read per iteration, as
/// perftest's get_cycles: the OS clock is a system call in the TCG guest
/// (see clock.rs). The deltas go into a buffer sized before the loop
/// (perftest keeps its stamps the same way); the histogram is filled from
/// it after the loop, or each time `batch` deltas filled it (the clock
/// restarts after that), so its bookkeeping stays out of the measured
/// round trips and memory stays bounded whatever `iters` is.
fn round_trips(
    driver: &mut dyn Driver,
    iters: u64,
    batch: u64,
) -> anyhow::Result<(Samples, Vec<u64>)> {
    let batch = iters.min(batch);
    let mut deltas: Vec<u64> = Vec::new();
    deltas
        .try_reserve_exact(batch as usize)
        .map_err(|e| anyhow!("room for {batch} latency samples: {e}"))?;
    let mut samples = Samples::new();
    let mut left = iters;
    while left > 0 {
        // One TSC read per iteration inside the measured loop, as perftest's
        // get_cycles; the histogram is filled between batches, outside it.
        let n = left.min(batch);
        crate::driver::timed_round_trips(driver, n, |ticks| deltas.push(ticks))?;
        left -= n;
        if left > 0 {
            record(&mut samples, deltas.drain(..));
        }
    }
    record(&mut samples, deltas.iter().copied());
    // Raw samples (--raw-samples caps -n far below a batch) are the whole
    // run only when it fit in one batch.
    if iters > batch {
        deltas = Vec::new();
    }
    Ok((samples, deltas))
}

/// Moves the TSC `deltas` into `samples`.
fn record(samples: &mut Samples, deltas: impl Iterator<Item = u64>) {
    let scale = clock::ns_per_tick();
    for ticks in deltas {
        samples.record(Duration::from_nanos((ticks as f64 * scale) as u64));
    }
}

/// The configuration of a run, with the tuning profile loaded: the
/// client's starting point, and on the server what does not travel.
fn base_config(s: &Settings) -> Result<EngineConfig> {
    let mut base = EngineConfig::load(&s.profile)?;
    base.core = None;
    base.completion_timeout = s.timeout;
    base.qp.connect_timeout = s.timeout;
    // -x does not travel: a server applies its own.
    base.qp.gid_index = s.overrides.gid_index.or(base.qp.gid_index);
    Ok(base)
}

fn run_info(s: &Settings, role: &'static str) -> RunInfo {
    RunInfo {
        test: s.kind.name(),
        role,
        mode: s.mode.name(),
        transport: s.transport.name(&s.role),
        device: s.device.clone(),
        host: match &s.role {
            Role::Client { host } => Some(host.clone()),
            _ => None,
        },
        port: s.port,
        profile: s.profile.clone(),
        hugepages: s.overrides.hugepages,
        iterations: s.iters,
        warmup: s.warmup,
        sizes: s.sizes.clone(),
        tx_depth: s.overrides.tx_depth,
        post_list: s.overrides.post_list,
        cq_mod: s.overrides.cq_mod,
        inline_size: s.overrides.inline_size,
        gid_index: s.overrides.gid_index,
        await_sends: s.await_sends,
        report_gbits: s.report_gbits,
        client_core: if s.mode == Mode::Engine {
            s.app_core
        } else {
            s.core
        },
        worker_core: if s.mode == Mode::Engine { s.core } else { None },
        server_core: match s.role {
            Role::Server => s.core,
            _ => s.server_core,
        },
        timeout_secs: s.timeout.as_secs_f64(),
    }
}

/// Runs what `s` asks; `emit` receives the text output line by line (not
/// called with --json, whose document is the returned report).
pub fn run(s: &Settings, emit: &mut dyn FnMut(&str)) -> Result<Report> {
    // Before a server says it is ready, as before a client measures.
    clock::ns_per_tick();
    match s.role {
        Role::Server => run_server(s, emit),
        Role::Loopback | Role::Client { .. } => run_client(s, emit),
    }
}

fn point(
    p: &Params,
    figures: Figures,
    stats: &pinpoll::datapath::Stats,
    inline_threshold: usize,
    raw: bool,
) -> Point {
    let raw_samples = (raw && p.kind.is_latency()).then(|| RawSamples {
        unit: "ticks",
        ns_per_tick: clock::ns_per_tick(),
        round_trip_ticks: figures.round_trip_ticks,
    });
    Point {
        bytes: p.size,
        iterations: p.iters,
        warmup: p.warmup,
        inline: p.size <= inline_threshold,
        latency: figures.latency,
        bandwidth: figures.bandwidth,
        work_requests: Doorbells::new(stats),
        wait_turns: stats.wait_turns,
        raw_samples,
        connection: p.config.clone(),
    }
}

fn run_client(s: &Settings, emit: &mut dyn FnMut(&str)) -> Result<Report> {
    let base = base_config(s)?;
    let role = if s.role == Role::Loopback {
        "loopback"
    } else {
        "client"
    };
    let mut report = Report::new(run_info(s, role));
    // The measuring thread: in direct mode it owns the connection.
    let measuring_core = match s.mode {
        Mode::Direct => s.core,
        Mode::Engine => s.app_core,
    };
    if let Some(c) = measuring_core {
        pin(c)?;
    }
    if !s.json {
        emit(&report::header(s.kind, &report.config));
        emit(&report::columns(s.kind, s.report_gbits));
    }
    let mut control = match &s.role {
        Role::Client { host } => Some(connect_control(s, host)?),
        _ => None,
    };
    for &size in &s.sizes {
        let mut cfg = data_config(&base, s.kind, size, &s.overrides)
            .with_context(|| format!("the configuration for {size} bytes"))?;
        if s.mode == Mode::Engine {
            cfg.core = s.core;
        }
        let params = Params {
            kind: s.kind,
            mode: s.mode,
            size,
            iters: s.iters,
            warmup: s.warmup,
            await_sends: s.await_sends,
            config: WireConfig::from_config(&cfg),
        };
        let plan = params.plan();
        let p = match (&s.role, control.as_mut()) {
            (Role::Client { host }, Some(ctl)) => client_point(s, host, ctl, &params, &cfg)?,
            _ => {
                let mut lb = Loopback::start(plan, &cfg, s.device.as_deref(), s.server_core)
                    .with_context(|| format!("setting up the loopback pair for {size} bytes"))?;
                let inline = lb.driver.inline_threshold();
                let figures = measure(lb.driver.as_mut(), s.kind, size, s.iters, s.warmup);
                let stats = lb.finish();
                let figures =
                    figures.with_context(|| format!("{} at {size} bytes", s.kind.name()))?;
                point(&params, figures, &stats?, inline, s.raw_samples)
            }
        };
        if !s.json {
            emit(&report::line(&p, s.report_gbits));
        }
        report.results.push(p);
    }
    if let Some(mut ctl) = control {
        ctl.send(&Msg::End)?;
    }
    Ok(report)
}

fn connect_control(s: &Settings, host: &str) -> Result<Control> {
    match s.transport {
        Transport::Tcp => {
            let addr = parse_socket_addr(host, s.port)?;
            let stream = TcpStream::connect_timeout(&addr, s.timeout)
                .with_context(|| format!("connecting to the server at {addr} (TCP)"))?;
            stream.set_nodelay(true)?;
            Ok(Control::tcp(stream, s.timeout))
        }
        Transport::RdmaCm => {
            let addr = parse_socket_addr(host, s.port)?;
            let conn = Connection::connect(addr, &control_config(s.timeout))
                .with_context(|| format!("connecting to the server at {addr} (rdma_cm)"))?;
            Ok(Control::Rdma(Box::new(conn)))
        }
    }
}

/// What the server's banner says a client may register.
fn allowance(limits: &Limits) -> String {
    format!(
        "a client may register up to {} per connection",
        show_bytes(limits.max_registered)
    )
}

fn client_point(
    s: &Settings,
    host: &str,
    ctl: &mut Control,
    params: &Params,
    cfg: &EngineConfig,
) -> Result<Point> {
    ctl.send(&Msg::Params(params.clone()))?;
    let nonce = match ctl.recv(s.timeout, "the server to get ready")? {
        Msg::Ready { nonce } => nonce,
        other => bail!("the server answered {other:?} instead of ready"),
    };
    let conn = match s.transport {
        // The nonce tells the server this is the data connection it
        // waits for, not another client's.
        Transport::RdmaCm => Connection::builder(cfg)
            .private_data(&nonce.to_be_bytes())
            .connect(parse_socket_addr(host, s.port)?)?,
        Transport::Tcp => Connection::over_tcp(
            ctl.stream().expect("a TCP control stream"),
            s.device.as_deref(),
            cfg,
        )?,
    };
    let mut driver = driver::client(conn, params.plan(), cfg)?;
    let inline = driver.inline_threshold();
    let figures = measure(
        driver.as_mut(),
        params.kind,
        params.size,
        params.iters,
        params.warmup,
    );
    // A server that ends the measurement (its --max-session) says why on
    // the control channel before it drops the data connection: that
    // reason, not only the data path's failure it caused.
    let figures = figures.map_err(|e| match ctl.try_recv() {
        Ok(Some(Msg::Error { message })) => e.context(format!(
            "the server reported: {}",
            crate::control::printable(&message)
        )),
        _ => e,
    });
    let figures = figures.with_context(|| format!("{} at {} bytes", s.kind.name(), params.size))?;
    // Everything acknowledged before the server closes its side.
    driver
        .quiesce()
        .context("waiting for the last completions")?;
    ctl.send(&Msg::Done)?;
    match ctl.recv(s.timeout, "the server to finish")? {
        Msg::Served { .. } => {}
        other => bail!("the server answered {other:?} instead of served"),
    }
    let stats = driver.finish()?;
    Ok(point(params, figures, &stats, inline, s.raw_samples))
}

/// Tells the client why it is refused (delivered before this side goes
/// on), and returns the same reason as this side's error.
fn refuse(ctl: &mut Control, why: anyhow::Error) -> anyhow::Error {
    let mut message = format!("{why:#}");
    let mut cut = message.len().min(crate::control::MAX_MSG / 4);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    message.truncate(cut);
    match ctl.send(&Msg::Error { message }) {
        Ok(()) => why.context(ClientFault("refused the client".to_owned())),
        Err(e) => why.context(ClientFault(format!(
            "refused the client (who could not be told: {e:#})"
        ))),
    }
}

/// A failure the client caused by what it sent or asked for; the server
/// reports it and goes on to the next client.
#[derive(Debug)]
struct ClientFault(String);

impl std::fmt::Display for ClientFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClientFault {}

/// Whether `err` ended the session through the client (its silence,
/// what it sent, its leaving, its side of the data connection) rather
/// than through this server (its device, its listener): only the
/// latter may end the server, or any peer could end it for everyone.
fn client_failed(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind;
    crate::control::is_timeout(err)
        || err.downcast_ref::<ClientFault>().is_some()
        || err.chain().any(|cause| {
            cause.is::<BadMessage>()
                || cause.is::<ClientFault>()
                || cause.downcast_ref::<std::io::Error>().is_some_and(|e| {
                    matches!(
                        e.kind(),
                        ErrorKind::UnexpectedEof
                            | ErrorKind::ConnectionReset
                            | ErrorKind::ConnectionAborted
                            | ErrorKind::BrokenPipe
                    )
                })
                || matches!(
                    cause.downcast_ref::<pinpoll::Error>(),
                    Some(
                        pinpoll::Error::Exchange { .. }
                            | pinpoll::Error::BadRecord(_)
                            | pinpoll::Error::Wire(_)
                            | pinpoll::Error::Disconnected
                            | pinpoll::Error::PeerLeft(_)
                            | pinpoll::Error::PeerUnresponsive { .. }
                            | pinpoll::Error::Rejected { .. }
                            | pinpoll::Error::Timeout { .. }
                    )
                )
        })
}

/// The most sizes one client may ask for in a session (`-a` asks 23): with
/// `--max-session`, what bounds how long one client holds the server.
pub const MAX_SESSION_SIZES: u64 = 32;

/// The client's next parameters, or `None` at its end. A message that
/// is not one, parameters past the session's end (`until`) or beyond
/// [`MAX_SESSION_SIZES`] (`served` so far) get the client told why.
fn next_params(
    ctl: &mut Control,
    timeout: Duration,
    until: Instant,
    served: u64,
) -> Result<Option<Params>> {
    match ctl.recv(timeout, "the client's next parameters") {
        Ok(Msg::Params(_)) if Instant::now() >= until => {
            Err(refuse(ctl, driver::SessionLimit.into()))
        }
        Ok(Msg::Params(_)) if served >= MAX_SESSION_SIZES => Err(refuse(
            ctl,
            anyhow!("the client asked for more than {MAX_SESSION_SIZES} sizes in one session"),
        )),
        Ok(Msg::Params(p)) => Ok(Some(p)),
        Ok(Msg::End) => Ok(None),
        Ok(other) => Err(refuse(
            ctl,
            anyhow!("the client sent {other:?} instead of parameters"),
        )),
        Err(e) if e.downcast_ref::<BadMessage>().is_some() => Err(refuse(ctl, e)),
        Err(e) => Err(e),
    }
}

/// The data connection `params` asks for, if `limits` allow it and this
/// process can lock its rings; otherwise the client is told why.
fn admit(
    ctl: &mut Control,
    limits: &Limits,
    params: &Params,
    base: &EngineConfig,
) -> Result<EngineConfig> {
    let admitted = limits.admit(params, base).and_then(|cfg| {
        pinpoll::memory::check_memlock(cfg.registered_bytes())
            .context("this server cannot lock the client's rings")?;
        Ok(cfg)
    });
    admitted.map_err(|why| refuse(ctl, why))
}

fn run_server(s: &Settings, emit: &mut dyn FnMut(&str)) -> Result<Report> {
    let report = Report::new(run_info(s, "server"));
    if let Some(c) = s.core {
        pin(c)?;
    }
    let base = base_config(s)?;
    let limits = Limits::new(s.kind, &base, &s.profile, s.max_registered, s.timeout)?;
    let door = match s.transport {
        Transport::Tcp => Door::Tcp(listen_tcp(s, &limits, emit)?),
        Transport::RdmaCm => Door::Cm(listen_cm(s, &limits, emit)?),
    };
    // One client at a time; one that goes silent (or too slow) at any
    // step, or fails (leaves, sends nonsense, asks too much), is given
    // up, and the server waits for the next: no peer can end the server
    // for the others. Only a failure of the server's own ends it.
    let served_sizes = loop {
        let mut ctl = match door.accept(s)? {
            Ok(ctl) => ctl,
            Err(e) => {
                give_up(s, &e.context("gave up on a client"), emit);
                continue;
            }
        };
        // The doorman goes before the outcome is reported: once the
        // server says it waits for the next client, the next one to
        // come is served, never told "busy" by a doorman still at work.
        let served = {
            let _doorman = match &door {
                Door::Tcp(tcp) => Some(Doorman::start(tcp, s.timeout)?),
                Door::Cm(_) => None,
            };
            serve_client(s, &limits, &base, &mut ctl, &door, emit)
        };
        match served {
            Ok(sizes) => break sizes,
            Err(e) if crate::control::is_timeout(&e) => {
                give_up(s, &e.context("gave up on a silent client"), emit);
            }
            Err(e) if client_failed(&e) => give_up(s, &e.context("gave up on a client"), emit),
            Err(e) => return Err(e),
        }
    };
    linger_before_the_end(s, emit);
    match &door {
        Door::Cm(l) => refuse_waiting(l, &base),
        Door::Tcp(tcp) => refuse_waiting_tcp(tcp, s.timeout),
    }
    if !s.json {
        emit(&format!(" done: {served_sizes} sizes served"));
    }
    Ok(report)
}

/// Says why the server gave a client up (`why`), and that it waits for
/// the next.
fn give_up(s: &Settings, why: &anyhow::Error, emit: &mut dyn FnMut(&str)) {
    let line = pinpoll_appkit::error_line(why);
    tracing::warn!("{line}");
    if !s.json {
        emit(&format!(" {line}; waiting for the next client"));
    }
}

/// Where clients come in: the TCP listener of `--oob`, or rdma_cm's (the
/// control connection, then each data connection).
enum Door {
    Tcp(TcpListener),
    Cm(Listener),
}

impl Door {
    /// The next client's control channel, within `--timeout`. The outer
    /// error is the door's own (no client came: the server ends); the
    /// inner one is a client's that came and failed to connect (its
    /// private data no ring descriptor, a handshake it rejected or never
    /// finished): that client is given up, and the server goes on.
    fn accept(&self, s: &Settings) -> Result<Result<Control>> {
        match self {
            Door::Tcp(tcp) => {
                let stream = accept_within(tcp, s.timeout, "a client")?;
                stream.set_nodelay(true)?;
                Ok(Ok(Control::tcp(stream, s.timeout)))
            }
            Door::Cm(listener) => {
                let cfg = control_config(s.timeout);
                let request = listener
                    .next_request(&cfg.qp, s.timeout)
                    .context("waiting for a client's control connection")?;
                match Connection::builder(&cfg).accept(request) {
                    Ok(conn) => Ok(Ok(Control::Rdma(Box::new(conn)))),
                    Err(e) => {
                        let e = anyhow::Error::new(e)
                            .context("accepting the client's control connection");
                        if client_failed(&e) {
                            Ok(Err(e))
                        } else {
                            Err(e)
                        }
                    }
                }
            }
        }
    }
}

/// Serves one client every size it asks for, until its `End`; returns
/// how many sizes.
fn serve_client(
    s: &Settings,
    limits: &Limits,
    base: &EngineConfig,
    ctl: &mut Control,
    door: &Door,
    emit: &mut dyn FnMut(&str),
) -> Result<u64> {
    let until = Instant::now()
        .checked_add(s.max_session)
        .context("--max-session is too long for this clock")?;
    let mut served_sizes = 0u64;
    while let Some(params) = next_params(ctl, s.timeout, until, served_sizes)? {
        let cfg = admit(ctl, limits, &params, base)?;
        let nonce = data_nonce()?;
        ctl.send(&Msg::Ready { nonce })?;
        let mut conn = match door {
            Door::Cm(l) => accept_data(l, &cfg, nonce, s.timeout)
                .context("accepting the client's data connection")?,
            Door::Tcp(_) => Connection::over_tcp(
                ctl.stream().expect("a TCP control stream"),
                s.device.as_deref(),
                &cfg,
            )
            .context("the TCP exchange of the data connection")?,
        };
        let served = match serve_one_size(s, ctl, &mut conn, &params, until) {
            Err(e) if e.downcast_ref::<driver::SessionLimit>().is_some() => {
                return Err(refuse(ctl, e));
            }
            served => served?,
        };
        drop(conn);
        served_sizes += 1;
        if !s.json {
            emit(&format!(
                " served {} bytes x {} (+{} warm-up): {} messages answered or consumed",
                params.size, params.iters, params.warmup, served
            ));
        }
    }
    Ok(served_sizes)
}

/// While a client holds the server's one place, a thread of its own tells
/// every other `--oob` client at once that the server is busy (its data
/// connection is the control stream itself, so nobody else can take it;
/// a newcomer left in the listen queue would wait, unanswered, for as
/// long as the measurement takes).
struct Doorman {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Doorman {
    fn start(tcp: &TcpListener, timeout: Duration) -> Result<Doorman> {
        let tcp = tcp.try_clone().context("sharing the TCP listener")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("pinpoll-perf-busy".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((stream, peer)) => {
                            if let Err(e) = tell_busy(stream, timeout.min(BUSY_BOUND)) {
                                tracing::warn!(%peer, "telling a client the server is busy: {e:#}");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(DOORMAN_NAP);
                        }
                        Err(e) => {
                            tracing::warn!("accepting a client to tell it the server is busy: {e}");
                            std::thread::sleep(DOORMAN_NAP);
                        }
                    }
                }
            })?;
        Ok(Doorman {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Doorman {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers whatever the `--oob` client on `stream` asks with "server
/// busy", then waits for it to close, so its own message never meets a
/// reset that would discard the answer unread. All of it, whatever the
/// newcomer sends, takes at most `within`: the doorman, and the drop
/// that joins it, are held no longer than that by any one newcomer.
fn tell_busy(stream: TcpStream, within: Duration) -> Result<()> {
    let mut stream = answer_busy(stream, within)?;
    let mut rest = [0u8; 512];
    while std::io::Read::read(&mut stream, &mut rest)? > 0 {}
    Ok(())
}

/// Sends the `--oob` client on `stream` the "server busy" answer and
/// shuts the stream for writing, within `within`; returns the stream,
/// still to be read to its close (the client's own message must not meet
/// a reset that would discard the answer unread), with that deadline.
fn answer_busy(stream: TcpStream, within: Duration) -> Result<DeadlineStream> {
    stream.set_nonblocking(false)?;
    let mut ctl = Control::tcp(stream, within);
    let message = String::from_utf8_lossy(BUSY.strip_suffix(b"\0").unwrap_or(BUSY)).into_owned();
    // `send` starts the one wait; the drain after it stays in it.
    ctl.send(&Msg::Error { message })?;
    let Control::Tcp(mut stream) = ctl else {
        unreachable!("a TCP control stream");
    };
    stream.get_mut().shutdown(std::net::Shutdown::Write)?;
    Ok(stream)
}

/// How long the doorman naps between looks at the listener: a newcomer
/// waits about this long for its answer, and the measurement beside it
/// sees the thread wake only this often.
const DOORMAN_NAP: Duration = Duration::from_millis(20);

/// The longest the doorman spends on one newcomer.
const BUSY_BOUND: Duration = Duration::from_secs(2);

/// What a client that is not the one being served is told.
const BUSY: &[u8] = b"server busy: it is measuring for another client; try again later\0";

/// A nonce for the data connection: never 0, which a request without one
/// (zero-padded private data) would carry.
fn data_nonce() -> Result<u64> {
    loop {
        let nonce = pinpoll_appkit::random_u64().context("drawing a nonce")?;
        if nonce != 0 {
            return Ok(nonce);
        }
    }
}

/// The data connection of the client that was sent `nonce`, within
/// `timeout`. Any other connect request that comes meanwhile — another
/// client's — is told the server is busy, never taken for the data path.
fn accept_data(
    listener: &Listener,
    cfg: &EngineConfig,
    nonce: u64,
    timeout: Duration,
) -> Result<Connection> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let request = listener.next_request(&cfg.qp, left)?;
        if request.peer_data().starts_with(&nonce.to_be_bytes()) {
            return Ok(Connection::builder(cfg).accept(request)?);
        }
        if let Err(e) = request.reject(BUSY) {
            tracing::warn!(error = %e, "telling another client the server is busy");
        }
    }
}

/// Tells every client whose request waits on `listener` that the server
/// is busy (it serves one client, and is done with it); at most
/// [`LATECOMERS`] of them, so that clients arriving for ever cannot keep
/// the server from ending.
fn refuse_waiting(listener: &Listener, cfg: &EngineConfig) {
    for _ in 0..LATECOMERS {
        let Ok(request) = listener.next_request(&cfg.qp, Duration::ZERO) else {
            return;
        };
        if let Err(e) = request.reject(BUSY) {
            tracing::warn!(error = %e, "telling another client the server is busy");
        }
    }
}

/// [`refuse_waiting`] for `--oob`: every client already in the TCP listen
/// queue (the doorman has gone) is told the server is busy rather than
/// reset when the listener closes; at most [`LATECOMERS`] of them, all
/// within [`BUSY_BOUND`]. All are answered first, then their closes are
/// awaited together, so one that never closes costs the others nothing.
/// One that connects after the drain is still reset: a listener cannot
/// close without resetting what is queued.
fn refuse_waiting_tcp(tcp: &TcpListener, timeout: Duration) {
    let deadline = Instant::now() + timeout.min(BUSY_BOUND);
    if let Err(e) = tcp.set_nonblocking(true) {
        tracing::warn!("telling the clients queued that the server is busy: {e}");
        return;
    }
    let mut answered = Vec::new();
    for _ in 0..LATECOMERS {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match tcp.accept() {
            Ok((stream, peer)) => match answer_busy(stream, left) {
                Ok(stream) => answered.push(stream.into_inner()),
                Err(e) => tracing::warn!(%peer, "telling a client the server is busy: {e:#}"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // accept(2) reports a queued connection's network errors
            // (ECONNABORTED, ENETUNREACH, ...): the next may be fine.
            Err(e) => tracing::debug!("accepting a client to tell it the server is busy: {e}"),
        }
    }
    await_closes(answered, deadline);
}

/// Reads what each stream's client still sends until it closes, all of
/// them side by side, until `deadline` at the latest.
fn await_closes(mut open: Vec<TcpStream>, deadline: Instant) {
    open.retain(|s| s.set_nonblocking(true).is_ok());
    let mut rest = [0u8; 512];
    while !open.is_empty() && Instant::now() < deadline {
        open.retain_mut(|s| loop {
            match std::io::Read::read(s, &mut rest) {
                Ok(0) => break false,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
                Err(_) => break false,
            }
        });
        if !open.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The most latecomers told "busy" as the server ends.
const LATECOMERS: usize = 64;

/// Test hook, debug builds only: `PINPOLL_PERF_TEST_LINGER_MS=T` makes the
/// server, once its last client's session is over (the doorman gone),
/// say " lingering" and wait `T` ms before it tells the clients queued
/// meanwhile that it is busy: a test's latecomer then lands in that
/// window for sure. Release builds never wait.
pub const LINGER_ENV: &str = "PINPOLL_PERF_TEST_LINGER_MS";

fn linger_before_the_end(s: &Settings, emit: &mut dyn FnMut(&str)) {
    if !cfg!(debug_assertions) {
        return;
    }
    if let Some(ms) = std::env::var(LINGER_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let ms = ms.min(60_000);
        if !s.json {
            emit(&format!(" lingering {ms} ms ({LINGER_ENV})"));
        }
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// The TCP listener of `--oob` on `--bind`:port (IPv6 any, else IPv4
/// any, when no `--bind`).
fn listen_tcp(s: &Settings, limits: &Limits, emit: &mut dyn FnMut(&str)) -> Result<TcpListener> {
    let bind: SocketAddr = match &s.bind {
        Some(b) => parse_socket_addr(b, s.port)?,
        None => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), s.port),
    };
    let tcp = TcpListener::bind(bind)
        .or_else(|e| {
            if s.bind.is_none() {
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, s.port))
            } else {
                Err(e)
            }
        })
        .with_context(|| format!("listening on TCP port {}", s.port))?;
    if !s.json {
        emit(&format!(
            " Waiting for a client on TCP port {} (--oob); {}",
            s.port,
            allowance(limits)
        ));
    }
    Ok(tcp)
}

/// The rdma_cm listener the control connection, then the data
/// connections, come through.
fn listen_cm(s: &Settings, limits: &Limits, emit: &mut dyn FnMut(&str)) -> Result<Listener> {
    let bind = match &s.bind {
        Some(b) => parse_socket_addr(b, s.port)?,
        None => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), s.port),
    };
    let listener = Listener::bind(bind).with_context(|| format!("rdma_cm listening on {bind}"))?;
    if !s.json {
        emit(&format!(
            " Waiting for a client on {bind} (rdma_cm); {}",
            allowance(limits)
        ));
    }
    Ok(listener)
}

/// Serves one size until the client says `Done`, then tells it how many
/// messages were served; returns that count.
fn serve_one_size(
    s: &Settings,
    ctl: &mut Control,
    conn: &mut Connection,
    params: &Params,
    until: Instant,
) -> Result<u64> {
    let mut stopped = false;
    let until = driver::Until(Some(until));
    let served = driver::serve(
        conn,
        params.plan(),
        s.timeout,
        s.timeout,
        until,
        &mut || {
            if stopped {
                return Ok(true);
            }
            match ctl.try_recv() {
                Ok(Some(Msg::Done)) => {
                    stopped = true;
                    Ok(true)
                }
                Ok(Some(other)) => Err(ClientFault(format!(
                    "the client sent {other:?} during the measurement"
                ))
                .into()),
                Ok(None) => Ok(false),
                Err(e) => Err(e),
            }
        },
    )
    .with_context(|| format!("serving {} at {} bytes", params.kind.name(), params.size))?;
    ctl.send(&Msg::Served {
        messages: served.messages,
    })?;
    Ok(served.messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::sync::mpsc;

    use crate::cli::Cli;
    use crate::control::{decode, encode};
    use crate::plan::Overrides;
    use clap::Parser as _;

    /// A `send-lat --oob` server of this process on 127.0.0.1 with
    /// `--timeout timeout`, once it waits for a client: its address, its
    /// thread and its output lines.
    fn oob_server(
        timeout: &str,
    ) -> (
        SocketAddr,
        JoinHandle<Result<Report>>,
        mpsc::Receiver<String>,
    ) {
        oob_server_with(timeout, |_, _| {})
    }

    /// [`oob_server`], with `on_line` run on each line the server emits,
    /// in the server's thread, before the test sees the line.
    fn oob_server_with(
        timeout: &str,
        mut on_line: impl FnMut(SocketAddr, &str) + Send + 'static,
    ) -> (
        SocketAddr,
        JoinHandle<Result<Report>>,
        mpsc::Receiver<String>,
    ) {
        // A port nobody holds now; the server binds it at once.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let port_arg = port.to_string();
        let args = [
            "pinpoll-perf",
            "send-lat",
            "--oob",
            "--bind",
            "127.0.0.1",
            "-p",
            &port_arg,
            "--timeout",
            timeout,
        ];
        let cli = Cli::try_parse_from(args).unwrap();
        let settings = Settings::from_args(cli.command.kind(), cli.command.args(), 1).unwrap();
        let (lines, seen) = mpsc::channel();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = std::thread::spawn(move || {
            run(&settings, &mut |line: &str| {
                on_line(addr, line);
                let _ = lines.send(line.to_owned());
            })
        });
        loop {
            let line = seen
                .recv_timeout(Duration::from_secs(60))
                .expect("the server says it waits");
            if line.contains("Waiting for a client") {
                break;
            }
        }
        (addr, server, seen)
    }

    /// A client's first measurement, as the client sends it.
    fn params() -> Msg {
        let mut base = EngineConfig::load("latency").unwrap();
        base.core = None;
        let cfg = data_config(&base, Kind::SendLat, 8, &Overrides::default()).unwrap();
        Msg::Params(Params {
            kind: Kind::SendLat,
            mode: Mode::Direct,
            size: 8,
            iters: 10,
            warmup: 1,
            await_sends: false,
            config: WireConfig::from_config(&cfg),
        })
    }

    /// Frames `msg` onto `s` as the control stream carries it.
    fn send_raw(s: &mut TcpStream, msg: &Msg) {
        let body = encode(msg).unwrap();
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        s.write_all(&frame).unwrap();
    }

    /// The next message on `s` (a generous bound: only a hang trips it).
    fn recv_raw(s: &mut TcpStream, who: &str) -> Msg {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len)
            .unwrap_or_else(|e| panic!("{who} got no answer: {e}"));
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        decode(&body).unwrap()
    }

    /// A client that connects its control stream and says nothing holds
    /// the server's one place only until `--timeout`: the server gives it
    /// up and the client after it gets its `Ready`.
    #[test]
    fn a_silent_control_client_is_given_up_and_the_next_is_served() {
        let (addr, server, lines) = oob_server("1");
        let mut silent = TcpStream::connect(addr).unwrap();
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .expect("the server gives the silent client up and goes on");
            if line.contains("gave up on a silent client") {
                assert!(
                    line.contains("timed out after 1 s waiting for the client's next parameters"),
                    "{line}"
                );
                break;
            }
        }
        silent
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(silent.read(&mut [0; 8]).unwrap(), 0, "closed by the server");
        let mut honest = TcpStream::connect(addr).unwrap();
        send_raw(&mut honest, &params());
        let answer = recv_raw(&mut honest, "the client after a silent one");
        assert!(matches!(answer, Msg::Ready { .. }), "{answer:?}");
        // Beyond here the data connection needs a device: the server ends
        // on its absence, or serves.
        drop(honest);
        let _ = server.join().unwrap();
    }

    /// With --oob, a client that comes while another holds the place is
    /// told "server busy" at once, and the first is served: the control
    /// part of the race (the data connection needs a device:
    /// `a_second_oob_client_is_told_busy_and_the_first_finishes` in
    /// tests/device.rs).
    #[test]
    fn a_second_oob_client_is_told_busy_while_the_first_holds_the_place() {
        let (addr, server, _lines) = oob_server("30");
        let mut first = TcpStream::connect(addr).unwrap();
        let mut second = TcpStream::connect(addr).unwrap();
        send_raw(&mut second, &params());
        match recv_raw(&mut second, "the second client") {
            Msg::Error { message } => assert!(message.contains("server busy"), "{message}"),
            other => panic!("the second client was answered {other:?}"),
        }
        send_raw(&mut first, &params());
        let answer = recv_raw(&mut first, "the first client");
        assert!(matches!(answer, Msg::Ready { .. }), "{answer:?}");
        drop((first, second));
        let _ = server.join().unwrap();
    }

    /// The server's next line that contains `what`, or a panic naming
    /// what the server did instead (its end, or nothing for a minute).
    fn line_with(lines: &mpsc::Receiver<String>, what: &str) -> String {
        loop {
            match lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(e) => panic!("the server said no {what:?}: {e}"),
            }
        }
    }

    /// A newcomer that sends a byte every 500 ms while another client
    /// holds the place is told "busy" and let go within the doorman's
    /// bound, however long it trickles, so the doorman never holds the
    /// server up and the client after a given-up one is served.
    #[test]
    fn a_trickling_newcomer_does_not_hold_the_server_up() {
        let (addr, server, lines) = oob_server("1");
        let silent = TcpStream::connect(addr).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let trickler = {
            let stop = Arc::clone(&stop);
            let mut t = TcpStream::connect(addr).unwrap();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) && t.write_all(b"x").is_ok() {
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        };
        line_with(&lines, "gave up on a silent client");
        let mut honest = TcpStream::connect(addr).unwrap();
        send_raw(&mut honest, &params());
        let answer = recv_raw(&mut honest, "the client after a silent one");
        stop.store(true, Ordering::Relaxed);
        assert!(matches!(answer, Msg::Ready { .. }), "{answer:?}");
        drop((honest, silent));
        trickler.join().unwrap();
        let _ = server.join().unwrap();
    }

    /// As the server ends, a latecomer that never closes costs the ones
    /// queued behind it nothing: all are answered "busy" first, their
    /// closes awaited together (one at a time, the first used up the
    /// whole 2 s and the next was reset unanswered).
    #[test]
    fn a_silent_latecomer_does_not_keep_the_next_from_being_told_busy() {
        let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = tcp.local_addr().unwrap();
        let silent = TcpStream::connect(addr).unwrap();
        let mut honest = TcpStream::connect(addr).unwrap();
        send_raw(&mut honest, &params());
        refuse_waiting_tcp(&tcp, Duration::from_secs(10));
        drop(tcp);
        match recv_raw(&mut honest, "the latecomer behind a silent one") {
            Msg::Error { message } => assert!(message.contains("server busy"), "{message}"),
            other => panic!("the latecomer was answered {other:?}"),
        }
        drop(silent);
    }

    /// A client that connects and closes at once (a port scan) is
    /// reported and given up; the server answers the next.
    #[test]
    fn a_client_that_connects_and_closes_does_not_end_the_server() {
        let (addr, server, lines) = oob_server("5");
        drop(TcpStream::connect(addr).unwrap());
        let line = line_with(&lines, "gave up on a client");
        assert!(line.contains("closed"), "{line}");
        let mut honest = TcpStream::connect(addr).unwrap();
        send_raw(&mut honest, &params());
        let answer = recv_raw(&mut honest, "the client after one that closed");
        assert!(matches!(answer, Msg::Ready { .. }), "{answer:?}");
        drop(honest);
        let _ = server.join().unwrap();
    }

    /// A client whose first frame claims 4 GiB is told why, reported and
    /// given up; the server answers the next.
    #[test]
    fn a_client_s_bad_frame_does_not_end_the_server() {
        let (addr, server, lines) = oob_server("5");
        let mut bad = TcpStream::connect(addr).unwrap();
        bad.write_all(&[0xff; 4]).unwrap();
        match recv_raw(&mut bad, "the client of a bad frame") {
            Msg::Error { message } => assert!(message.contains("too long"), "{message}"),
            other => panic!("a bad frame was answered {other:?}"),
        }
        let line = line_with(&lines, "gave up on a client");
        assert!(line.contains("too long"), "{line}");
        drop(bad);
        let mut honest = TcpStream::connect(addr).unwrap();
        send_raw(&mut honest, &params());
        let answer = recv_raw(&mut honest, "the client after a bad frame");
        assert!(matches!(answer, Msg::Ready { .. }), "{answer:?}");
        drop(honest);
        let _ = server.join().unwrap();
    }

    /// A client that connects the moment the server says it waits for
    /// the next one is served, never told "busy": the doorman of the
    /// client given up is gone before the server says so. (The client
    /// connects from within the server's report and lingers there for
    /// many of the doorman's naps, so a doorman still at work would
    /// take it.)
    #[test]
    fn the_client_that_comes_as_the_server_says_it_waits_is_served() {
        let (arrived, came) = mpsc::channel();
        // Once: a client connected at every such line would be served,
        // given up and replaced for ever (with a device the data
        // connection's exchange gets that far).
        let mut arrived = Some(arrived);
        let (addr, server, lines) = oob_server_with("5", move |addr, line| {
            if line.contains("waiting for the next client") {
                if let Some(arrived) = arrived.take() {
                    let next = TcpStream::connect(addr).unwrap();
                    std::thread::sleep(DOORMAN_NAP * 10);
                    let _ = arrived.send(next);
                }
            }
        });
        let mut bad = TcpStream::connect(addr).unwrap();
        bad.write_all(&[0xff; 4]).unwrap();
        line_with(&lines, "gave up on a client");
        drop(bad);
        let mut next = came
            .recv_timeout(Duration::from_secs(60))
            .expect("the next client connected");
        send_raw(&mut next, &params());
        let answer = recv_raw(
            &mut next,
            "the client that came as the server said it waits",
        );
        assert!(matches!(answer, Msg::Ready { .. }), "{answer:?}");
        drop(next);
        let _ = server.join().unwrap();
    }

    /// The server's control stream of a client on `peer` (the client's
    /// end), over loopback TCP.
    fn control_pair() -> (Control, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        (Control::tcp(server, Duration::from_secs(60)), peer)
    }

    /// Parameters that come after the session's end are refused, and the
    /// client is told "session limit reached".
    #[test]
    fn parameters_past_the_session_limit_are_refused_and_the_client_told() {
        let (mut ctl, mut client) = control_pair();
        let timeout = Duration::from_secs(60);
        let until = Instant::now() + Duration::from_millis(1);
        std::thread::sleep(Duration::from_millis(2));
        send_raw(&mut client, &params());
        let err = next_params(&mut ctl, timeout, until, 0).expect_err("past the end");
        assert!(client_failed(&err), "{err:#}");
        assert!(
            format!("{err:#}").contains("session limit reached"),
            "{err:#}"
        );
        match recv_raw(&mut client, "the client past its session") {
            Msg::Error { message } => {
                assert!(message.contains("session limit reached"), "{message}")
            }
            other => panic!("answered {other:?}"),
        }
        // Before the end, the same parameters are taken.
        let until = Instant::now() + Duration::from_secs(3600);
        send_raw(&mut client, &params());
        let got = next_params(&mut ctl, timeout, until, 0).unwrap();
        assert!(got.is_some());
    }

    /// A client may ask for MAX_SESSION_SIZES sizes, and no more.
    #[test]
    fn a_client_asking_more_sizes_than_the_cap_is_refused() {
        let (mut ctl, mut client) = control_pair();
        let (timeout, until) = (
            Duration::from_secs(60),
            Instant::now() + Duration::from_secs(3600),
        );
        send_raw(&mut client, &params());
        assert!(next_params(&mut ctl, timeout, until, MAX_SESSION_SIZES - 1)
            .unwrap()
            .is_some());
        send_raw(&mut client, &params());
        let err =
            next_params(&mut ctl, timeout, until, MAX_SESSION_SIZES).expect_err("over the cap");
        assert!(client_failed(&err), "{err:#}");
        match recv_raw(&mut client, "the client over the cap") {
            Msg::Error { message } => assert!(
                message.contains(&format!("more than {MAX_SESSION_SIZES} sizes")),
                "{message}"
            ),
            other => panic!("answered {other:?}"),
        }
    }

    /// The session's end stops a server busy serving, not only one that
    /// waits (`Until` is checked on the fast path too), and no end never
    /// stops it.
    #[test]
    fn the_session_end_is_seen_while_serving() {
        let past = driver::Until(Some(Instant::now()));
        std::thread::sleep(Duration::from_millis(1));
        let err = past.check(0).expect_err("the end has passed");
        assert!(err.is::<driver::SessionLimit>(), "{err}");
        assert!(past.check(1).is_ok(), "between two looks at the clock");
        assert!(driver::Until(None).check(0).is_ok());
        let ahead = driver::Until(Some(Instant::now() + Duration::from_secs(3600)));
        assert!(ahead.check(0).is_ok());
    }

    /// A driver whose round trips succeed `left` times, then fail as a
    /// peer that went away would.
    struct Countdown {
        left: u64,
        done: u64,
    }

    impl Driver for Countdown {
        fn round_trip(&mut self) -> anyhow::Result<()> {
            if self.left == 0 {
                return Err(pinpoll::Error::Disconnected.into());
            }
            self.left -= 1;
            self.done += 1;
            Ok(())
        }
        fn stream(&mut self, _: u64) -> anyhow::Result<()> {
            unreachable!("a latency test")
        }
        fn stats(&self) -> Option<pinpoll::datapath::Stats> {
            None
        }
        fn inline_threshold(&self) -> usize {
            0
        }
        fn quiesce(&mut self) -> anyhow::Result<()> {
            Ok(())
        }
        fn finish(self: Box<Self>) -> anyhow::Result<pinpoll::datapath::Stats> {
            Ok(pinpoll::datapath::Stats::default())
        }
    }

    /// `-n 2^40` (the largest the control protocol allows) holds at most
    /// SAMPLE_BATCH samples: the run starts and measures, rather than
    /// aborting on an allocation of 8 TiB; here the peer leaves first.
    #[test]
    fn a_huge_iteration_count_measures_in_bounded_memory() {
        let mut driver = Countdown {
            left: 1000,
            done: 0,
        };
        let err = measure(&mut driver, Kind::SendLat, 8, 1 << 40, 0)
            .err()
            .expect("the peer left");
        assert!(
            matches!(err.downcast_ref(), Some(pinpoll::Error::Disconnected)),
            "{err}"
        );
        assert_eq!(driver.done, 1000);
    }

    #[test]
    fn more_iterations_than_a_batch_are_all_counted() {
        let mut driver = Countdown { left: 25, done: 0 };
        let (samples, raw) = round_trips(&mut driver, 25, 4).unwrap();
        assert_eq!(samples.len(), 25);
        assert!(raw.is_empty(), "raw samples of a run over one batch");
        let mut driver = Countdown { left: 3, done: 0 };
        let (samples, raw) = round_trips(&mut driver, 3, 4).unwrap();
        assert_eq!((samples.len(), raw.len()), (3, 3));
    }
}
