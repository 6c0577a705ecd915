//! `filexfer send`: one file to a server, every server slot kept busy.
//!
//! Test-only fault hooks, read once when the transfer starts, in debug
//! builds only (release builds never read them), for
//! `apps/tests/filexfer.rs`; do not set them:
//! - `PINPOLL_FILEXFER_TEST_FLIP_BIT=N` flips one bit of chunk `N` after
//!   its chaining value was computed — a chunk corrupted on the way, which
//!   the server must catch.
//! - `PINPOLL_FILEXFER_TEST_REWRITE=N` writes chunk `N`'s slot again,
//!   with one bit flipped, right after the chunk and its value — a client
//!   that changes a slot after the server was told it is complete, whose
//!   rewritten bytes the server must refuse or never see, never store.

use std::fs::File;
use std::io::IsTerminal as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pinpoll::{Access, Connection, Event};

use crate::cli::{socket_addr, CommonArgs};
use crate::filexfer::chunk_pool::PoolSize;
use crate::filexfer::digest::ChunkGeometry;
use crate::filexfer::name;
use crate::filexfer::protocol::{Msg, HELLO};
use crate::filexfer::read_ahead::HashingReader;
use crate::filexfer::server::{send_and_wait, settle};
use crate::filexfer::{
    digest_summary, engine_config, explain_link, is_registration, pin, with_transport, BATCH,
    CHUNK, TRAILER,
};
use crate::output::{printable, Output};
use crate::session::device_exists;

/// What `send` needs from the command line.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub host: String,
    pub file: std::path::PathBuf,
    pub port: u16,
    pub hugepages: bool,
    pub core: Option<usize>,
    /// Speak the classic rdma-file-transfer protocol.
    pub classic: bool,
    /// Connect first, then wait up to this long for the file to appear.
    pub wait_for_file: Option<Duration>,
    /// Threads reading and hashing the file ahead of the sender.
    pub verify_threads: usize,
    /// Transport settings from a tuning profile (`--profile`).
    pub profile: Option<pinpoll::EngineConfig>,
}

/// The file's name as sent: its last path component, under the rules of
/// [`name::validate`].
pub fn wire_name(path: &Path) -> anyhow::Result<String> {
    let Some(last) = path.file_name() else {
        bail!("{}: no file name to send", path.display());
    };
    let bytes = last.as_encoded_bytes();
    let name = name::validate(bytes).with_context(|| format!("{}", path.display()))?;
    Ok(name.to_owned())
}

/// The test-only hook that flips a bit of a chunk (see the module docs).
pub const FLIP_BIT_ENV: &str = "PINPOLL_FILEXFER_TEST_FLIP_BIT";
/// The test-only hook that rewrites a slot after its chunk (see the
/// module docs).
pub const REWRITE_ENV: &str = "PINPOLL_FILEXFER_TEST_REWRITE";

/// The test-only fault hooks set for this transfer (none in release builds).
#[derive(Debug, Default)]
struct Faults {
    flip: Option<u64>,
    rewrite: Option<u64>,
}

impl Faults {
    fn from_env() -> anyhow::Result<Self> {
        if !cfg!(debug_assertions) {
            return Ok(Self::default());
        }
        let chunk = |env: &str| match std::env::var(env) {
            Err(_) => Ok(None),
            Ok(v) => v
                .parse()
                .map(Some)
                .with_context(|| format!("{env}={v:?}: expected a chunk index")),
        };
        Ok(Self {
            flip: chunk(FLIP_BIT_ENV)?,
            rewrite: chunk(REWRITE_ENV)?,
        })
    }
}

/// Sends `opts.file`; success only once the server said the file is
/// verified, durable and in place.
pub fn send(opts: &SendOptions, common: &CommonArgs, out: Output) -> anyhow::Result<()> {
    let path = &opts.file;
    let name = wire_name(path)?;
    let shown = printable(name.as_bytes());
    // With --wait-for-file the file is opened once it appears, after
    // connecting; otherwise a missing or unreadable file fails here, before
    // any connection exists.
    let mut source = match opts.wait_for_file {
        Some(_) => None,
        None => Some(open_source(path)?),
    };
    pin(opts.core)?;

    let cfg = with_transport(
        engine_config(common.timeout, opts.hugepages),
        opts.profile.as_ref(),
    );
    cfg.validate()?;
    let addr = socket_addr(&opts.host, opts.port)?;
    if let Some(device) = &common.device {
        device_exists(device)?;
    }
    if opts.classic {
        ensure!(
            source.is_some(),
            "--wait-for-file cannot be used with --classic"
        );
        return crate::filexfer::classic::send(
            path,
            &name,
            addr,
            &cfg,
            common.device.as_deref(),
            out,
        );
    }
    // This side exposes nothing: its target ring gets no remote access.
    let mut conn = Connection::builder(&cfg)
        .remote_access(Access::LOCAL_READ)
        .private_data(&HELLO)
        .device(common.device.as_deref())
        .connect(addr)
        .map_err(|e| connect_error(e, addr))?;
    let peer = conn.peer_ring();
    out.progress(format_args!(
        "connected to {addr} on {}",
        conn.endpoint().device_name()
    ))?;
    let link = |e| explain_link(e, "server");
    let timeout = common.timeout;

    if let Some(limit) = opts.wait_for_file {
        out.progress(format_args!(
            "waiting up to {} s for {} to appear",
            limit.as_secs_f64(),
            path.display()
        ))?;
        wait_for_file(&mut conn, path, limit)?;
        source = Some(open_source(path)?);
    }
    let (file, size) = source.expect("the file is open by now");

    let began = Instant::now();
    send_and_wait(
        &mut conn,
        &Msg::Start {
            size,
            name: name.as_bytes().to_vec(),
        }
        .encode(),
        timeout,
        "server",
    )
    .context("sending the file's name and size")?;
    let ready = {
        let m = conn
            .recv()
            .map_err(link)
            .context("waiting for the server to be ready")?;
        ensure!(m.imm.is_none(), "the server wrote into this side's memory");
        Msg::decode(m.data)?
    };
    let (slots, slot_size) = match ready {
        Msg::Ready { slots, slot_size } => (slots, slot_size),
        Msg::Fail { message, .. } => bail!("the server refused {shown}: {message}"),
        other => bail!("the server sent {} instead of Ready", other.name()),
    };
    ensure!(
        (1..=1 << 16).contains(&slots)
            && slot_size as usize >= CHUNK as usize + TRAILER
            && slot_size as usize <= conn.slot_size()
            && u64::from(slots) * u64::from(slot_size) <= peer.len,
        "the server offered {slots} slots of {slot_size} bytes, which a chunk of {CHUNK} bytes and its value, its ring of {} bytes or this side's {}-byte slots cannot hold",
        peer.len,
        conn.slot_size()
    );
    let bar = progress_bar(size, common.quiet, &shown);
    let threads = opts.verify_threads.max(1);
    let pool = PoolSize {
        threads,
        buffers: 2 * threads + BATCH as usize,
    };
    let mut reader = HashingReader::new(Arc::new(file), ChunkGeometry::v3(size), pool)
        .map_err(|e| anyhow::Error::new(e).context(format!("reading {}", path.display())))?;
    let ring = Ring { slots, slot_size };
    let sent = send_chunks(&mut conn, &mut reader, ring, timeout, &shown, bar.as_ref());
    if let Err(e) = sent {
        return Err(server_verdict(&mut conn, &shown).unwrap_or(e));
    }
    let digest = reader
        .finish()
        .map_err(|e| anyhow::Error::new(e).context(format!("reading {}", path.display())))?;
    if let Err(e) = send_and_wait(
        &mut conn,
        &Msg::Finish {
            size,
            digest: *digest.as_bytes(),
        }
        .encode(),
        timeout,
        "server",
    ) {
        return Err(server_verdict(&mut conn, &shown)
            .unwrap_or_else(|| e.context("sending the file's BLAKE3 digest")));
    }
    loop {
        let msg = {
            let m = conn
                .recv()
                .map_err(link)
                .context("waiting for the server to store the file")?;
            ensure!(m.imm.is_none(), "the server wrote into this side's memory");
            Msg::decode(m.data)?
        };
        match msg {
            Msg::Credit { .. } => continue,
            Msg::Complete { size: stored } => {
                ensure!(stored == size, "the server stored {stored} bytes of {size}");
                break;
            }
            Msg::Fail { message, .. } => {
                bail!("the server failed the transfer of {shown}: {message}")
            }
            other => bail!("the server sent {} instead of Complete", other.name()),
        }
    }
    let elapsed = began.elapsed();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // The file is verified and durable on the server: a teardown that
    // does not drain cleanly no longer changes the outcome.
    conn.set_completion_timeout(timeout.min(std::time::Duration::from_secs(2)));
    if let Err(e) = conn.close() {
        tracing::debug!(error = %e, "closing the connection after Complete");
    }
    out.progress(format_args!(
        "sent {shown}: {}",
        digest_summary(size, elapsed, &digest)
    ))?;
    Ok(())
}

/// The server's ring as its `Ready` offered it.
#[derive(Debug, Clone, Copy)]
struct Ring {
    slots: u32,
    slot_size: u32,
}

/// Sends every chunk `reader` hands out, each into its slot with its
/// chaining value after it, keeping every slot the server has credited
/// busy.
fn send_chunks(
    conn: &mut Connection,
    reader: &mut HashingReader,
    ring: Ring,
    timeout: Duration,
    shown: &str,
    bar: Option<&ProgressBar>,
) -> anyhow::Result<()> {
    let link = |e| explain_link(e, "server");
    let faults = Faults::from_env()?;
    let (size, chunks) = (
        reader.geometry().file_len(),
        reader.geometry().chunk_count(),
    );
    let (mut next, mut credits) = (0u64, u64::from(ring.slots));
    while next < chunks {
        if credits == 0 {
            credits = await_credit(conn, ring.slots, shown).with_context(|| {
                format!(
                    "sending {shown} ({} of {size} bytes posted)",
                    (next * CHUNK).min(size)
                )
            })?;
            continue;
        }
        settle(conn, timeout, "server")?;
        // A rewrite takes a request of its own in the batch.
        let room = u64::from(BATCH) - u64::from(faults.rewrite.is_some());
        let n = credits.min(room).min(chunks - next);
        let mut b = conn.batch();
        for _ in 0..n {
            let chunk = reader
                .next_chunk()?
                .context("the file ended before its last chunk")?;
            let slot = (next % u64::from(ring.slots)) as u32;
            let remote = u64::from(slot) * u64::from(ring.slot_size);
            let (bytes, cv) = (chunk.bytes(), chunk.cv());
            let flip = faults.flip == Some(next);
            b.write_from(bytes.len() + TRAILER, remote, Some(slot), |buf| {
                let (data, trailer) = buf.split_at_mut(bytes.len());
                data.copy_from_slice(bytes);
                trailer.copy_from_slice(cv);
                if flip {
                    data[bytes.len() / 2] ^= 0x10;
                }
                Ok(())
            })
            .map_err(link)?;
            if faults.rewrite == Some(next) {
                b.write_from(bytes.len(), remote, None, |data| {
                    data.copy_from_slice(bytes);
                    data[bytes.len() / 2] ^= 0x10;
                    Ok(())
                })
                .map_err(link)?;
            }
            next += 1;
        }
        b.post().map_err(link).context("posting chunks")?;
        credits -= n;
        if let Some(bar) = bar {
            bar.set_position((next * CHUNK).min(size));
        }
    }
    Ok(())
}

/// Waits for the server's next `Credit` and returns its count (at most
/// the ring's `slots`: no chunk is in flight while this side waits).
fn await_credit(conn: &mut Connection, slots: u32, shown: &str) -> anyhow::Result<u64> {
    let msg = {
        let m = conn.recv().map_err(|e| explain_link(e, "server"))?;
        ensure!(m.imm.is_none(), "the server wrote into this side's memory");
        Msg::decode(m.data)?
    };
    match msg {
        Msg::Credit { count } => {
            ensure!(
                count <= slots,
                "the server returned more credits than it has slots"
            );
            Ok(u64::from(count))
        }
        Msg::Fail { message, .. } => {
            bail!("the server failed the transfer of {shown}: {message}")
        }
        other => bail!("the server sent {} during the transfer", other.name()),
    }
}

/// Names the step of connecting that failed: resolving the address (a
/// loopback one cannot work), registering the rings, or the server's
/// answer.
fn connect_error(err: pinpoll::Error, addr: std::net::SocketAddr) -> anyhow::Error {
    if is_registration(&err) {
        return anyhow::Error::new(err).context("registering the send ring");
    }
    let err = match err {
        pinpoll::Error::Cm { .. } | pinpoll::Error::CmEvent { .. } if addr.ip().is_loopback() => {
            anyhow::Error::new(err).context(
                "a loopback address is not reachable through an RDMA device; use the address of the RDMA netdev",
            )
        }
        pinpoll::Error::BadRecord(_) => {
            anyhow::Error::new(err).context("the server's accept data (is it a filexfer server?)")
        }
        pinpoll::Error::WrongDevice { .. } => anyhow::Error::new(err).context("--device"),
        err => err.into(),
    };
    err.context(format!("connecting to {addr}"))
}

/// Opens the file to send: a regular file, and its size.
fn open_source(path: &Path) -> anyhow::Result<(File, u64)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    ensure!(meta.is_file(), "{}: not a regular file", path.display());
    Ok((file, meta.len()))
}

/// Holds the connection idle until `path` exists, at most `limit`. The
/// connection is watched meanwhile: heartbeats (the engine profile's
/// interval and misses) expose a server that died or became unreachable,
/// and rdma_cm or the device reports a server that left or a port that
/// failed; each ends the wait with that error.
fn wait_for_file(conn: &mut Connection, path: &Path, limit: Duration) -> anyhow::Result<()> {
    const NAP: Duration = Duration::from_millis(20);
    let link = |e| explain_link(e, "server");
    let what = || format!("waiting for {} to appear", path.display());
    let deadline = Instant::now() + limit;
    loop {
        match std::fs::metadata(path) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(what),
        }
        if Instant::now() >= deadline {
            bail!(
                "{} did not appear within --wait-for-file {} s; nothing was sent",
                path.display(),
                limit.as_secs_f64()
            );
        }
        conn.reap().map_err(link).with_context(what)?;
        if conn.peer_gone().map_err(link).with_context(what)? {
            let err = conn.endpoint().end_error();
            return Err(link(err)).with_context(what);
        }
        conn.keepalive().map_err(link).with_context(what)?;
        std::thread::sleep(NAP);
    }
}

/// After the link failed under the sender: the server's own `Fail`, if it
/// sent one before it disconnected. The server waits for its `Fail` to be
/// acknowledged before it leaves, so the message is already in this side's
/// receive queue, ahead of the flushes; it says why, the link error only
/// that the server went away.
fn server_verdict(conn: &mut Connection, shown: &str) -> Option<anyhow::Error> {
    let mut verdict = None;
    // Credits may be queued ahead of it: poll until the queue is empty.
    while verdict.is_none() {
        let polled = conn.poll(|ev| {
            if let Event::Received { data } = ev {
                if let Ok(Msg::Fail { message, .. }) = Msg::decode(data) {
                    verdict.get_or_insert(message);
                }
            }
        });
        if !matches!(polled, Ok(n) if n > 0) {
            break;
        }
    }
    verdict.map(|message| anyhow::anyhow!("the server failed the transfer of {shown}: {message}"))
}

/// A progress bar with rate and ETA on stderr, only when stderr is a
/// terminal and not `--quiet`.
fn progress_bar(size: u64, quiet: bool, shown: &str) -> Option<ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(shown.to_owned());
    Some(bar)
}
