//! The server's admission of clients: which connect request becomes a
//! transfer, on which thread, and what the accept loop counts.
//!
//! The accept loop only classifies a request and never waits on a
//! client: a further stream of a transfer is handed to that transfer's
//! thread ([`Joins::hand_over`]); a hello that is not one, or a client
//! beyond `--max-clients`, is rejected at once, without a thread; a new
//! transfer gets a thread of its own, where the rdma_cm handshake (accept
//! → ESTABLISHED) and the whole transfer run. A client that connects and
//! never completes its handshake holds its own place until the connect
//! timeout, never the loop. Finished threads are joined as the loop goes
//! on, so a server's threads and their stacks are bounded by
//! `--max-clients` however many transfers it serves. `--count` counts
//! transfers that got past their handshake; refusals and failed
//! handshakes are not transfers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Context as _;
use pinpoll::connect::cm::Request;
use pinpoll::{Access, Connection, EngineConfig};

use crate::cli::show_addr;
use crate::filexfer::classic::ClassicSide;
use crate::filexfer::device_watch::{listed_devices, DeviceWatch};
use crate::filexfer::in_flight::InFlight;
use crate::filexfer::protocol::{classify_hello, Hello};
use crate::filexfer::server::{join_stream, native_accept_error, ServeOptions, Side, Transfer};
use crate::filexfer::server_dir::ServerDir;
use crate::filexfer::space::Space;
use crate::filexfer::streams::Joins;
use crate::output::Output;
use crate::run::error_line;
use crate::session::{check_device, refuse, Accepting, Incoming};

/// What a transfer's thread tells the accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    /// The handshake ended: established, or failed (reported already).
    Handshake { established: bool },
    /// The transfer ended: succeeded, or failed (reported already).
    Ended { ok: bool },
}

/// One admitted client's place among `--max-clients` and its reports to
/// the accept loop, given back however its thread ends — a panic
/// included: a place is never lost, and the loop never waits for a
/// handshake that will not end.
struct Place {
    active: Arc<AtomicUsize>,
    report: mpsc::Sender<Report>,
    handshake: Option<bool>,
    ended: Option<bool>,
}

impl Place {
    /// Takes a place, if fewer than `max` are taken.
    fn take(active: &Arc<AtomicUsize>, max: usize, report: &mpsc::Sender<Report>) -> Option<Place> {
        active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Place {
            active: Arc::clone(active),
            report: report.clone(),
            handshake: None,
            ended: None,
        })
    }

    fn handshake_ended(&mut self, established: bool) {
        self.handshake = Some(established);
        let _ = self.report.send(Report::Handshake { established });
    }

    fn ended(&mut self, ok: bool) {
        self.ended = Some(ok);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.handshake.is_none() {
            let _ = self.report.send(Report::Handshake { established: false });
        }
        // The place is free before the loop hears the transfer ended.
        self.active.fetch_sub(1, Ordering::SeqCst);
        let ok = self.ended.unwrap_or(false);
        let _ = self.report.send(Report::Ended { ok });
    }
}

/// What every transfer of one server shares, and the threads they run on.
pub struct Admission<'a> {
    opts: &'a ServeOptions,
    device: Option<&'a str>,
    cfg: &'a EngineConfig,
    dir: ServerDir,
    out: Output,
    /// Transfers admitted and not yet ended, handshakes included.
    active: Arc<AtomicUsize>,
    /// Set by a transfer that ended because its RDMA device went away.
    device_lost: Arc<Mutex<Option<String>>>,
    devices: DeviceWatch,
    /// Set by the accept loop when a device it used is no longer listed.
    /// Kept apart: a transfer that names the device's own event says more,
    /// and it may tell only after the listing changed (its teardown takes
    /// seconds).
    unlisted: Option<String>,
    serial: AtomicU64,
    in_flight: InFlight,
    space: Space,
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
        dir: ServerDir,
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
            devices: {
                let mut watch = DeviceWatch::new(Instant::now());
                if let Some(device) = device {
                    watch.used(device);
                }
                watch
            },
            unlisted: None,
            serial: AtomicU64::new(0),
            in_flight: InFlight::default(),
            space: Space::new(opts.max_size, opts.min_free),
            joins: Joins::default(),
            reports,
            report,
            threads: Vec::new(),
        }
    }

    /// Why the server must stop: its RDMA device went away. Also looks
    /// (at most once a second) whether every device it used is listed.
    pub fn device_lost(&mut self) -> Option<String> {
        if self.unlisted.is_none() {
            self.unlisted = self
                .devices
                .look(Instant::now(), listed_devices)
                .map(|gone| format!("RDMA device {gone} is no longer listed"));
        }
        self.lost_device()
    }

    /// What [`device_lost`](Self::device_lost) found so far, without
    /// looking: a transfer's report of the device's event first.
    fn lost_device(&self) -> Option<String> {
        let reported = self.device_lost.lock().ok().and_then(|l| l.clone());
        reported.or_else(|| self.unlisted.clone())
    }

    /// Passes what the transfers' threads reported on to `server`'s
    /// counts, and joins the threads that ended (a thread not joined keeps
    /// its stack mapped).
    pub fn collect(&mut self, server: &mut Accepting) {
        let (ended, running) = std::mem::take(&mut self.threads)
            .into_iter()
            .partition(JoinHandle::is_finished);
        self.threads = running;
        for handle in ended {
            // A panic was reported by its Place (a failed transfer) and
            // by the panic message on stderr.
            let _ = handle.join();
        }
        for report in self.reports.try_iter() {
            match report {
                Report::Handshake { established } => server.handshake_ended(established),
                Report::Ended { ok } => server.count_failed(u64::from(!ok)),
            }
        }
    }

    /// The transfers' threads not joined yet.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Admits `req`: hands a further stream to its transfer; rejects a
    /// hello that is not one, a client while `--max-clients` transfers run
    /// or while the handshakes under way would reach `--count`; or starts
    /// a transfer on a thread of its own. Never waits on the client.
    pub fn admit(&mut self, mut req: Request, server: &mut Accepting) -> anyhow::Result<()> {
        let peer = show_addr(req.peer_addr());
        self.devices.used(req.endpoint().device_name());
        let hello = match classify_hello(req.private_data()) {
            Ok(Hello::Join { token, stream }) => {
                join_stream(req, &self.joins, token, stream);
                return Ok(());
            }
            Ok(hello) => hello,
            Err(why) => {
                server.failed(&peer, &refuse(req, anyhow::anyhow!(why)));
                return Ok(());
            }
        };
        let max = self.opts.max_clients;
        let place = if server.has_room() {
            Place::take(&self.active, max, &self.report)
                .ok_or_else(|| format!("{max} transfers in progress (--max-clients {max})"))
        } else {
            Err("its last transfer (--count) is starting".to_owned())
        };
        let place = match place {
            Ok(place) => place,
            Err(busy) => {
                let reason = format!("server busy: {busy}; try again later\0");
                if let Err(err) = req.reject(reason.as_bytes()) {
                    tracing::warn!(error = %err, "rejecting a client failed");
                }
                return self
                    .out
                    .progress(format_args!("client {peer}: refused, server busy"));
            }
        };
        server.handshaking();
        let job = self.transfer(&req, peer.clone());
        if let Err(err) = self.start(req, hello, job, place) {
            // The place went back as the thread's closure was dropped, and
            // counted the failure; its reports arrive with the next
            // `collect`.
            let err = anyhow::Error::new(err).context("starting a thread");
            eprintln!("error: client {peer}: {}", error_line(&err));
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
            space: self.space.clone(),
            min_rate: self.opts.min_rate,
            deadline: self.opts.deadline,
            in_flight: self.in_flight.clone(),
            joins: self.joins.clone(),
            peer_ip: req.peer_addr().map(|a| a.ip()),
            cores: self.opts.cores.clone(),
            out: self.out,
        }
    }

    /// Starts the thread that completes `req`'s handshake and runs `job`
    /// in `place`.
    fn start(
        &mut self,
        req: Request,
        hello: Hello,
        job: Transfer,
        mut place: Place,
    ) -> std::io::Result<()> {
        let device_lost = Arc::clone(&self.device_lost);
        let (cfg, device) = (self.cfg.clone(), self.device.map(str::to_owned));
        let handle = std::thread::Builder::new()
            .name(format!("filexfer {}", job.peer))
            .spawn(move || {
                let side = handshake(req, hello, &cfg, device.as_deref());
                place.handshake_ended(side.is_ok());
                let peer = job.peer.clone();
                let result = side.and_then(|side| {
                    job.out.progress(format_args!("client {peer}: connected"))?;
                    job.serve(side)
                });
                if let Err(err) = &result {
                    eprintln!("error: client {peer}: {}", error_line(err));
                    if let Some(why) = device_gone(err) {
                        if let Ok(mut lost) = device_lost.lock() {
                            lost.get_or_insert(why);
                        }
                    }
                }
                place.ended(result.is_ok());
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
            // A panic was counted by its Place.
            let _ = handle.join();
        }
        self.collect(server);
        if let Some(why) = self.lost_device() {
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
            join_stream(req, &self.joins, token, stream);
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
    hello: Hello,
    cfg: &EngineConfig,
    device: Option<&str>,
) -> anyhow::Result<Side> {
    if let Err(err) = check_device(req.endpoint(), device) {
        return Err(refuse(req, err));
    }
    match hello {
        Hello::Classic => match ClassicSide::prepare(req.endpoint(), cfg.pages) {
            Err(err) => Err(refuse(req, err)),
            Ok(side) => req
                .accept(&[])
                .context("accepting")
                .map(|ep| Side::Classic(Box::new((side, ep)))),
        },
        // Joins are handed over by the accept loop; this arm only
        // completes the match.
        Hello::Join { .. } => Err(refuse(req, anyhow::anyhow!("a stream of no transfer"))),
        // The client is told why when its ring cannot be registered (the
        // engine's own refusal names no cause).
        Hello::Native => match pinpoll::memory::check_memlock(cfg.registered_bytes()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_come_back_however_a_thread_ends() {
        let active = Arc::new(AtomicUsize::new(0));
        let (report, reports) = mpsc::channel();
        let first = Place::take(&active, 2, &report).expect("room");
        let second = Place::take(&active, 2, &report).expect("room");
        assert!(
            Place::take(&active, 2, &report).is_none(),
            "--max-clients 2"
        );
        // A transfer that ends normally reports both steps.
        let ok = std::thread::spawn(move || {
            let mut place = first;
            place.handshake_ended(true);
            place.ended(true);
        });
        ok.join().unwrap();
        // A transfer whose thread panics mid-way still gives its place back
        // and ends its handshake and transfer as failed.
        let panicked = std::thread::spawn(move || {
            let _place = second;
            panic!("a bug in a transfer");
        });
        assert!(panicked.join().is_err());
        assert_eq!(active.load(Ordering::SeqCst), 0, "every place came back");
        let seen: Vec<Report> = reports.try_iter().collect();
        assert_eq!(
            seen,
            [
                Report::Handshake { established: true },
                Report::Ended { ok: true },
                Report::Handshake { established: false },
                Report::Ended { ok: false },
            ]
        );
        assert!(Place::take(&active, 2, &report).is_some(), "room again");
    }
}
