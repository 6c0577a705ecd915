//! The server's admission of clients: which connect request becomes a
//! transfer, on which thread, and what the accept loop counts.
//!
//! The accept loop only classifies a request (a further stream of a
//! transfer, a busy refusal, or a new transfer) and hands a new one to a
//! thread of its own, where the rdma_cm handshake (accept → ESTABLISHED)
//! and the whole transfer run: a client that connects and never completes
//! the handshake holds its own thread until the connect timeout, never the
//! loop. `--count` counts transfers that got past their handshake; busy
//! refusals and failed handshakes are not transfers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::Context as _;
use pinpoll::connect::cm::Request;
use pinpoll::{Access, Connection, EngineConfig};

use crate::cli::show_addr;
use crate::filexfer::classic::ClassicSide;
use crate::filexfer::in_flight::InFlight;
use crate::filexfer::protocol::{classify_hello, Hello};
use crate::filexfer::server::{join_stream, native_accept_error, ServeOptions, Side, Transfer};
use crate::filexfer::streams::Joins;
use crate::output::Output;
use crate::run::error_line;
use crate::session::{check_device, refuse, Accepting, Incoming};

/// What a transfer's thread tells the accept loop.
enum Report {
    /// The handshake ended: established, or failed (reported already).
    Handshake { established: bool },
    /// The transfer ended: succeeded, or failed (reported already).
    Ended { ok: bool },
}

/// What every transfer of one server shares, and the threads they run on.
pub struct Admission<'a> {
    opts: &'a ServeOptions,
    device: Option<&'a str>,
    cfg: &'a EngineConfig,
    dir: std::path::PathBuf,
    out: Output,
    /// Transfers admitted and not yet ended, handshakes included.
    active: Arc<AtomicUsize>,
    /// Set by a transfer that ended because its RDMA device went away.
    device_lost: Arc<Mutex<Option<String>>>,
    serial: AtomicU64,
    in_flight: InFlight,
    joins: Joins,
    reports: mpsc::Receiver<Report>,
    report: mpsc::Sender<Report>,
    threads: Vec<JoinHandle<()>>,
}

impl<'a> Admission<'a> {
    pub fn new(
        opts: &'a ServeOptions,
        device: Option<&'a str>,
        cfg: &'a EngineConfig,
        dir: std::path::PathBuf,
        out: Output,
    ) -> Self {
        let (report, reports) = mpsc::channel();
        Admission {
            opts,
            device,
            cfg,
            dir,
            out,
            active: Arc::default(),
            device_lost: Arc::default(),
            serial: AtomicU64::new(0),
            in_flight: InFlight::default(),
            joins: Joins::default(),
            reports,
            report,
            threads: Vec::new(),
        }
    }

    /// Why the server must stop: its RDMA device went away.
    pub fn device_lost(&self) -> Option<String> {
        self.device_lost.lock().ok().and_then(|l| l.clone())
    }

    /// Passes what the transfers' threads reported on to `server`'s counts.
    pub fn collect(&self, server: &mut Accepting) {
        for report in self.reports.try_iter() {
            match report {
                Report::Handshake { established } => server.handshake_ended(established),
                Report::Ended { ok } => server.count_failed(u64::from(!ok)),
            }
        }
    }

    /// Admits `req`: joins a further stream to its transfer, refuses a
    /// client while `--max-clients` transfers run or while the handshakes
    /// under way would reach `--count`, or starts a transfer on a thread of
    /// its own.
    pub fn admit(&mut self, req: Request, server: &mut Accepting) -> anyhow::Result<()> {
        let peer = show_addr(req.peer_addr());
        let hello = classify_hello(req.private_data());
        if let Ok(Hello::Join { token, stream }) = hello {
            join_stream(req, &self.joins, self.cfg, token, stream);
            return Ok(());
        }
        let max = self.opts.max_clients;
        let busy = if self.active.load(Ordering::SeqCst) >= max {
            Some(format!("{max} transfers in progress (--max-clients {max})"))
        } else if !server.has_room() {
            Some("its last transfer (--count) is starting".to_owned())
        } else {
            None
        };
        if let Some(busy) = busy.filter(|_| hello.is_ok()) {
            let reason = format!("server busy: {busy}; try again later\0");
            if let Err(err) = req.reject(reason.as_bytes()) {
                tracing::warn!(error = %err, "rejecting a client failed");
            }
            return self
                .out
                .progress(format_args!("client {peer}: refused, server busy"));
        }
        server.handshaking();
        self.active.fetch_add(1, Ordering::SeqCst);
        let job = self.transfer(&req, peer.clone());
        let started = self.start(req, hello, job);
        if let Err(err) = started {
            self.active.fetch_sub(1, Ordering::SeqCst);
            server.handshake_ended(false);
            server.failed(&peer, &anyhow::Error::new(err).context("starting a thread"));
        }
        Ok(())
    }

    fn transfer(&self, req: &Request, peer: String) -> Transfer {
        Transfer {
            dir: self.dir.clone(),
            overwrite: self.opts.overwrite,
            cfg: self.cfg.clone(),
            peer,
            serial: self.serial.fetch_add(1, Ordering::SeqCst),
            verify_threads: self.opts.verify_threads,
            max_size: self.opts.max_size,
            min_rate: self.opts.min_rate,
            deadline: self.opts.deadline,
            in_flight: self.in_flight.clone(),
            joins: self.joins.clone(),
            peer_ip: req.peer_addr().map(|a| a.ip()),
            cores: self.opts.cores.clone(),
            out: self.out,
        }
    }

    /// Starts the thread that completes `req`'s handshake and runs `job`.
    fn start(
        &mut self,
        req: Request,
        hello: Result<Hello, String>,
        job: Transfer,
    ) -> std::io::Result<()> {
        let (active, report, device_lost) = (
            Arc::clone(&self.active),
            self.report.clone(),
            Arc::clone(&self.device_lost),
        );
        let (cfg, device, max_size) = (
            self.cfg.clone(),
            self.device.map(str::to_owned),
            self.opts.max_size,
        );
        let handle = std::thread::Builder::new()
            .name(format!("filexfer {}", job.peer))
            .spawn(move || {
                let side = handshake(req, hello, &cfg, device.as_deref(), max_size);
                let _ = report.send(Report::Handshake {
                    established: side.is_ok(),
                });
                let peer = job.peer.clone();
                let result = side.and_then(|side| {
                    job.out.progress(format_args!("client {peer}: connected"))?;
                    job.serve(side)
                });
                let ok = match result {
                    Ok(()) => true,
                    Err(err) => {
                        eprintln!("error: client {peer}: {}", error_line(&err));
                        if let Some(why) = device_gone(&err) {
                            if let Ok(mut lost) = device_lost.lock() {
                                lost.get_or_insert(why);
                            }
                        }
                        false
                    }
                };
                active.fetch_sub(1, Ordering::SeqCst);
                let _ = report.send(Report::Ended { ok });
            })?;
        self.threads.push(handle);
        Ok(())
    }

    /// Tells clients that come while the last transfers finish (--count
    /// reached, a signal, a lost device) so at once, rather than leaving
    /// them to time out on a listener nobody answers; lets further streams
    /// of running transfers join; then waits for every transfer.
    pub fn finish(mut self, server: &mut Accepting) -> anyhow::Result<()> {
        while let Some(listener) = server
            .listener()
            .filter(|_| self.active.load(Ordering::SeqCst) > 0)
        {
            match crate::session::next_request(listener, &self.cfg.qp) {
                Ok(Incoming::Request(req)) => self.refuse_while_finishing(*req)?,
                Ok(Incoming::Idle | Incoming::Refused) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "waiting for clients while finishing");
                    break;
                }
            }
        }
        server.stop_listening();
        for handle in std::mem::take(&mut self.threads) {
            if handle.join().is_err() {
                server.count_failed(1);
            }
        }
        self.collect(server);
        if let Some(why) = self.device_lost() {
            // The failed transfer said why in its error line. Staying up
            // would keep the dead device open, and removing a device (`rdma
            // link delete`) waits until every process has let go of it.
            self.out.progress(format_args!(
                "stopping: {why}; start the server again once the device is back"
            ))?;
        }
        Ok(())
    }

    fn refuse_while_finishing(&self, req: Request) -> anyhow::Result<()> {
        if let Ok(Hello::Join { token, stream }) = classify_hello(req.private_data()) {
            join_stream(req, &self.joins, self.cfg, token, stream);
            return Ok(());
        }
        let peer = show_addr(req.peer_addr());
        let reason =
            "server busy: finishing its last transfers, it accepts no more; try again later\0";
        if let Err(err) = req.reject(reason.as_bytes()) {
            tracing::warn!(error = %err, "rejecting a client failed");
        }
        self.out
            .progress(format_args!("client {peer}: refused, server finishing"))
    }
}

/// Completes the handshake of `req` on the calling thread: checks the
/// device and the hello, prepares the side its protocol needs, accepts,
/// and waits for ESTABLISHED (bounded by the connect timeout). A refused
/// client is told why.
fn handshake(
    mut req: Request,
    hello: Result<Hello, String>,
    cfg: &EngineConfig,
    device: Option<&str>,
    max_size: Option<u64>,
) -> anyhow::Result<Side> {
    if let Err(err) = check_device(req.endpoint(), device) {
        return Err(refuse(req, err));
    }
    match hello {
        Err(why) => Err(refuse(req, anyhow::anyhow!(why))),
        Ok(Hello::Classic) => match ClassicSide::prepare(req.endpoint(), cfg.pages, max_size) {
            Err(err) => Err(refuse(req, err)),
            Ok(side) => req
                .accept(&[])
                .context("accepting")
                .map(|ep| Side::Classic(Box::new((side, ep)))),
        },
        // Joins are handed over by the accept loop; this arm only
        // completes the match.
        Ok(Hello::Join { .. }) => Err(refuse(req, anyhow::anyhow!("a stream of no transfer"))),
        // The client is told why when its ring cannot be registered (the
        // engine's own refusal names no cause).
        Ok(Hello::Native) => match pinpoll::memory::check_memlock(cfg.registered_bytes()) {
            Err(err) => Err(refuse(
                req,
                anyhow::Error::new(err).context("registering the chunk ring"),
            )),
            Ok(()) => Connection::builder(cfg)
                .remote_access(Access::REMOTE_WRITE)
                .accept(req)
                .map(|conn| Side::Native(Box::new(conn)))
                .map_err(native_accept_error),
        },
    }
}

/// Whether `err` says the RDMA device itself went away (removed, or a
/// fatal device error) — not a port that may come back — and if so, which.
fn device_gone(err: &anyhow::Error) -> Option<String> {
    err.chain()
        .find_map(|cause| match cause.downcast_ref::<pinpoll::Error>() {
            Some(pinpoll::Error::DeviceEvent { device, event })
                if event.contains("DEVICE_REMOVAL") || event.contains("DEVICE_FATAL") =>
            {
                Some(format!("RDMA device {device} reported {event}"))
            }
            _ => None,
        })
}
