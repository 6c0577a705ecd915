//! `filexfer serve`: the accept loop and one transfer's receive side.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use pinpoll::connect::cm::Request;
use pinpoll::{Access, Connection, Endpoint, EngineConfig};

use crate::cli::{socket_addr, CommonArgs};
use crate::filexfer::admission::Admission;
use crate::filexfer::chunk_pool::{PipelineError, PoolSize};
use crate::filexfer::classic::{ClassicJob, ClassicSide};
use crate::filexfer::digest::{ChunkGeometry, DigestError};
use crate::filexfer::in_flight::InFlight;
use crate::filexfer::pace::Pace;
use crate::filexfer::protocol::{self, FailCode, Msg};
use crate::filexfer::server_core::{self, Action, Event, ServerCore};
use crate::filexfer::server_dir::ServerDir;
use crate::filexfer::space::{Space, SpaceRefusal};
use crate::filexfer::streams::{
    first_failure, next_arrival, Arrival, Gathering, JoinRequest as _, Joins, NotWaited,
};
use crate::filexfer::temp::{self, TempFile};
use crate::filexfer::verify::VerifierPool;
use crate::filexfer::{
    check_cores, core_for, digest_summary, engine_config, explain_link, is_registration, pin,
    with_transport, CHUNK, SLOTS, TRAILER,
};
use crate::output::{printable, Output};
use crate::run::error_line;
use crate::session::{device_exists, Accepting};

/// What `serve` needs from the command line.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub dir: PathBuf,
    pub bind: String,
    pub port: u16,
    pub hugepages: bool,
    pub max_clients: usize,
    pub count: Option<u64>,
    pub overwrite: bool,
    /// Cores to pin to (`--core`): the accept loop and each transfer's
    /// first stream to the first, stream `s` to core `s % len`.
    pub cores: Vec<usize>,
    /// Threads checking and writing each transfer's chunks.
    pub verify_threads: usize,
    /// The largest file accepted (`--max-size`).
    pub max_size: u64,
    /// The free space a transfer must leave (`--min-free`); `None`: a
    /// twentieth of the file system, at most 1 GiB.
    pub min_free: Option<u64>,
    /// The slowest a transfer may be, in bytes/s over a window
    /// (`--min-rate`); 0: no bound.
    pub min_rate: u64,
    /// The longest a transfer may take (`--deadline`); 0: no bound.
    pub deadline: Duration,
    /// Transport settings from a tuning profile (`--profile`).
    pub profile: Option<pinpoll::EngineConfig>,
}

/// A refusal the client is told about (`Fail{code, message}`).
use crate::filexfer::server_core::Failure as Refusal;

pub(crate) fn refusal(code: FailCode, message: impl Into<String>) -> anyhow::Error {
    Refusal::new(code, message).into()
}

/// The temp file serial of the start-up probe: one no transfer reaches.
const PROBE_SERIAL: u64 = u64::MAX;

/// Checks `--dir`: an existing directory this process can create files in.
/// Returns it held open (see [`ServerDir`]), shown by its absolute path.
pub fn check_dir(dir: &Path) -> anyhow::Result<ServerDir> {
    let shown = dir.display();
    let meta = std::fs::metadata(dir).with_context(|| format!("--dir {shown}"))?;
    if !meta.is_dir() {
        bail!("--dir {shown}: not a directory");
    }
    let absolute = dir
        .canonicalize()
        .with_context(|| format!("--dir {shown}"))?;
    let held = ServerDir::open(&absolute).map_err(|e| dir_error(e, &shown.to_string()))?;
    // Read while no transfer runs: where the umask can only be set and set
    // back, nothing else creates files meanwhile.
    temp::stored_mode();
    // A temp file as a transfer creates one: a name no earlier server, not
    // even a killed one of this same PID, can have left (its NONCE), and
    // where O_TMPFILE works, never named before it is locked. Removed as
    // it is dropped.
    TempFile::create(&held, PROBE_SERIAL).map_err(|e| probe_error(e, &shown.to_string()))?;
    Ok(held)
}

/// Why `--dir` could not be opened, with what the server needs of it.
fn dir_error(e: std::io::Error, shown: &str) -> anyhow::Error {
    let need = match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            " (the server needs search permission on --dir and every directory above it)"
        }
        _ => "",
    };
    anyhow::Error::new(e).context(format!("--dir {shown}{need}"))
}

/// Why the start-up check could not create a file in `--dir`. Its lock
/// taken by someone else means another server starting there at that
/// instant took it for a dead server's (where O_TMPFILE is missing): the
/// directory itself is fine.
fn probe_error(e: std::io::Error, shown: &str) -> anyhow::Error {
    let what = match e.kind() {
        std::io::ErrorKind::WouldBlock => format!(
            "--dir {shown}: another filexfer server starting there at the same instant took this one's check file for a dead server's; start again"
        ),
        _ => format!("--dir {shown}: cannot create files there"),
    };
    anyhow::Error::new(e).context(what)
}

/// Listens and serves transfers, each on its own thread, at most
/// `max_clients` at once, until `--count` transfers were served or SIGINT
/// or SIGTERM. Each failed transfer is one `error: client ADDR: ...` line
/// on stderr; the result is an error if any failed.
pub fn serve(opts: &ServeOptions, common: &CommonArgs, out: Output) -> anyhow::Result<()> {
    // Clients are served whether or not anyone still reads stdout.
    let out = out.best_effort();
    let dir = check_dir(&opts.dir)?;
    remove_orphans(&dir, out)?;
    let addr = socket_addr(&opts.bind, opts.port).context("--bind")?;
    if let Some(device) = &common.device {
        device_exists(device)?;
    }
    // Checked here; a transfer pins its polling threads once its verifier
    // threads run (a pinned thread hands its one core down to every thread
    // it starts). The accept loop waits in bounded slices, unpinned.
    check_cores(&opts.cores)?;
    let cfg = with_transport(
        engine_config(common.timeout, opts.hugepages),
        opts.profile.as_ref(),
    );
    cfg.validate()?;
    // Every client gets its chunk ring registered: a locked-memory limit
    // that cannot take even one is a start-up error, not a refusal of
    // every client later.
    pinpoll::memory::check_memlock(cfg.registered_bytes())
        .context("registering the chunk ring of a client")?;
    let mut server = Accepting::listen(addr, opts.count, cfg.qp.clone(), out)?;
    let mut admission = Admission::new(opts, common.device.as_deref(), &cfg, dir, out);
    while server.open() && admission.device_lost().is_none() {
        admission.collect(&mut server);
        if let Some(req) = server.next_client()? {
            admission.admit(req, &mut server)?;
        }
    }
    admission.finish(&mut server)?;
    server.finish()
}

/// Removes the temporary files a server that died left in `dir`, and says
/// so.
fn remove_orphans(dir: &ServerDir, out: Output) -> anyhow::Result<()> {
    let orphans = match temp::remove_orphans(dir) {
        Ok(orphans) => orphans,
        Err(e) => {
            tracing::warn!(error = %e, "looking for temporary files left by a dead server");
            return Ok(());
        }
    };
    if !orphans.removed.is_empty() {
        out.progress(format_args!(
            "removed {} temporary file(s) left by a server that died: {}",
            orphans.removed.len(),
            orphans.removed.join(", ")
        ))?;
    }
    for (name, e) in &orphans.failed {
        tracing::warn!(name, error = %e, "removing a temporary file left by a dead server");
    }
    Ok(())
}

/// Hands a further stream of a transfer to that transfer, whose thread
/// completes its handshake; rejects, with the reason, a stream no
/// transfer waits for. Never waits: this runs on the accept loop. A stream
/// is part of an admitted transfer: it is neither counted nor refused as
/// busy.
pub(crate) fn join_stream(req: Request, joins: &Joins, token: u64, stream: u16) {
    if let Err(NotWaited(refused)) = joins.hand_over(token, stream, req) {
        let (req, why) = *refused;
        req.refuse(stream, &why);
    }
}

/// Why a native client could not be accepted. Whatever failed before
/// the accept itself made the engine refuse the client.
pub(crate) fn native_accept_error(err: pinpoll::Error) -> anyhow::Error {
    let step = match &err {
        pinpoll::Error::Cm { .. } | pinpoll::Error::CmEvent { .. } => {
            return anyhow::Error::new(err).context("accepting")
        }
        err if is_registration(err) => "registering the chunk ring",
        _ => "preparing the connection",
    };
    anyhow::Error::new(err).context(step).context("refused")
}

/// An accepted connection, by the protocol its client speaks.
pub(crate) enum Side {
    // Boxed: both are large (a connection holds its pre-built work
    // requests) and moved only once, into the transfer's thread.
    Native(Box<Connection>),
    Classic(Box<(ClassicSide, Endpoint)>),
}

/// One transfer's receive side.
pub(crate) struct Transfer {
    pub(crate) dir: ServerDir,
    pub(crate) overwrite: bool,
    pub(crate) cfg: EngineConfig,
    pub(crate) peer: String,
    pub(crate) serial: u64,
    pub(crate) verify_threads: usize,
    pub(crate) space: Space,
    pub(crate) min_rate: u64,
    pub(crate) deadline: Duration,
    pub(crate) in_flight: InFlight,
    pub(crate) joins: Joins,
    pub(crate) peer_ip: Option<std::net::IpAddr>,
    pub(crate) cores: Vec<usize>,
    pub(crate) out: Output,
}

/// What every stream's thread of one transfer shares.
#[derive(Clone, Copy)]
struct Receiving<'a> {
    core: &'a Mutex<ServerCore>,
    pool: &'a VerifierPool,
    /// Set by the stream that failed: the others stop.
    stop: &'a AtomicBool,
    shown: &'a str,
}

/// The transfer's protocol state, whichever stream's thread holds it.
fn lock(core: &Mutex<ServerCore>) -> MutexGuard<'_, ServerCore> {
    // Poisoned only by a stream's thread that panicked: that stream's
    // failure (its join is an error) fails the transfer whatever the
    // state says, so the state is read on only to wind the others down.
    core.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Feeds `event` to the transfer's protocol state and leaves in `out` the
/// actions to perform, but a `Fail`, which ends the transfer: it comes
/// back as the transfer's error, which [`Transfer::run`] tells the client.
/// Allocates nothing once `out` has room for an event's actions.
fn feed_into(core: &Mutex<ServerCore>, event: Event, out: &mut Vec<Action>) -> anyhow::Result<()> {
    lock(core).handle_into(event, out);
    match out.pop() {
        Some(Action::Fail(failure)) => Err(failure.into()),
        Some(last) => {
            out.push(last);
            Ok(())
        }
        None => Ok(()),
    }
}

/// [`feed_into`] a new vector: for the steps that come once a transfer.
fn feed(core: &Mutex<ServerCore>, event: Event) -> anyhow::Result<Vec<Action>> {
    let mut out = Vec::new();
    feed_into(core, event, &mut out)?;
    Ok(out)
}

/// The one action the protocol state answers at a step whose answer is
/// known (Start: admit; admitted: Ready; ...), picked by `pick`.
fn only<T>(actions: Vec<Action>, pick: impl Fn(Action) -> Option<T>) -> anyhow::Result<T> {
    let shown = format!("{actions:?}");
    let mut actions = actions.into_iter();
    match (actions.next().and_then(pick), actions.next()) {
        (Some(picked), None) => Ok(picked),
        _ => Err(out_of_turn(&shown)),
    }
}

/// The protocol state asked for what the server does not do at that step.
fn out_of_turn(actions: &str) -> anyhow::Error {
    anyhow::anyhow!("the transfer's protocol state asked for {actions} out of turn")
}

/// Tells the protocol state that `err` ended the transfer (a refusal the
/// client is told, or a connection that failed); returns `err`. A state
/// that already ended (its own `Fail`) stays as it is.
fn ended_by(core: &Mutex<ServerCore>, err: anyhow::Error) -> anyhow::Error {
    let event = match err.downcast_ref::<Refusal>() {
        Some(r) => Event::Failed(r.clone()),
        None => Event::Gone,
    };
    lock(core).handle(event);
    err
}

/// The event of what arrived on `stream`.
fn arrival_event(stream: u16, arrival: Arrival) -> Event {
    match arrival {
        Arrival::Chunk { slot, len } => Event::Chunk {
            stream,
            slot,
            len,
            now: Instant::now(),
        },
        Arrival::Message(msg) => Event::Message { stream, msg },
        Arrival::Undecodable(why) => Event::Undecodable { stream, why },
    }
}

/// The refusal a failed verifier pool means for the client.
fn pipeline_refusal(err: PipelineError, shown: &str) -> Refusal {
    match &err {
        PipelineError::Digest(DigestError::Mismatch { index }) => Refusal::new(
            FailCode::Integrity,
            format!(
                "chunk {index} (bytes {}..) does not match its BLAKE3 chaining value: the file was not kept",
                index * CHUNK
            ),
        ),
        PipelineError::Digest(e) => Refusal::new(FailCode::Integrity, format!("{shown}: {e}")),
        PipelineError::Write { .. } => Refusal::new(
            FailCode::Io,
            format!("writing {shown} on the server: {}", error_line(&err.into())),
        ),
        _ => Refusal::new(
            FailCode::Io,
            format!("verifying {shown} on the server: {}", error_line(&err.into())),
        ),
    }
}

impl Transfer {
    /// Runs the transfer on the accepted `side`, on this thread.
    pub(crate) fn serve(self, side: Side) -> anyhow::Result<()> {
        match side {
            Side::Native(conn) => self.run(*conn),
            Side::Classic(classic) => {
                pin(core_for(&self.cores, 0))?;
                let (classic, ep) = *classic;
                classic.serve(
                    ep,
                    &ClassicJob {
                        dir: &self.dir,
                        serial: self.serial,
                        timeout: self.cfg.completion_timeout,
                        peer: &self.peer,
                        out: self.out,
                        pace: Pace::new(self.min_rate, self.deadline),
                        space: &self.space,
                        in_flight: &self.in_flight,
                    },
                )
            }
        }
    }

    fn run(&self, mut conn: Connection) -> anyhow::Result<()> {
        // A transfer's further streams carry no verdict (the first one
        // does): they are closed once it is settled.
        let mut others = Vec::new();
        let result = self.receive(&mut conn, &mut others);
        if let Err(err) = &result {
            // Tell the client why, when the connection still works.
            if let Some(r) = err.downcast_ref::<Refusal>() {
                let msg = Msg::Fail {
                    code: r.code,
                    message: r.message.clone(),
                };
                let _ = send_and_wait(
                    &mut conn,
                    &msg.encode(),
                    self.cfg.completion_timeout,
                    "client",
                );
            }
        }
        // The outcome is settled (the file is in place, or the client was
        // told why not, each message awaited by send_and_wait): nothing
        // left to deliver, so abort — a graceful close would let a client
        // that stops taking messages hold this thread and its place a
        // completion timeout per stream. A teardown that does not drain
        // cleanly changes nothing: it is only logged, and briefly waited for.
        for mut conn in others.into_iter().chain([conn]) {
            conn.set_completion_timeout(self.cfg.completion_timeout.min(Duration::from_secs(2)));
            if let Err(e) = conn.abort() {
                tracing::debug!(error = %e, "closing the connection");
            }
        }
        result
    }

    fn receive(&self, conn: &mut Connection, others: &mut Vec<Connection>) -> anyhow::Result<()> {
        let cfg = server_core::Config {
            slots: SLOTS,
            slot_size: conn.slot_size() as u32,
            min_rate: self.min_rate,
            deadline: self.deadline,
        };
        let core = Mutex::new(match recording() {
            true => ServerCore::recording(cfg),
            false => ServerCore::new(cfg),
        });
        let result = self
            .receive_with(&core, conn, others)
            .map_err(|e| ended_by(&core, e));
        if let Some(script) = lock(&core).script() {
            pinpoll::wire::record("filexfer_server", script);
        }
        result
    }

    /// [`receive`](Self::receive), each step what `core` asks for.
    fn receive_with(
        &self,
        core: &Mutex<ServerCore>,
        conn: &mut Connection,
        others: &mut Vec<Connection>,
    ) -> anyhow::Result<()> {
        let arrival = first_arrival(conn)?;
        let (size, streams, name) = only(feed(core, arrival_event(0, arrival))?, |a| match a {
            Action::Admit {
                size,
                streams,
                name,
            } => Some((size, streams, name)),
            _ => None,
        })?;
        let shown = printable(name.as_bytes());
        let began = Instant::now();
        if let Err(too_large @ SpaceRefusal::TooLarge { .. }) = self.space.check_size(size, &shown)
        {
            return Err(space_refusal(too_large));
        }
        // Held until the file is in place or the transfer failed.
        let _reserved = self.in_flight.reserve(&name).ok_or_else(|| {
            refusal(
                FailCode::Exists,
                format!("{shown} already exists on the server (another client is sending it now)"),
            )
        })?;
        self.check_target(&name, &shown)?;
        let temp = TempFile::create(&self.dir, self.serial).map_err(|e| {
            refusal(
                FailCode::Io,
                format!("creating a temporary file in the server's directory: {e}"),
            )
        })?;
        self.space
            .reserve(&self.dir, temp.file(), size, &shown)
            .map_err(space_refusal)?;
        self.out.progress(format_args!(
            "client {}: receiving {shown} ({size} bytes)",
            self.peer
        ))?;
        let pool = self.verifier(&temp, size, streams, &shown)?;
        *others = self.open_streams(core, conn, streams)?;
        let digest = self.receive_chunks(core, conn, others, pool, &shown)?;
        let stored = match self.store(temp, size, &name, &shown) {
            Ok(()) => Ok(()),
            Err(e) => Err(e.downcast::<Refusal>()?),
        };
        let complete = only(feed(core, Event::Stored(stored))?, |a| match a {
            Action::Send { stream: 0, msg } => Some(msg),
            _ => None,
        })?;
        send_complete(conn, &complete, self.cfg.completion_timeout);
        self.out.progress(format_args!(
            "client {}: received {shown}: {}",
            self.peer,
            digest_summary(size, began.elapsed(), &digest)
        ))?;
        Ok(())
    }

    /// The verifier pool of one transfer: `--verify-threads` threads, and
    /// buffers for every stream's ring of chunks, so that a slot's credit
    /// goes back as soon as its chunk is copied even while every thread is
    /// busy.
    fn verifier(
        &self,
        temp: &TempFile,
        size: u64,
        streams: u16,
        shown: &str,
    ) -> anyhow::Result<VerifierPool> {
        let file = temp.file().try_clone().map_err(|e| {
            refusal(
                FailCode::Io,
                format!("opening {shown} for the verifier threads: {e}"),
            )
        })?;
        let threads = self.verify_threads.max(1);
        let size_of = PoolSize {
            threads,
            buffers: (2 * threads).max(SLOTS as usize * usize::from(streams)),
        };
        VerifierPool::new(Arc::new(file), ChunkGeometry::v3(size), size_of)
            .map_err(|e| pipeline_refusal(e, shown).into())
    }

    /// Answers `Ready` and, for a transfer of several streams, waits for
    /// streams `1..N` to join; returns their connections.
    fn open_streams(
        &self,
        core: &Mutex<ServerCore>,
        conn: &mut Connection,
        streams: u16,
    ) -> anyhow::Result<Vec<Connection>> {
        // The deadline of the joins counts from here: Ready may take a
        // while to be acknowledged, and a client gets no more time for it.
        let timeout = self.cfg.completion_timeout;
        let gathering = (streams > 1)
            .then(|| self.joins.open(self.peer_ip, streams, timeout))
            .transpose()
            .map_err(|e| refusal(FailCode::Io, format!("drawing a join token: {e}")))?;
        let token = gathering.as_ref().map_or(0, Gathering::token);
        let ready = only(feed(core, Event::Admitted { token })?, |a| match a {
            Action::Send { stream: 0, msg } => Some(msg),
            _ => None,
        })?;
        send_and_wait(conn, &ready.encode(), self.cfg.completion_timeout, "client")?;
        let joined = match gathering {
            Some(gathering) => gathering.gather(|req, by| {
                // The handshake ends by the joins' deadline: the builder's
                // connect timeout bounds the engine's wait for it.
                // Never zero, which no configuration allows: the check that
                // time was left came just before.
                let left = by
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                let mut cfg = self.cfg.clone();
                cfg.qp.connect_timeout = cfg.qp.connect_timeout.min(left);
                Connection::builder(&cfg)
                    .remote_access(Access::REMOTE_WRITE)
                    .accept(req)
                    .map_err(native_accept_error)
            })?,
            None => Vec::new(),
        };
        // The bounds on a slow client start once every stream is here.
        feed(
            core,
            Event::Joined {
                now: Instant::now(),
            },
        )?;
        Ok(joined)
    }

    /// Receives every chunk on every stream, each stream on its own thread
    /// (the first on this one), and the client's `Finish`; returns the
    /// file's BLAKE3 digest once every chunk is checked and written, the
    /// digest is the one the client declared and `core` asks for the
    /// store. A stream that fails stops the others and fails the transfer.
    fn receive_chunks(
        &self,
        core: &Mutex<ServerCore>,
        conn: &mut Connection,
        others: &mut [Connection],
        pool: VerifierPool,
        shown: &str,
    ) -> anyhow::Result<blake3::Hash> {
        let stop = AtomicBool::new(false);
        let failing = |r: anyhow::Result<bool>| {
            if r.is_err() {
                stop.store(true, Ordering::Release);
            }
            r
        };
        let shared = Receiving {
            core,
            pool: &pool,
            stop: &stop,
            shown,
        };
        let shared = &shared;
        let collect = std::thread::scope(|scope| {
            let threads: Vec<_> = others
                .iter_mut()
                .zip(1..)
                .map(|(other, index)| {
                    let core = core_for(&self.cores, u64::from(index));
                    scope.spawn(move || {
                        failing(pin(core).and_then(|()| self.receive_lane(other, index, shared)))
                    })
                })
                .collect();
            // Pinned only now: the verifier threads, started by this
            // thread, may run on every core.
            let first = failing(
                pin(core_for(&self.cores, 0)).and_then(|()| self.receive_lane(conn, 0, shared)),
            );
            let rest = threads.into_iter().map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a stream's thread panicked")))
            });
            settle_lanes(first, rest)
        })?;
        if !collect {
            return Err(out_of_turn("no digest after every stream ended"));
        }
        let digest = pool.finish().map_err(|e| pipeline_refusal(e, shown));
        let declared = digest.as_ref().map(|d| *d.as_bytes()).map_err(Clone::clone);
        only(feed(core, Event::Digest(declared))?, |a| {
            matches!(a, Action::Store).then_some(())
        })?;
        Ok(digest?)
    }

    /// Receives the chunks of stream `stream` on `conn` until `core` has
    /// nothing more to read there: each is copied once out of the slot the
    /// client may write again at any time, its credit is returned as soon
    /// as the copy is handed to the verifiers (no write waits for it), and
    /// a verifier thread checks that private copy against the chunk's
    /// value and writes it, so what is checked is what is stored. Returns
    /// whether `core` asked, on this stream, for the verifier's digest.
    fn receive_lane(
        &self,
        conn: &mut Connection,
        stream: u16,
        shared: &Receiving<'_>,
    ) -> anyhow::Result<bool> {
        let Receiving {
            core,
            pool,
            stop,
            shown,
        } = *shared;
        let failed = |e| anyhow::Error::from(pipeline_refusal(e, shown));
        let geometry = *pool.geometry();
        let count = lock(core).stream_count();
        let rewritten = await_rewrite_chunk();
        let mut collect = false;
        // Kept across chunks: an event asks for two actions at most.
        let (mut arrived, mut handed) = (Vec::with_capacity(2), Vec::with_capacity(2));
        // Where the transfer stood, for the server's own error line (the
        // client's Fail keeps the refusal's text alone).
        let receiving = || {
            let received = lock(core).received_on(stream);
            match count {
                1 => format!("receiving {shown} ({received} bytes so far)"),
                _ => format!("receiving {shown} (stream {stream}: {received} bytes so far)"),
            }
        };
        while !lock(core).stream_done(stream) {
            let arrival =
                next_arrival(conn, stop, self.cfg.completion_timeout).with_context(receiving)?;
            feed_into(core, arrival_event(stream, arrival), &mut arrived)
                .with_context(receiving)?;
            for action in arrived.drain(..) {
                let (slot, index, range) = match action {
                    Action::Verify {
                        slot, index, range, ..
                    } => (slot, index, range),
                    Action::CollectDigest => {
                        collect = true;
                        continue;
                    }
                    other => return Err(out_of_turn(&format!("{other:?}"))),
                };
                if rewritten == Some(index) {
                    await_rewrite(conn, range.clone(), geometry, index);
                }
                let copy = pool.buffer(self.cfg.completion_timeout).map_err(failed)?;
                let (mut copy, mut cv) = (copy, [0u8; TRAILER]);
                let data_len = range.len() - TRAILER;
                let target = conn.target();
                target.copy_to(range.start, copy.bytes_mut(data_len).map_err(failed)?)?;
                target.copy_to(range.start + data_len, &mut cv)?;
                pool.submit(index, cv, copy).map_err(failed)?;
                feed_into(core, Event::HandedOff { stream, slot }, &mut handed)?;
                for action in handed.drain(..) {
                    match action {
                        Action::Credit { .. } => {
                            conn.send(&protocol::credit(1))
                                .map_err(|e| explain_link(e, "client"))
                                .context("returning a credit")?;
                        }
                        Action::CollectDigest => collect = true,
                        other => return Err(out_of_turn(&format!("{other:?}"))),
                    }
                }
            }
        }
        Ok(collect)
    }
    /// Makes the verified temp file durable and puts it in place as `name`
    /// in the server's directory: checks its size, fsyncs it, links it to
    /// its final name, fsyncs the directory.
    fn store(&self, mut temp: TempFile, size: u64, name: &str, shown: &str) -> anyhow::Result<()> {
        let io = |what: &str, e: std::io::Error| refusal(FailCode::Io, format!("{what}: {e}"));
        let stored = temp
            .file()
            .metadata()
            .map_err(|e| io(&format!("reading the size of {shown} on the server"), e))?
            .len();
        if stored != size {
            return Err(refusal(
                FailCode::Integrity,
                format!("{shown} is {stored} bytes on the server, not {size}"),
            ));
        }
        temp.file()
            .sync_all()
            .map_err(|e| io(&format!("fsync of {shown} failed on the server"), e))?;
        self.put_in_place(&mut temp, name, shown)?;
        // Without --overwrite the data now live under the final name too:
        // dropping the temp file removes only its temp name.
        drop(temp);
        pause_before_dir_fsync();
        temp::sync_dir_after_link(&self.dir, shown).map_err(|why| refusal(FailCode::Io, why))
    }

    /// Refuses a target `name` that exists (any existing name with
    /// --overwrite only if it is a regular file, never a symlink).
    fn check_target(&self, name: &str, shown: &str) -> anyhow::Result<()> {
        use rustix::fs::FileType;
        match self.dir.entry(name) {
            Ok(None) => Ok(()),
            Err(e) => Err(refusal(FailCode::Io, format!("checking {shown} on the server: {e}"))),
            Ok(Some(FileType::Symlink)) => Err(refusal(
                FailCode::Exists,
                format!("{shown} exists on the server as a symbolic link; refusing to replace it"),
            )),
            Ok(Some(FileType::RegularFile)) if self.overwrite => Ok(()),
            Ok(_) if self.overwrite => Err(refusal(
                FailCode::Exists,
                format!("{shown} exists on the server and is not a regular file"),
            )),
            Ok(_) => Err(refusal(
                FailCode::Exists,
                format!("{shown} already exists on the server (the server may allow replacing it with --overwrite)"),
            )),
        }
    }

    /// Links the verified temp file to its final name: without
    /// --overwrite a hard link of the file the server wrote (by its
    /// descriptor), which fails if the name exists (even if it appeared
    /// during the transfer); with it, an exchange with a regular file of a
    /// temp name checked to still be that file, undone if the target then
    /// is not ([`TempFile::rename_as`]).
    fn put_in_place(&self, temp: &mut TempFile, target: &str, shown: &str) -> anyhow::Result<()> {
        if self.overwrite {
            self.check_target(target, shown)?;
            return temp.rename_as(target).map_err(|e| {
                refusal(
                    FailCode::Io,
                    format!("renaming into {shown} on the server: {e}"),
                )
            });
        }
        match temp.link_as(target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(refusal(
                FailCode::Exists,
                format!(
                    "{shown} already exists on the server (it appeared during the transfer); the upload was not kept"
                ),
            )),
            Err(e) => Err(refusal(
                FailCode::Io,
                format!("linking {shown} into place on the server: {e}"),
            )),
        }
    }
}

/// The first thing a transfer's client sent on its first stream (its
/// `Start`, if it follows the protocol).
fn first_arrival(conn: &mut Connection) -> anyhow::Result<Arrival> {
    let m = conn
        .recv()
        .map_err(|e| explain_link(e, "client"))
        .context("waiting for the client's Start")?;
    Ok(match m.imm {
        Some(slot) => Arrival::Chunk { slot, len: m.len },
        None => Msg::decode(m.data)
            .map_or_else(|e| Arrival::Undecodable(e.to_string()), Arrival::Message),
    })
}

/// Sends `complete` once the file is verified, durable and in place: the
/// transfer has succeeded here. The client disconnects as soon as it has
/// read Complete, which can overtake the acknowledgement of Complete (a
/// lost ACK, a retransmission): the send then ends in the client's
/// departure. Only a client that never got Complete would know it
/// failed, and it says so itself.
fn send_complete(conn: &mut Connection, complete: &Msg, timeout: Duration) {
    match send_and_wait(conn, &complete.encode(), timeout, "client") {
        // Wait (bounded) for the client's disconnect rather than race it
        // with one of our own.
        Ok(()) => match conn.recv() {
            Ok(m) => tracing::debug!(len = m.len, "a message after Complete"),
            Err(e) => tracing::debug!(error = %e, "the client left"),
        },
        Err(e) => tracing::debug!(error = %e, "Complete not acknowledged; the client left"),
    }
}

/// The outcome of a transfer's streams: whether one of them was asked for
/// the verifier's digest — or the error of the stream that failed first
/// (not that of one it stopped).
fn settle_lanes(
    first: anyhow::Result<bool>,
    rest: impl Iterator<Item = anyhow::Result<bool>>,
) -> anyhow::Result<bool> {
    let (mut collect, mut errors) = (false, Vec::new());
    for outcome in std::iter::once(first).chain(rest) {
        match outcome {
            Ok(asked) => collect |= asked,
            Err(e) => errors.push(e),
        }
    }
    match first_failure(errors) {
        Some(e) => Err(e),
        None => Ok(collect),
    }
}

/// Whether a transfer's events are recorded as a seed of the
/// `filexfer_server` fuzz target: in debug builds, where
/// `pinpoll::wire::record` saves what it is given
/// (`scripts/record-corpus.sh`).
fn recording() -> bool {
    cfg!(debug_assertions) && std::env::var_os("PINPOLL_RECORD_WIRE").is_some()
}

/// Test hook, debug builds only: `PINPOLL_FX_AWAIT_REWRITE=N` makes the
/// server, before it copies chunk `N` out of its slot, wait (up to 10 s)
/// until the slot no longer matches the chunk's value: the client has
/// written it again — as a client with the
/// matching hook ([`crate::filexfer::client::REWRITE_ENV`]) does right
/// after the chunk. The copy then sees the rewritten bytes, so a test can
/// check that they are refused, never stored. Release builds never wait.
pub const AWAIT_REWRITE_ENV: &str = "PINPOLL_FX_AWAIT_REWRITE";

/// The chunk whose rewrite [`AWAIT_REWRITE_ENV`] waits for, if any.
fn await_rewrite_chunk() -> Option<u64> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let value = std::env::var(AWAIT_REWRITE_ENV).ok()?;
    let parsed = value.parse().ok();
    if parsed.is_none() {
        eprintln!("{AWAIT_REWRITE_ENV}={value:?} ignored: expected a chunk index");
    }
    parsed
}

/// Waits until chunk `index`, whose data and value `slot` holds in the
/// target ring, no longer matches its value: the client wrote the slot
/// again (see [`AWAIT_REWRITE_ENV`]).
fn await_rewrite(
    conn: &Connection,
    slot: std::ops::Range<usize>,
    geometry: ChunkGeometry,
    index: u64,
) {
    let data_len = slot.len() - TRAILER;
    let (mut data, mut cv) = (vec![0u8; data_len], [0u8; TRAILER]);
    let target = conn.target();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let copied = target
            .copy_to(slot.start, &mut data)
            .and_then(|()| target.copy_to(slot.start + data_len, &mut cv));
        if copied.is_ok() && geometry.chunk_cv(index, &data) != Ok(cv) {
            eprintln!("{AWAIT_REWRITE_ENV}: the client rewrote the slot after its chunk");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("{AWAIT_REWRITE_ENV}: the slot was not rewritten within 10 s");
}

/// Test hook, debug builds only: `PINPOLL_FX_PAUSE_BEFORE_DIR_FSYNC=SECS`
/// makes the server say so on stderr and sleep SECS seconds after the
/// file's data were fsynced and it was linked into place, before the
/// directory is fsynced, so scripts/power-loss.sh can cut a guest's power
/// at exactly that point. Release builds never pause.
fn pause_before_dir_fsync() {
    const PAUSE_ENV: &str = "PINPOLL_FX_PAUSE_BEFORE_DIR_FSYNC";
    if !cfg!(debug_assertions) {
        return;
    }
    let Ok(value) = std::env::var(PAUSE_ENV) else {
        return;
    };
    match value.parse::<u64>() {
        Ok(secs) => {
            eprintln!("{PAUSE_ENV}: pausing {secs} s before the directory fsync");
            std::thread::sleep(Duration::from_secs(secs));
        }
        Err(_) => eprintln!("{PAUSE_ENV}={value:?} ignored: expected whole seconds"),
    }
}

/// The refusal the client is told when its file cannot have its space.
fn space_refusal(refused: SpaceRefusal) -> anyhow::Error {
    let code = match refused {
        SpaceRefusal::TooLarge { .. } => FailCode::TooLarge,
        _ => FailCode::Io,
    };
    refusal(code, refused.to_string())
}

/// SENDs `bytes`, signaled, and waits for its completion: the peer has it
/// before this side goes on (or disconnects).
/// `peer` names the other side in errors ("server" or "client").
pub fn send_and_wait(
    conn: &mut Connection,
    bytes: &[u8],
    timeout: Duration,
    peer: &str,
) -> anyhow::Result<()> {
    let link = |e| explain_link(e, peer);
    settle(conn, timeout, peer)?;
    let seq = {
        let mut b = conn.batch();
        b.signal_next();
        let seq = b.send(bytes).map_err(link)?;
        b.post().map_err(link)?;
        seq
    };
    conn.wait_retired(seq)
        .map_err(link)
        .context("sending a control message")
}

/// Reaps send completions until fewer than a batch of requests are
/// outstanding (at most the unsignaled tail, which needs no completion),
/// so one more request always has room in the send queue and ring.
pub fn settle(conn: &mut Connection, timeout: Duration, peer: &str) -> anyhow::Result<()> {
    let limit = u64::from(crate::filexfer::BATCH);
    let began = Instant::now();
    let deadline = began + timeout;
    let mut spins = 0u32;
    while conn.outstanding() >= limit {
        if conn.reap().map_err(|e| explain_link(e, peer))? == 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                let now = Instant::now();
                if now >= deadline {
                    bail!("timed out waiting for send completions (--timeout); is the {peer} stuck or gone?");
                }
                conn.peer_gone().map_err(|e| explain_link(e, peer))?;
                // As the engine's own waits do: after a millisecond, let
                // the kernel's network work (rxe) and other threads run;
                // after 10 ms, nap.
                let waited = now - began;
                if waited >= Duration::from_millis(10) {
                    std::thread::sleep(Duration::from_micros(50));
                } else if waited >= Duration::from_millis(1) {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use pinpoll_testkit::Scratch;

    use super::*;
    use crate::filexfer::name::RESERVED_PREFIX;

    /// A server of this very PID that was killed during its start-up
    /// check left its probe behind: the next start must not trip on it.
    #[test]
    fn a_probe_left_by_a_killed_server_of_the_same_pid_does_not_stop_a_start() {
        let scratch = Scratch::new("probe");
        let dir = scratch.path().to_owned();
        let left = dir.join(format!("{RESERVED_PREFIX}probe-{}", std::process::id()));
        std::fs::write(&left, b"").unwrap();
        let checked = check_dir(&dir);
        assert!(checked.is_ok(), "{:#}", checked.unwrap_err());
        // The check leaves nothing of its own behind.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [left.file_name().unwrap()]);
    }

    /// A `--dir` the server cannot read, and a check file taken by a
    /// server starting beside this one, each say what the server needs or
    /// what to do. (The failures themselves cannot be made here: the
    /// tests run as root, which every permission lets through, and the
    /// second case is a race between two processes' system calls.)
    #[test]
    fn start_up_errors_say_what_the_server_needs() {
        let denied = dir_error(std::io::ErrorKind::PermissionDenied.into(), "/srv/in");
        assert!(
            format!("{denied:#}").starts_with(
                "--dir /srv/in (the server needs search permission on --dir and every directory above it): "
            ),
            "{denied:#}"
        );
        let taken = probe_error(std::io::ErrorKind::WouldBlock.into(), "/srv/in");
        assert!(
            taken
                .to_string()
                .ends_with("took this one's check file for a dead server's; start again"),
            "{taken:#}"
        );
        let other = probe_error(std::io::ErrorKind::StorageFull.into(), "/srv/in");
        assert_eq!(
            other.to_string(),
            "--dir /srv/in: cannot create files there"
        );
    }

    /// A transfer's receive side serving `dir`, for what runs without a
    /// connection (the store).
    fn transfer(dir: ServerDir, overwrite: bool) -> Transfer {
        Transfer {
            dir,
            overwrite,
            cfg: EngineConfig::default(),
            peer: "test".into(),
            serial: 0,
            verify_threads: 1,
            space: Space::new(u64::MAX, Some(0)),
            min_rate: 0,
            deadline: Duration::ZERO,
            in_flight: InFlight::default(),
            joins: Joins::default(),
            peer_ip: None,
            cores: Vec::new(),
            out: Output::new(true),
        }
    }

    fn contents(path: &Path) -> Option<Vec<u8>> {
        std::fs::read(path).ok()
    }

    /// Whatever is done to the temp file's name meanwhile — the file moved
    /// aside and another planted under its name, or removed and replaced —
    /// the store puts in place the bytes the server wrote, or fails and
    /// leaves the target as it was: never the planted file.
    #[test]
    fn the_store_places_the_file_written_never_one_planted_under_its_temp_name() {
        const WRITTEN: &[u8] = b"the transferred bytes";
        const PLANTED: &[u8] = b"a planted file!!!!!!!";
        for overwrite in [false, true] {
            for moved_aside in [true, false] {
                let case = format!("overwrite {overwrite}, moved aside {moved_aside}");
                let scratch = Scratch::new("plant");
                let dir = check_dir(scratch.path()).unwrap();
                let t = transfer(dir.clone(), overwrite);
                let mut temp = TempFile::create(&dir, 0).unwrap();
                std::io::Write::write_all(temp.file_mut(), WRITTEN).unwrap();
                let temp_path = temp.path();
                if moved_aside {
                    std::fs::rename(&temp_path, dir.path().join("aside")).unwrap();
                } else {
                    std::fs::remove_file(&temp_path).unwrap();
                }
                std::fs::write(&temp_path, PLANTED).unwrap();
                let target = dir.path().join("f.bin");
                let before = overwrite.then(|| {
                    std::fs::write(&target, b"old").unwrap();
                    b"old".to_vec()
                });
                let stored = t.store(temp, WRITTEN.len() as u64, "f.bin", "f.bin");
                let now = contents(&target);
                assert_ne!(
                    now.as_deref(),
                    Some(PLANTED),
                    "{case}: the planted file is in place"
                );
                match stored {
                    Ok(()) => assert_eq!(now.as_deref(), Some(WRITTEN), "{case}"),
                    Err(e) => {
                        assert_eq!(now, before, "{case}: failed ({e:#}) but changed the target")
                    }
                }
            }
        }
    }

    /// The temp name removed during the transfer (by a server starting in
    /// the same directory where `O_TMPFILE` is missing, or by hand), with
    /// or without /proc: nothing is stored, and the client is told what
    /// happened and what to do — not a bare "No such file or directory".
    #[test]
    fn a_temp_file_removed_during_the_transfer_is_said_so() {
        const WRITTEN: &[u8] = b"the transferred bytes";
        for no_proc in [false, true] {
            let scratch = Scratch::new("removed");
            let mut dir = check_dir(scratch.path()).unwrap();
            if no_proc {
                dir = dir.with_proc(&scratch.path().join("no-proc-here"));
            }
            let t = transfer(dir.clone(), false);
            let mut temp = TempFile::create(&dir, 0).unwrap();
            std::io::Write::write_all(temp.file_mut(), WRITTEN).unwrap();
            std::fs::remove_file(temp.path()).unwrap();
            let err = t
                .store(temp, WRITTEN.len() as u64, "f.bin", "f.bin")
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                "linking f.bin into place on the server: its temporary file was removed from the server's directory during the transfer (by another server starting there, or by hand); nothing was kept: send it again",
                "without /proc: {no_proc}"
            );
            assert!(!dir.path().join("f.bin").exists());
        }
    }

    /// `--dir` replaced by a symbolic link to another directory after the
    /// server started: the server goes on writing into the directory it
    /// started with, never through the link.
    #[test]
    fn a_dir_swapped_for_a_symlink_after_start_gets_nothing_written_through_it() {
        const WRITTEN: &[u8] = b"the transferred bytes";
        let scratch = Scratch::new("dirswap");
        let (served, moved, elsewhere) = (
            scratch.path().join("served"),
            scratch.path().join("moved"),
            scratch.path().join("elsewhere"),
        );
        for d in [&served, &elsewhere] {
            std::fs::create_dir(d).unwrap();
        }
        let t = transfer(check_dir(&served).unwrap(), false);
        std::fs::rename(&served, &moved).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &served).unwrap();

        let mut temp = TempFile::create(&t.dir, 0).unwrap();
        std::io::Write::write_all(temp.file_mut(), WRITTEN).unwrap();
        t.store(temp, WRITTEN.len() as u64, "f.bin", "f.bin")
            .unwrap();
        let there: Vec<_> = std::fs::read_dir(&elsewhere)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(there.is_empty(), "written through the link: {there:?}");
        assert_eq!(contents(&moved.join("f.bin")).as_deref(), Some(WRITTEN));
    }
}
