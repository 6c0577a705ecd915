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
//! - `PINPOLL_FILEXFER_TEST_DROP_STREAM=S` makes stream `S` of a
//!   `--streams` transfer drop its connection after its first batch of
//!   chunks — a stream dying mid-transfer, which must fail the whole
//!   transfer cleanly.
//! - `PINPOLL_FILEXFER_TEST_TRICKLE_MS=T` sends one chunk every `T` ms —
//!   a client too slow for the server's `--min-rate` or `--deadline`.

use std::fs::File;
use std::io::IsTerminal as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pinpoll::{Access, Connection, EngineConfig, Event, Incoming, MemoryRegion, PageSize};

use crate::cli::{socket_addr, CommonArgs};
use crate::filexfer::chunk_pool::BufferPool;
use crate::filexfer::digest::{ChainingValue, ChunkGeometry, FileDigest};
use crate::filexfer::name;
use crate::filexfer::protocol::{join_hello, FailCode, Msg, HELLO};
use crate::filexfer::read_ahead::{HashingReader, Lane};
use crate::filexfer::server::{send_and_wait, settle};
use crate::filexfer::source::Source;
use crate::filexfer::streams::{first_failure, Stopped};
use crate::filexfer::{
    check_cores, core_for, digest_summary, engine_config, explain_link, is_registration, pin,
    with_transport, BATCH, CHUNK, SLOTS, TRAILER,
};
use crate::output::{printable, Output};
use crate::run::error_line;
use crate::session::device_exists;

/// What `send` needs from the command line.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub host: String,
    pub file: std::path::PathBuf,
    pub port: u16,
    pub hugepages: bool,
    /// Cores to pin to (`--core`): stream `s` to core `s % len`.
    pub cores: Vec<usize>,
    /// Queue pairs the file is striped across (`--streams`).
    pub streams: u16,
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
/// The test-only hook that drops a stream mid-transfer (see the module
/// docs).
pub const DROP_STREAM_ENV: &str = "PINPOLL_FILEXFER_TEST_DROP_STREAM";

/// The test-only hook that sends one chunk per this many milliseconds
/// (see the module docs).
pub const TRICKLE_ENV: &str = "PINPOLL_FILEXFER_TEST_TRICKLE_MS";

/// The error of a stream that the test-only hook dropped.
#[derive(Debug, thiserror::Error)]
#[error("{DROP_STREAM_ENV}: stream {0} dropped its connection")]
struct StreamDropped(u64);

/// The test-only fault hooks set for this transfer (none in release builds).
#[derive(Debug, Default)]
struct Faults {
    flip: Option<u64>,
    rewrite: Option<u64>,
    drop_stream: Option<u64>,
    trickle: Option<Duration>,
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
            drop_stream: chunk(DROP_STREAM_ENV)?,
            trickle: match std::env::var(TRICKLE_ENV) {
                Err(_) => None,
                Ok(v) => Some(Duration::from_millis(v.parse().with_context(|| {
                    format!("{TRICKLE_ENV}={v:?}: expected milliseconds")
                })?)),
            },
        })
    }
}

/// Sends `opts.file`; success only once the server said the file is
/// verified, durable and in place.
pub fn send(opts: &SendOptions, common: &CommonArgs, out: Output) -> anyhow::Result<()> {
    let path = &opts.file;
    let name = wire_name(path)?;
    // With --wait-for-file the file is opened once it appears, after
    // connecting; otherwise a missing or unreadable file fails here, before
    // any connection exists.
    let mut source = match opts.wait_for_file {
        Some(_) => None,
        None => Some(Source::open(path)?),
    };
    let faults = Faults::from_env()?;
    // Checked here, used once the hashing threads run: a thread pinned
    // now would hand its one core down to every thread it starts.
    check_cores(&opts.cores)?;

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
        let Some(source) = &source else {
            bail!("--wait-for-file cannot be used with --classic");
        };
        return crate::filexfer::classic::send(
            source,
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
    out.progress(format_args!(
        "connected to {addr} on {}",
        conn.endpoint().device_name()
    ))?;
    if let Some(limit) = opts.wait_for_file {
        out.progress(format_args!(
            "waiting up to {} s for {} to appear",
            limit.as_secs_f64(),
            path.display()
        ))?;
        wait_for_file(&mut conn, path, limit)?;
        source = Some(Source::open(path)?);
    }
    let source = source.expect("the file is open by now");
    let native = Native {
        cfg: &cfg,
        addr,
        device: common.device.as_deref(),
        quiet: common.quiet,
        faults,
    };
    native.send(conn, &source, opts, &name, out)
}

/// What a native transfer needs beyond the command line.
struct Native<'a> {
    cfg: &'a EngineConfig,
    addr: std::net::SocketAddr,
    device: Option<&'a str>,
    quiet: bool,
    faults: Faults,
}

impl Native<'_> {
    /// Sends `file` of `size` bytes over the connected `conn` (and the
    /// further streams it opens); success once the server said the file is
    /// verified, durable and in place.
    fn send(
        self,
        mut conn: Connection,
        source: &Source,
        opts: &SendOptions,
        name: &str,
        out: Output,
    ) -> anyhow::Result<()> {
        let shown = printable(name.as_bytes());
        let timeout = self.cfg.completion_timeout;
        let began = Instant::now();
        let size = source.size();
        let start = Msg::Start {
            size,
            streams: opts.streams,
            name: name.as_bytes().to_vec(),
        };
        let (ring, token) = start_transfer(&mut conn, &start, timeout, &shown)?;
        let mut others = self.open_streams(token, opts.streams)?;
        let bar = progress_bar(size, self.quiet, &shown);
        let sending = Sending {
            file: Arc::clone(source.file()),
            geometry: ChunkGeometry::v3(size),
            ring,
            timeout,
            threads: opts.verify_threads,
            cores: &opts.cores,
            bar: bar.as_ref(),
            faults: self.faults,
        };
        let (digest, mut credits) = match sending.send(&mut conn, &mut others) {
            Ok(sent) => sent,
            Err(e) => return Err(await_verdict(&mut conn, &shown, timeout).unwrap_or(e)),
        };
        if let Err(changed) = source.check_unchanged() {
            // Every chunk is sent; instead of Finish, the server is told
            // why not, and keeps nothing.
            let stop = Msg::Fail {
                code: FailCode::Io,
                message: error_line(&changed),
            };
            if let Err(e) = send_and_wait(&mut conn, &stop.encode(), timeout, "server") {
                tracing::debug!(error = %e, "telling the server the file changed");
            }
            return Err(changed);
        }
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
            return Err(server_verdict(&mut conn, &shown, Instant::now() + timeout)
                .unwrap_or_else(|| e.context("sending the file's BLAKE3 digest")));
        }
        await_complete(&mut conn, size, &shown, &mut credits, timeout)?;
        let elapsed = began.elapsed();
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        // The file is verified and durable on the server (its Complete
        // was the last message): nothing left to deliver, and a teardown
        // that does not drain cleanly no longer changes the outcome.
        for mut conn in others.into_iter().flatten().chain([conn]) {
            conn.set_completion_timeout(timeout.min(std::time::Duration::from_secs(2)));
            if let Err(e) = conn.abort() {
                tracing::debug!(error = %e, "closing the connection after Complete");
            }
        }
        out.progress(format_args!(
            "sent {shown}: {}",
            digest_summary(size, elapsed, &digest)
        ))?;
        Ok(())
    }
}

impl Native<'_> {
    /// Connects streams `1..streams` of the transfer whose `Ready` gave
    /// `token`.
    fn open_streams(&self, token: u64, streams: u16) -> anyhow::Result<Vec<Option<Connection>>> {
        (1..streams)
            .map(|stream| {
                Connection::builder(self.cfg)
                    .remote_access(Access::LOCAL_READ)
                    .private_data(&join_hello(token, stream))
                    .device(self.device)
                    .connect(self.addr)
                    .map(Some)
                    .map_err(|e| {
                        connect_error(e, self.addr).context(format!("connecting stream {stream}"))
                    })
            })
            .collect()
    }
}

/// Sends `start` and returns the ring the server's `Ready` offers each
/// stream, and the token further streams join with.
fn start_transfer(
    conn: &mut Connection,
    start: &Msg,
    timeout: Duration,
    shown: &str,
) -> anyhow::Result<(Ring, u64)> {
    send_and_wait(conn, &start.encode(), timeout, "server")
        .context("sending the file's name and size")?;
    let ready = {
        let m = conn
            .recv()
            .map_err(|e| explain_link(e, "server"))
            .context("waiting for the server to be ready")?;
        ensure!(m.imm.is_none(), "the server wrote into this side's memory");
        Msg::decode(m.data)?
    };
    let (slots, slot_size, token) = match ready {
        Msg::Ready {
            slots,
            slot_size,
            token,
        } => (slots, slot_size, token),
        Msg::Fail { message, .. } => bail!("the server refused {shown}: {message}"),
        other => bail!("the server sent {} instead of Ready", other.name()),
    };
    let peer = conn.peer_ring();
    ensure!(
        (1..=1 << 16).contains(&slots)
            && slot_size as usize >= CHUNK as usize + TRAILER
            && slot_size as usize <= conn.slot_size()
            && u64::from(slots) * u64::from(slot_size) <= peer.len,
        "the server offered {slots} slots of {slot_size} bytes, which a chunk of {CHUNK} bytes and its value, its ring of {} bytes or this side's {}-byte slots cannot hold",
        peer.len,
        conn.slot_size()
    );
    Ok((Ring { slots, slot_size }, token))
}

/// Waits for the server's `Complete` (the credits of the chunks still in
/// the first stream's ring may come first; `credits` counts them), at most
/// twice `timeout` in all: one for the credits, one for the server to
/// verify and store the file. A credit does not start a new wait, or a
/// server returning the chunks of a large ring one by one would hold
/// this side for as many timeouts.
fn await_complete(
    conn: &mut Connection,
    size: u64,
    shown: &str,
    credits: &mut Credits,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + 2 * timeout;
    loop {
        let msg = {
            let Some(m) = recv_by(conn, deadline) else {
                bail!(
                    "the server did not confirm {shown} within twice --timeout of its digest \
                     (is it stuck or gone?); the file may or may not be stored"
                );
            };
            let m = m
                .map_err(|e| explain_link(e, "server"))
                .context("waiting for the server to store the file")?;
            ensure!(m.imm.is_none(), "the server wrote into this side's memory");
            Msg::decode(m.data)?
        };
        if closing(msg, size, shown, credits)? {
            return Ok(());
        }
    }
}

/// One message of the server after `Finish`: whether it is the `Complete`
/// that ends the transfer. A credit is counted, as during the transfer.
fn closing(msg: Msg, size: u64, shown: &str, credits: &mut Credits) -> anyhow::Result<bool> {
    match msg {
        Msg::Credit { count } => credits.returned(count).map(|()| false),
        Msg::Complete { size: stored } => {
            ensure!(stored == size, "the server stored {stored} bytes of {size}");
            Ok(true)
        }
        Msg::Fail { message, .. } => {
            bail!("the server failed the transfer of {shown}: {message}")
        }
        other => bail!("the server sent {} instead of Complete", other.name()),
    }
}

/// The server's ring as its `Ready` offered it.
#[derive(Debug, Clone, Copy)]
struct Ring {
    slots: u32,
    slot_size: u32,
}

/// One file being sent over one or more streams.
struct Sending<'a> {
    file: Arc<File>,
    geometry: ChunkGeometry,
    ring: Ring,
    timeout: Duration,
    /// `--verify-threads`: shared by the streams' hashing pools.
    threads: usize,
    cores: &'a [usize],
    bar: Option<&'a ProgressBar>,
    faults: Faults,
}

impl Sending<'_> {
    /// Sends every chunk: stream `s` of `1 + others.len()` those of lane
    /// `s`, each stream on its own thread (the first on this one), pinned
    /// to `--core`'s list in turn; returns the file's digest, merged from
    /// every chunk's value, and the first stream's credits (the server
    /// returns the rest of them before its `Complete`).
    fn send(
        &self,
        first: &mut Connection,
        others: &mut [Option<Connection>],
    ) -> anyhow::Result<(blake3::Hash, Credits)> {
        let count = others.len() as u64 + 1;
        // Every lane's hashing threads start before any stream's thread is
        // pinned, so they may run on every core, not on a stream's one.
        let mut readers = std::iter::once(&*first)
            .chain(others.iter().flatten())
            .zip(0..count)
            .map(|(conn, index)| self.reader(conn, Lane { index, count }))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let first_reader = readers.remove(0);
        let digest = Mutex::new(FileDigest::new(self.geometry, (SLOTS * 4) as usize));
        let stop = AtomicBool::new(false);
        let (first, rest): (_, Vec<anyhow::Result<Credits>>) = std::thread::scope(|scope| {
            let threads: Vec<_> = others
                .iter_mut()
                .zip(readers)
                .map(|(slot, reader)| {
                    let (digest, stop) = (&digest, &stop);
                    scope.spawn(move || {
                        let conn = slot.as_mut().context("the stream's connection")?;
                        let sent = self.send_lane(conn, reader, digest, stop);
                        if matches!(&sent, Err(e) if e.downcast_ref::<StreamDropped>().is_some()) {
                            *slot = None;
                        }
                        sent
                    })
                })
                .collect();
            let first = self.send_lane(first, first_reader, &digest, &stop);
            let rest = threads.into_iter().map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a stream's thread panicked")))
            });
            (first, rest.collect())
        });
        let (credits, first_error) = match first {
            Ok(credits) => (Some(credits), None),
            Err(e) => (None, Some(e)),
        };
        let errors = first_error
            .into_iter()
            .chain(rest.into_iter().filter_map(Result::err));
        if let Some(e) = first_failure(errors) {
            return Err(e);
        }
        let credits = credits.expect("the first stream succeeded");
        let digest = digest.into_inner().unwrap_or_else(PoisonError::into_inner);
        let digest = digest
            .finish()
            .context("merging the chunks' values into the file's digest")?;
        Ok((digest, credits))
    }

    /// The reader of `lane`, sent on `conn`: its share of
    /// `--verify-threads` hashing threads, and buffers registered on
    /// `conn`'s device — one for every slot the server credits, each sent
    /// from while its chunk is in flight, and two per thread to read ahead.
    fn reader(&self, conn: &Connection, lane: Lane) -> anyhow::Result<HashingReader<MemoryRegion>> {
        let threads = (self.threads / lane.count as usize).max(1);
        let count = self.ring.slots.min(MAX_IN_FLIGHT) as usize + 2 * threads;
        let len = HashingReader::<MemoryRegion>::buffer_len(&self.geometry);
        // Base pages: a chunk buffer is far smaller than a huge page.
        let memory = (0..count)
            .map(|_| conn.endpoint().register(len, PageSize::Base, Access::LOCAL_READ))
            .collect::<pinpoll::Result<Vec<_>>>()
            .with_context(|| {
                format!("registering {count} chunk buffers of {len} bytes (the locked-memory limit: ulimit -l)")
            })?;
        let reader = BufferPool::from_memory(memory)
            .and_then(|buffers| {
                HashingReader::with_buffers(
                    Arc::clone(&self.file),
                    self.geometry,
                    lane,
                    threads,
                    buffers,
                )
            })
            .map_err(anyhow::Error::new);
        in_stream(reader, lane)
    }

    /// Sends the chunks of `reader`'s lane on `conn` (see [`send_chunks`])
    /// from this thread, pinned to the lane's core of `--core`; a failure
    /// stops the other streams.
    fn send_lane(
        &self,
        conn: &mut Connection,
        mut reader: HashingReader<MemoryRegion>,
        digest: &Mutex<FileDigest>,
        stop: &AtomicBool,
    ) -> anyhow::Result<Credits> {
        let lane = reader.lane();
        let sent = pin(core_for(self.cores, lane.index))
            .and_then(|()| self.send_chunks(conn, &mut reader, lane, digest, stop));
        if sent.is_err() {
            stop.store(true, Ordering::Release);
        }
        in_stream(sent, lane)
    }
}

/// Names the stream an error happened on — when there is more than one.
fn in_stream<T>(result: anyhow::Result<T>, lane: Lane) -> anyhow::Result<T> {
    if lane.count > 1 {
        result.with_context(|| format!("stream {}", lane.index))
    } else {
        result
    }
}

impl Sending<'_> {
    /// Sends every chunk of `lane` that `reader` hands out, each into its
    /// slot with its chaining value after it, straight from the buffer it
    /// was read into, keeping every slot the server has credited busy, and
    /// records each value in `digest`; returns the credits as they stand
    /// after the last chunk.
    fn send_chunks(
        &self,
        conn: &mut Connection,
        reader: &mut HashingReader<MemoryRegion>,
        lane: Lane,
        digest: &Mutex<FileDigest>,
        stop: &AtomicBool,
    ) -> anyhow::Result<Credits> {
        let link = |e| explain_link(e, "server");
        let chunks = lane.len(self.geometry.chunk_count());
        let slots = u64::from(self.ring.slots);
        let (mut position, mut credits) = (0u64, Credits::new(self.ring.slots));
        let mut ready = Vec::with_capacity(BATCH as usize);
        while position < chunks {
            if stop.load(Ordering::Acquire) {
                bail!(Stopped);
            }
            if credits.free() == 0 {
                await_credit(conn, &mut credits)?;
                continue;
            }
            settle(conn, self.timeout, "server")?;
            // A rewrite takes a request of its own in the batch.
            let room = u64::from(BATCH) - u64::from(self.faults.rewrite.is_some());
            let mut n = credits.free().min(room).min(chunks - position);
            if let Some(pause) = self.faults.trickle {
                std::thread::sleep(pause);
                n = 1;
            }
            while (ready.len() as u64) < n {
                ready.push(self.next_ready(conn, reader)?);
            }
            let mut posted = 0;
            let mut b = conn.batch();
            for (k, chunk) in ready.drain(..).enumerate() {
                // Counted by chunk: a rewrite fault adds a request.
                if k as u64 + 1 == n {
                    // Its completion retires the batch: the buffers it
                    // lent come back without waiting for a later one.
                    b.signal_next();
                }
                let slot = (position % slots) as u32;
                let remote = u64::from(slot) * u64::from(self.ring.slot_size);
                let (index, cv, len) = (chunk.index, chunk.cv, chunk.len);
                self.post_chunk(&mut b, chunk, slot, remote).map_err(link)?;
                lock(digest).record(index, cv)?;
                posted += (len - TRAILER) as u64;
                position += 1;
            }
            b.post().map_err(link).context("posting chunks")?;
            credits.spend(n);
            if let Some(bar) = self.bar {
                bar.inc(posted);
            }
            if self.faults.drop_stream == Some(lane.index) {
                return Err(StreamDropped(lane.index).into());
            }
        }
        Ok(credits)
    }

    /// The lane's next chunk, read and hashed. Buffers the NIC is done
    /// sending from go back to the reader first. While the reader still
    /// has a buffer of its own this waits for it (asleep: its hashing
    /// threads may share this core); with every buffer lent it polls, as
    /// only their completions can free the next one.
    fn next_ready(
        &self,
        conn: &mut Connection,
        reader: &mut HashingReader<MemoryRegion>,
    ) -> anyhow::Result<Ready> {
        let mut spins = 0u32;
        let mut deadline = None;
        loop {
            while let Some(memory) = conn.reclaim() {
                reader.put_back(memory);
            }
            let chunk = if conn.lent_regions() < reader.buffer_count() {
                reader.next_chunk()?
            } else {
                reader.try_next_chunk()?
            };
            if let Some(chunk) = chunk {
                return Ok(Ready {
                    index: chunk.index(),
                    cv: *chunk.cv(),
                    len: chunk.bytes_and_value().len(),
                    memory: chunk.into_memory(),
                });
            }
            ensure!(!reader.is_done(), "the file ended before its last chunk");
            conn.reap().map_err(|e| explain_link(e, "server"))?;
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                let now = Instant::now();
                if now >= *deadline.get_or_insert(now + self.timeout) {
                    bail!("no send completion came within --timeout to free a chunk buffer; is the server stuck or gone?");
                }
            }
        }
    }

    /// Adds `chunk` (its bytes and value), for `slot` at `remote`, to the
    /// batch — sent from its own buffer — and the test-only faults meant
    /// for it.
    fn post_chunk(
        &self,
        b: &mut pinpoll::Batch<'_, '_>,
        chunk: Ready,
        slot: u32,
        remote: u64,
    ) -> pinpoll::Result<()> {
        let Ready {
            index,
            len,
            mut memory,
            ..
        } = chunk;
        let data_len = len - TRAILER;
        if self.faults.flip == Some(index) {
            memory.as_mut_slice()[data_len / 2] ^= 0x10;
        }
        // Debug builds only (the hooks are never set in release builds).
        let rewrite =
            (self.faults.rewrite == Some(index)).then(|| memory.as_slice()[..data_len].to_vec());
        b.write_region(memory, len, remote, Some(slot))
            .map_err(|refused| refused.error)?;
        if let Some(bytes) = rewrite {
            b.write_from(data_len, remote, None, |data| {
                data.copy_from_slice(&bytes);
                data[data_len / 2] ^= 0x10;
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// A chunk read, hashed and ready to send: its bytes then its value, the
/// first `len` bytes of `memory`.
struct Ready {
    index: u64,
    cv: ChainingValue,
    len: usize,
    memory: MemoryRegion,
}

/// The most buffers a stream lends to chunks in flight, whatever the
/// server's ring offers.
const MAX_IN_FLIGHT: u32 = 64;

fn lock(digest: &Mutex<FileDigest>) -> std::sync::MutexGuard<'_, FileDigest> {
    // A record either happened or did not: a panic leaves nothing half-done.
    digest.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The slots of the server's ring one stream may write: all of them at
/// the start, one fewer per chunk sent, one more per credit the server
/// returns. A credit is only ever for a slot that holds a chunk of this
/// stream: one more is a protocol error, never counted (it would let this
/// side overwrite a chunk the server has not copied yet).
#[derive(Debug)]
struct Credits {
    slots: u64,
    free: u64,
}

impl Credits {
    fn new(slots: u32) -> Credits {
        let slots = u64::from(slots);
        Credits { slots, free: slots }
    }

    /// The slots this side may write now.
    fn free(&self) -> u64 {
        self.free
    }

    /// `n` chunks were sent (`n` at most [`Credits::free`]).
    fn spend(&mut self, n: u64) {
        self.free = self.free.checked_sub(n).expect("spent only what is free");
    }

    /// The server returned `count` credits.
    fn returned(&mut self, count: u32) -> anyhow::Result<()> {
        // It frees nothing, yet answers the wait for a credit: repeated,
        // it would hold this side past every --timeout.
        ensure!(
            count > 0,
            "the server returned a credit of 0 (it frees no slot): a protocol error"
        );
        let in_ring = self.slots - self.free;
        ensure!(
            u64::from(count) <= in_ring,
            "the server returned more credits than it holds chunks: {count} with {in_ring} of this side's chunks in its ring of {} slots",
            self.slots
        );
        self.free += u64::from(count);
        Ok(())
    }
}

/// Waits for the server's next `Credit` and counts it in `credits`.
fn await_credit(conn: &mut Connection, credits: &mut Credits) -> anyhow::Result<()> {
    let msg = {
        let m = conn.recv().map_err(|e| explain_link(e, "server"))?;
        ensure!(m.imm.is_none(), "the server wrote into this side's memory");
        Msg::decode(m.data)?
    };
    match msg {
        Msg::Credit { count } => credits.returned(count),
        Msg::Fail { message, .. } => bail!("the server failed the transfer: {message}"),
        other => bail!("the server sent {} during the transfer", other.name()),
    }
}

/// After a stream failed: the server's verdict on the first stream — its
/// `Fail`, waited for up to `timeout` in all since the server sends it
/// only once all its streams stopped. `None` if the server left without
/// one, or sent none by then: credits the server sends meanwhile are
/// skipped, but never extend the wait.
fn await_verdict(conn: &mut Connection, shown: &str, timeout: Duration) -> Option<anyhow::Error> {
    let deadline = Instant::now() + timeout;
    if let Some(verdict) = server_verdict(conn, shown, deadline) {
        return Some(verdict);
    }
    loop {
        let message = match recv_by(conn, deadline)? {
            Ok(m) if m.imm.is_none() => Msg::decode(m.data).ok(),
            Ok(_) => None,
            Err(_) => return None,
        };
        match message {
            Some(Msg::Credit { .. }) => continue,
            Some(Msg::Fail { message, .. }) => {
                return Some(anyhow::anyhow!(
                    "the server failed the transfer of {shown}: {message}"
                ))
            }
            _ => return None,
        }
    }
}

/// The next message on `conn` by `deadline`, or `None` once it has
/// passed (a wait that timed out was cut to what was left, so it ended
/// at the deadline): no sequence of messages stretches a wait meant as a
/// whole. (The connection's completion timeout stays cut: only waits
/// that end the transfer use this.)
fn recv_by(conn: &mut Connection, deadline: Instant) -> Option<pinpoll::Result<Incoming<'_>>> {
    let left = deadline.checked_duration_since(Instant::now())?;
    if left.is_zero() {
        return None;
    }
    conn.set_completion_timeout(left);
    match conn.recv() {
        Err(pinpoll::Error::Timeout { .. }) => None,
        received => Some(received),
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
        pinpoll::Error::BadRecord(_) | pinpoll::Error::Wire(_) => {
            anyhow::Error::new(err).context("the server's accept data (is it a filexfer server?)")
        }
        pinpoll::Error::WrongDevice { .. } => anyhow::Error::new(err).context("--device"),
        err => err.into(),
    };
    err.context(format!("connecting to {addr}"))
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
fn server_verdict(conn: &mut Connection, shown: &str, until: Instant) -> Option<anyhow::Error> {
    let mut verdict = None;
    // Credits may be queued ahead of it: poll until the queue is empty,
    // or `until` (a server that keeps sending would keep it full).
    while verdict.is_none() && Instant::now() < until {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// After `Finish` the server may still return the credits of the
    /// chunks left in its ring — never more: with 16 slots and 5 chunks
    /// in the ring, a 6th credit (or 17 at once) is a protocol error, not
    /// taken and not ignored.
    /// A ring of 16 slots holding `n` chunks of this side.
    fn in_ring(n: u64) -> Credits {
        let mut credits = Credits::new(16);
        credits.spend(n);
        credits
    }

    #[test]
    fn more_credits_than_chunks_in_the_ring_end_the_transfer() {
        let complete = || Msg::Complete { size: 10 };
        let credit = |count| Msg::Credit { count };
        for extra in [
            vec![credit(6)],
            vec![credit(5), credit(1)],
            vec![credit(17)],
        ] {
            let what = format!("{extra:?}");
            let (mut refused, mut credits) = (None, in_ring(5));
            for msg in extra.into_iter().chain([complete()]) {
                match closing(msg, 10, "f.bin", &mut credits) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => {
                        refused = Some(e.to_string());
                        break;
                    }
                }
            }
            let why =
                refused.unwrap_or_else(|| panic!("{what}: taken, and the transfer completed"));
            assert!(why.contains("more credits than"), "{what}: {why}");
        }
        for fine in [vec![credit(5)], vec![credit(2), credit(3)], vec![]] {
            let what = format!("{fine:?}");
            let (mut done, mut credits) = (false, in_ring(5));
            for msg in fine.into_iter().chain([complete()]) {
                done = closing(msg, 10, "f.bin", &mut credits)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            assert!(done, "{what}");
        }
    }

    /// While chunks flow: 17 credits on a ring of 16 are refused whenever
    /// they come, and so is any credit beyond the chunks in the ring, in
    /// one message or several; the count is never changed by a refusal.
    #[test]
    fn credits_are_counted_against_the_chunks_in_the_ring() {
        let mut credits = Credits::new(16);
        let why = credits.returned(17).unwrap_err().to_string();
        assert_eq!(
            why,
            "the server returned more credits than it holds chunks: 17 with 0 of this side's chunks in its ring of 16 slots"
        );
        credits.spend(16);
        assert!(credits.returned(17).is_err(), "17 on a full ring of 16");
        credits.returned(10).unwrap();
        assert!(credits.returned(7).is_err(), "6 are left in the ring");
        assert!(credits.returned(u32::MAX).is_err());
        assert_eq!(credits.free(), 10, "refusals change nothing");
        credits.returned(6).unwrap();
        assert_eq!(credits.free(), 16);
        assert!(credits.returned(1).is_err(), "the ring is empty");
    }

    /// A credit of 0 returns no slot: a server repeating it with the ring
    /// full would keep every wait of the sender answered, and the
    /// transfer alive past every --timeout. It is a protocol error, during
    /// the transfer and after `Finish`.
    #[test]
    fn a_credit_of_zero_is_a_protocol_error() {
        let mut credits = in_ring(16);
        let why = credits.returned(0).unwrap_err().to_string();
        assert_eq!(
            why,
            "the server returned a credit of 0 (it frees no slot): a protocol error"
        );
        assert_eq!(credits.free(), 0, "refusals change nothing");
        let after_finish = closing(Msg::Credit { count: 0 }, 10, "f.bin", &mut in_ring(5));
        assert!(after_finish.is_err(), "Credit{{0}} after Finish was taken");
    }
}
