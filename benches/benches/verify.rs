//! filexfer v3's hashing pools, no device needed: what checking a chunk
//! costs, and how it scales with threads.
//!
//! - `verify/chunk_cv/{wall,cpu}`: one 256 KiB chunk's chaining value on
//!   one thread (BLAKE3 alone).
//! - `verify/check/{wall,cpu}/threads/N`: a [`VerifierPool`] of N threads
//!   alone — check, write (to `/dev/null`), merge — fed buffers that
//!   already hold their chunk: how the pool scales when the busy-poll
//!   thread has a core of its own.
//! - `verify/receive/{wall,cpu}/threads/N`: the receiver's work on a
//!   [`VerifierPool`] of N threads: this thread copies each chunk from a
//!   "slot" into a pool buffer (as the busy-poll thread will) and submits
//!   it; the pool hashes it, compares its value, writes it (to
//!   `/dev/null`, so no storage is measured) and merges the digest.
//! - `verify/send/{wall,cpu}/threads/N`: the sender's on a
//!   [`HashingReader`] of N threads: `pread` (from `/dev/zero`) and hash,
//!   then this thread takes each chunk (sent from its own buffer, no copy)
//!   and merges its value.
//!
//! Each iteration moves one 16 MiB file; the pool is made (threads
//! started, buffers touched) outside the timed part. `wall` times it by the
//! clock: the speed-up from 1 to 2 threads is the ratio of the two `wall`
//! throughputs (in `receive` this thread's copies compete for
//! the same cores; `check` leaves them to the pool). `cpu` times it by the
//! CPU time of the whole process (every thread): its throughput is bytes
//! per CPU-second, the rate of one thread doing all the work, which other
//! load on the host disturbs far less than the clock.
//!
//! `cargo bench -p pinpoll-benches --bench verify`

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use pinpoll_apps::filexfer::chunk_pool::PoolSize;
use pinpoll_apps::filexfer::digest::{ChainingValue, ChunkGeometry, FileDigest, CHUNK_LEN};
use pinpoll_apps::filexfer::read_ahead::HashingReader;
use pinpoll_apps::filexfer::verify::VerifierPool;

/// The longest the bench waits for a verifier buffer (the server waits
/// its --timeout): only a stuck pool reaches it.
const BUFFER_WAIT: Duration = Duration::from_secs(60);

/// Chunks per iteration: a 16 MiB file.
const CHUNKS: u64 = 64;
/// The thread counts compared.
const THREADS: [usize; 2] = [1, 2];
/// Samples of the whole-file benches: criterion's least, each a 16 MiB
/// file (a few milliseconds), so that a short run stays short.
const SAMPLES: usize = 10;

/// Bytes that are not all alike, so the hash sees real input.
fn file_bytes(len: u64) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn chunk_cv(c: &mut Criterion) {
    let geometry = ChunkGeometry::v3(2 * CHUNK_LEN);
    let chunk = file_bytes(CHUNK_LEN);
    let mut g = c.benchmark_group("verify/chunk_cv");
    g.throughput(Throughput::Bytes(CHUNK_LEN));
    for clock in [Clock::Wall, Clock::Cpu] {
        g.bench_function(clock.name(), |b| {
            b.iter_custom(|iters| {
                let start = clock.now();
                for _ in 0..iters {
                    black_box(
                        geometry
                            .chunk_cv(1, black_box(&chunk))
                            .expect("a full chunk"),
                    );
                }
                clock.now() - start
            })
        });
    }
    g.finish();
}

/// What an iteration is timed by.
#[derive(Clone, Copy)]
enum Clock {
    Wall,
    Cpu,
}

impl Clock {
    fn name(self) -> &'static str {
        match self {
            Clock::Wall => "wall",
            Clock::Cpu => "cpu",
        }
    }

    /// A reading of this clock; only differences mean anything.
    fn now(self) -> Duration {
        match self {
            Clock::Wall => {
                static EPOCH: OnceLock<Instant> = OnceLock::new();
                EPOCH.get_or_init(Instant::now).elapsed()
            }
            Clock::Cpu => {
                let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
                Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
            }
        }
    }
}

/// Benches, for every thread count and clock, one whole file moved by
/// `run` through what `setup(threads)` made: only `run` is timed.
fn whole_files<T>(
    c: &mut Criterion,
    side: &str,
    mut setup: impl FnMut(usize) -> T,
    mut run: impl FnMut(T),
) {
    let mut g = c.benchmark_group(format!("verify/{side}"));
    g.sampling_mode(SamplingMode::Flat).sample_size(SAMPLES);
    g.throughput(Throughput::Bytes(CHUNKS * CHUNK_LEN));
    for clock in [Clock::Wall, Clock::Cpu] {
        for threads in THREADS {
            g.bench_function(format!("{}/threads/{threads}", clock.name()), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            let pool = setup(threads);
                            let start = clock.now();
                            run(pool);
                            clock.now() - start
                        })
                        .sum()
                })
            });
        }
    }
    g.finish();
}

/// A verifier pool of `threads` threads and their buffers, writing to
/// /dev/null.
fn verifier(geometry: ChunkGeometry, threads: usize) -> VerifierPool {
    let sink = OpenOptions::new().write(true).open("/dev/null");
    let sink = Arc::new(sink.expect("open /dev/null"));
    VerifierPool::new(sink, geometry, PoolSize::with_threads(threads)).expect("a verifier pool")
}

/// Each chunk's value, for a file whose chunk `i` is `chunk(i)`.
fn values<'a>(geometry: ChunkGeometry, chunk: impl Fn(u64) -> &'a [u8]) -> Vec<ChainingValue> {
    (0..geometry.chunk_count())
        .map(|i| geometry.chunk_cv(i, chunk(i)).expect("a chunk"))
        .collect()
}

/// The receiver: copy each chunk from its "slot" into a pool buffer and
/// submit it; the pool checks, writes (to /dev/null) and merges.
fn receive(c: &mut Criterion) {
    let geometry = ChunkGeometry::v3(CHUNKS * CHUNK_LEN);
    let ring = file_bytes(geometry.file_len());
    let slots: Vec<&[u8]> = ring.chunks(CHUNK_LEN as usize).collect();
    let cvs = values(geometry, |i| slots[i as usize]);
    let run = |pool: VerifierPool| {
        for (index, slot) in slots.iter().enumerate() {
            let mut buffer = pool.buffer(BUFFER_WAIT).expect("a buffer");
            buffer.copy_from(slot).expect("a chunk fits");
            pool.submit(index as u64, cvs[index], buffer)
                .expect("submitted");
        }
        black_box(pool.finish().expect("every chunk matches"));
    };
    whole_files(c, "receive", |threads| verifier(geometry, threads), run);
}

/// The verifier pool alone: every chunk of the file has the same bytes,
/// which every buffer was given before the timing starts, so this thread
/// only hands buffers back in (no copy) and the pool's threads do all the
/// work: check, write, merge. This is how the pool scales with threads
/// when the busy-poll thread has a core of its own.
fn check(c: &mut Criterion) {
    let geometry = ChunkGeometry::v3(CHUNKS * CHUNK_LEN);
    let chunk = file_bytes(CHUNK_LEN);
    let cvs = values(geometry, |_| chunk.as_slice());
    let primed = |threads| {
        let pool = verifier(geometry, threads);
        let mut buffers = Vec::new();
        while let Some(mut buffer) = pool.try_buffer().expect("a fresh pool") {
            buffer.copy_from(&chunk).expect("a chunk fits");
            buffers.push(buffer);
        }
        pool
    };
    let run = |pool: VerifierPool| {
        for (index, cv) in cvs.iter().enumerate() {
            let mut buffer = pool.buffer(BUFFER_WAIT).expect("a buffer");
            // The same length as the bytes it holds: nothing to copy.
            buffer.bytes_mut(chunk.len()).expect("a chunk fits");
            pool.submit(index as u64, *cv, buffer).expect("submitted");
        }
        black_box(pool.finish().expect("every chunk matches"));
    };
    whole_files(c, "check", primed, run);
}

/// The sender: the pool preads (from /dev/zero) and hashes; this thread
/// takes each chunk's buffer (the NIC sends from it, no copy) and merges
/// its value.
fn send(c: &mut Criterion) {
    let geometry = ChunkGeometry::v3(CHUNKS * CHUNK_LEN);
    let setup = |threads| {
        let zeros = Arc::new(File::open("/dev/zero").expect("open /dev/zero"));
        HashingReader::new(zeros, geometry, PoolSize::with_threads(threads))
            .expect("a hashing reader")
    };
    let run = |mut reader: HashingReader| {
        let mut digest = FileDigest::new(geometry, 1);
        while let Some(chunk) = reader.next_chunk().expect("a chunk") {
            black_box(chunk.bytes_and_value());
            digest.record(chunk.index(), *chunk.cv()).expect("in order");
        }
        black_box(digest.finish().expect("every chunk read"));
    };
    whole_files(c, "send", setup, run);
}

criterion_group!(benches, chunk_cv, check, receive, send);
criterion_main!(benches);
