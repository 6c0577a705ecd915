//! `filexfer`: a pipelined, checksummed, durable file transfer over RDMA.
//!
//! - [`name`] — the one rule for a file name that crosses the wire.
//! - [`protocol`] — the native wire formats (connect hello, control
//!   messages) with their bounds-checked decoders.
//! - [`server`] — `filexfer serve`: the accept loop (a thread per
//!   transfer, at most `--max-clients` at once) and one transfer's receive
//!   side: each chunk copied once out of its slot and checked against its
//!   BLAKE3 chaining value on the verifier pool, temp file, fsync, link
//!   into place without overwriting, fsync of the directory.
//! - [`classic`] — serving clients of the classic rdma-file-transfer
//!   example unchanged (told apart by their all-zero private data).
//! - [`streams`] — `--streams N`: a transfer's further queue pairs
//!   joining it, and a wait on one stream that the others can stop.
//! - [`in_flight`] — the names a server is receiving, reserved at `Start`.
//! - [`server_core`] — one transfer's server side of the protocol as an
//!   I/O-free state machine (events in, actions out) that [`server`]
//!   drives, and tests and the `filexfer_server` fuzz target too.
//! - [`server_script`] — a transfer's events as bytes: the fuzz target's
//!   input, and what debug builds of the server record as its seeds.
//! - [`server_dir`] — `--dir`, held open from the start: every file is
//!   created, linked, renamed and synced relative to it.
//! - [`temp`] — the server's locked temp files, and removing those a dead
//!   server left behind.
//! - [`space`] — how much of the disk one transfer may take
//!   (`--max-size`, `--min-free`), reserved before any data moves.
//! - [`source`] — the file `send` reads: never waited on in open, and
//!   checked unchanged at the end (else nothing is kept).
//! - [`client`] — `filexfer send`: keeps every server slot busy with
//!   RDMA WRITE_WITH_IMM of the chunks its hashing pool read and hashed.
//! - [`digest`] — protocol v3's digest: each slot-sized chunk's BLAKE3
//!   chaining value, merged in any order into `blake3::hash(file)`.
//! - [`chunk_pool`] — v3's fixed, recycled chunk buffers (private copies
//!   of the chunks) and the hashing pools' error type.
//! - [`verify`] — v3's receiver pool: check each chunk against its value,
//!   `pwrite` it, merge the digest, on `--verify-threads` threads.
//! - [`read_ahead`] — v3's sender pool: `pread` and hash the chunks ahead
//!   of the sender, into registered buffers it sends from, handed out in
//!   order with their values after them.
//!
//! # The native protocol (version 3)
//!
//! 1. The client connects over rdma_cm with a [`pinpoll::Connection`],
//!    whose private data is its ring's
//!    [`pinpoll::connect::RegionDescriptor`] followed by
//!    [`protocol::HELLO`] (`PPFX`, version 3). The server registers a ring
//!    of [`SLOTS`] chunk slots of [`SLOT_SIZE`] bytes with remote write
//!    only, posts its receives, and accepts with the ring's descriptor as
//!    private data. Anything else is rejected with a reason; an extra
//!    client beyond `--max-clients` is rejected with `server busy: ...`.
//! 2. Client SENDs `Start{size, name}`; the server validates the name
//!    ([`name::validate`]), refuses an existing target (unless
//!    `--overwrite`), creates a locked temp file in `--dir` ([`temp`]), and
//!    answers `Ready{slots, slot_size}` or `Fail{code, message}`.
//! 3. Chunk `i` (of [`CHUNK`] bytes, the last one shorter) goes to slot
//!    `i % slots` by WRITE_WITH_IMM, the immediate naming the slot, with
//!    its BLAKE3 chaining value ([`digest`]) as a 32-byte trailer. The
//!    client has at most `slots` chunks in flight. The server checks slot
//!    and length, copies the chunk and its value once out of the slot
//!    (which stays writable by the client) into a buffer of its verifier
//!    pool, SENDs `Credit{1}` for the slot at once, and a verifier thread
//!    checks that private copy against the value, `pwrite`s it at the
//!    chunk's offset and merges the value into the file's digest: what is
//!    checked is what is stored.
//!
//!    With `Start{streams: N > 1}` the server's `Ready` carries a token;
//!    the client connects N-1 more times with
//!    [`protocol::join_hello`] (the token, the stream's index), and
//!    stream `s` carries chunks `s, s+N, ...` into its own ring, credited
//!    on its own connection ([`streams`]). The client counts every
//!    credit it reads on a stream against its chunks in that ring: one
//!    more, or a credit of 0, is a protocol error. It reads the first
//!    stream's up to `Complete`, a further stream's only while it waits
//!    for room there (none after that stream's last chunk).
//! 4. Client SENDs `Finish{size, digest}` (BLAKE3 of the whole file, as
//!    `b3sum` prints it); once every chunk is checked and written the
//!    server compares both, checks the file's size, fsyncs, links the file
//!    it wrote (by its descriptor, not its temp name) to the final name
//!    (refusing an existing one), removes the temp
//!    name, fsyncs the directory, and only then SENDs `Complete{size}`.
//!    Any failure is `Fail` and the temp file is removed: a bad or partial
//!    file never appears under the final name.

pub mod admission;
pub mod chunk_pool;
pub mod classic;
pub mod client;
pub mod device_watch;
pub mod digest;
pub mod in_flight;
pub mod name;
pub mod pace;
pub mod protocol;
pub mod read_ahead;
pub mod server;
pub mod server_core;
pub mod server_dir;
pub mod server_script;
pub mod source;
pub mod space;
pub mod streams;
pub mod temp;
pub mod verify;

use std::time::Duration;

use pinpoll::{EngineConfig, IdlePolicy, PageSize, QpConfig};

/// Default rdma_cm port (the classic example's).
pub const DEFAULT_PORT: u16 = 12345;
/// Data bytes of every chunk but the last: a power of two, so that each
/// chunk is a whole subtree of BLAKE3's tree (see [`digest`]).
pub const CHUNK: u64 = 256 * 1024;
/// The chunk's BLAKE3 chaining value, sent after its data in the slot.
pub const TRAILER: usize = 32;
/// Bytes per chunk slot in the server's ring: a chunk and its trailer,
/// rounded up to the engine's 64-byte slot granularity.
pub const SLOT_SIZE: u32 = (CHUNK as u32 + TRAILER as u32).next_multiple_of(64);
/// Chunk slots in the server's ring: the chunks in flight.
pub const SLOTS: u32 = 16;
/// Chunks posted with one doorbell, at most.
pub(crate) const BATCH: u32 = 4;

/// Heartbeats a peer may leave unanswered (see [`engine_config`]).
pub const HEARTBEAT_MISSES: u32 = 3;

/// The engine configuration of both sides: `SLOTS` slots of `SLOT_SIZE`
/// bytes, receive queues deep enough for every chunk in flight plus the
/// control messages, every wait bounded by `timeout`.
///
/// `timeout` (`--timeout`) is also what a silent peer is given: an idle
/// connection sends a heartbeat every `timeout / HEARTBEAT_MISSES` and
/// declares the peer dead once one stays unanswered for `timeout`. A fixed
/// short heartbeat would call a live but stalled peer dead sooner than the
/// user allowed — as happened on busy 2-vCPU test guests, whose kernels
/// did not acknowledge within the engine's default 3 s.
pub fn engine_config(timeout: Duration, hugepages: bool) -> EngineConfig {
    let mut built = EngineConfig::default();
    built.qp = QpConfig::default();
    built.qp.max_send_wr = 64;
    built.qp.max_recv_wr = 2 * SLOTS;
    built.qp.cq_depth = 64;
    built.qp.max_inline_data = 128;
    built.qp.connect_timeout = timeout;
    built.batch_size = BATCH;
    built.signal_interval = BATCH;
    built.inline_threshold = 128;
    built.slot_size = SLOT_SIZE;
    built.slot_count = SLOTS;
    built.pages = if hugepages {
        PageSize::Huge2M
    } else {
        PageSize::Base
    };
    built.core = None;
    built.idle = IdlePolicy::Spin;
    built.handoff_depth = 1024;
    built.completion_timeout = timeout;
    built.heartbeat_interval = Some(timeout / HEARTBEAT_MISSES);
    built.heartbeat_misses = HEARTBEAT_MISSES;
    built
}

/// `cfg` with the transport settings of a tuning profile (`--profile`):
/// the QP's ACK timeout, retry count and RNR retry count. The rest of a
/// profile does not apply: the chunk geometry is the protocol's, and
/// `--timeout` bounds the waits and the heartbeats.
pub fn with_transport(mut cfg: EngineConfig, profile: Option<&EngineConfig>) -> EngineConfig {
    if let Some(p) = profile {
        cfg.qp.timeout = p.qp.timeout;
        cfg.qp.retry_count = p.qp.retry_count;
        cfg.qp.rnr_retry = p.qp.rnr_retry;
    }
    cfg
}

/// Pins the calling thread to `core` (`--core`), if given. The core is
/// not looked up in the thread's own affinity: a thread started by a
/// pinned one inherits that one core, and must still be able to move to
/// another of the list ([`check_cores`] checked them all at start-up).
pub fn pin(core: Option<usize>) -> anyhow::Result<()> {
    match core {
        Some(core) => anyhow::Context::context(pinpoll_appkit::pin(core), "--core"),
        None => Ok(()),
    }
}

/// Checks that every core of `--core` is one this process may run on, so
/// that a wrong list fails at start-up, not in a stream's thread.
pub fn check_cores(cores: &[usize]) -> anyhow::Result<()> {
    let available = core_affinity::get_core_ids().unwrap_or_default();
    match cores
        .iter()
        .find(|c| !available.iter().any(|a| a.id == **c))
    {
        Some(core) => anyhow::bail!("--core {core}: no such core available to this process"),
        None => Ok(()),
    }
}

/// The core stream `index` is pinned to: `--core`'s list in turn (none
/// without one).
pub fn core_for(cores: &[usize], index: u64) -> Option<usize> {
    let n = cores.len() as u64;
    (n > 0).then(|| cores[(index % n) as usize])
}

/// `N bytes in S s (R MiB/s)`.
pub fn summary(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 {
        bytes as f64 / secs / (1024.0 * 1024.0)
    } else {
        0.0
    };
    format!("{bytes} bytes in {secs:.3} s ({rate:.1} MiB/s)")
}

/// [`summary`] and the file's BLAKE3 digest in hex, as `b3sum` prints it.
pub fn digest_summary(bytes: u64, elapsed: Duration, digest: &blake3::Hash) -> String {
    format!("{}, BLAKE3 {}", summary(bytes, elapsed), digest.to_hex())
}

/// Names the usual causes of a failed wait on the connection.
pub fn explain_link(err: pinpoll::Error, peer: &str) -> anyhow::Error {
    use pinpoll::WcStatus;
    let status = err.completion().map(|c| c.status);
    let hint = match (&err, status) {
        (pinpoll::Error::Disconnected | pinpoll::Error::PeerLeft(_), _)
        | (_, Some(WcStatus::WR_FLUSH_ERR)) => {
            Some(format!("the {peer} disconnected (did it stop or fail?)"))
        }
        (_, Some(WcStatus::RETRY_EXC_ERR)) => Some(format!("the {peer} stopped answering")),
        (pinpoll::Error::Timeout { .. }, _) => Some(format!(
            "the {peer} sent nothing within --timeout (is it stuck or gone?)"
        )),
        _ => None,
    };
    match hint {
        Some(hint) => anyhow::Error::new(err).context(hint),
        None => err.into(),
    }
}

/// Whether `err` is the engine failing to register a connection's rings
/// (the locked-memory limit, a mapping, or the registration itself).
pub(crate) fn is_registration(err: &pinpoll::Error) -> bool {
    matches!(
        err,
        pinpoll::Error::Memlock { .. } | pinpoll::Error::Map { .. } | pinpoll::Error::RegMr { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_peer_gets_the_whole_timeout() {
        for secs in [1, 10, 60] {
            let timeout = Duration::from_secs(secs);
            let cfg = engine_config(timeout, false);
            cfg.validate().unwrap();
            assert_eq!(cfg.completion_timeout, timeout);
            let interval = cfg.heartbeat_interval.expect("heartbeats on");
            // Up to a nanosecond per heartbeat lost to integer division.
            let dead_after = interval * cfg.heartbeat_misses;
            assert!(
                timeout - dead_after < Duration::from_nanos(3),
                "{dead_after:?}"
            );
        }
    }

    #[test]
    fn a_request_that_failed_as_the_peer_left_blames_the_departure() {
        let wc = pinpoll::WcError {
            wr_id: 166,
            opcode: Some(pinpoll::WcOpcode::RDMA_WRITE),
            status: pinpoll::WcStatus::REM_ACCESS_ERR,
            vendor_err: 0,
        };
        let line = crate::run::error_line(&explain_link(pinpoll::Error::PeerLeft(wc), "server"));
        assert!(
            line.starts_with("the server disconnected (did it stop or fail?): the peer disconnected; a request in flight failed with it: work request 166 (RDMA_WRITE) failed: REM_ACCESS_ERR"),
            "{line}"
        );
        // Without a departure the status speaks for itself.
        let line = crate::run::error_line(&explain_link(pinpoll::Error::Completion(wc), "server"));
        assert!(
            line.starts_with("work request 166 (RDMA_WRITE) failed: REM_ACCESS_ERR"),
            "{line}"
        );
    }

    #[test]
    fn a_thread_started_by_a_pinned_one_moves_to_another_core() {
        let cores: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .iter()
            .map(|c| c.id)
            .collect();
        assert!(cores.len() >= 2, "this test needs two cores: {cores:?}");
        check_cores(&cores).unwrap();
        let (first, second) = (cores[0], cores[1]);
        let moved = std::thread::spawn(move || {
            pin(Some(first))?;
            // Started by a thread pinned to `first`, it inherits that core.
            std::thread::spawn(move || {
                pin(Some(second))?;
                let now: Vec<usize> = core_affinity::get_core_ids()
                    .unwrap_or_default()
                    .iter()
                    .map(|c| c.id)
                    .collect();
                anyhow::Ok(now)
            })
            .join()
            .expect("no panic")
        })
        .join()
        .expect("no panic")
        .unwrap();
        assert_eq!(moved, [second]);
        assert!(check_cores(&[usize::MAX]).is_err());
    }

    #[test]
    fn streams_take_the_cores_of_the_list_in_turn() {
        assert_eq!(core_for(&[], 3), None);
        let cores = [4, 7];
        let taken: Vec<_> = (0..5).map(|s| core_for(&cores, s)).collect();
        assert_eq!(taken, [Some(4), Some(7), Some(4), Some(7), Some(4)]);
    }

    #[test]
    fn a_profile_sets_only_the_transport() {
        let base = engine_config(Duration::from_secs(10), false);
        assert_eq!(with_transport(base.clone(), None), base);
        let profile = EngineConfig::from_toml(
            "qp_timeout = 17\nretry_count = 5\nrnr_retry = 3\nslot_size = 4096",
        )
        .unwrap();
        let cfg = with_transport(base.clone(), Some(&profile));
        assert_eq!(
            (cfg.qp.timeout, cfg.qp.retry_count, cfg.qp.rnr_retry),
            (17, 5, 3)
        );
        assert_eq!(cfg.slot_size, base.slot_size);
        cfg.validate().unwrap();
    }
}
