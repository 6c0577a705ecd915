//! The receiver's verifier pool of protocol v3: checks each chunk against
//! the chaining value it was sent with, writes it at its offset, and merges
//! the values into the file's BLAKE3 digest — on threads beside the
//! busy-poll thread (`--verify-threads N`, by default
//! [`default_threads`](super::chunk_pool::default_threads)).
//!
//! The caller copies each chunk once out of its peer-writable slot into a
//! buffer of the pool ([`VerifierPool::try_buffer`]) and submits it; the
//! pool hashes and writes that private copy, so what is stored is exactly
//! what was checked. Memory is bounded by the buffers made up front: when
//! all are busy, `try_buffer` says so (back-pressure: hold the slot's
//! credit) and nothing is allocated per chunk. Writes are `pwrite`s at the
//! chunk's offset, so the order the threads finish in does not matter.
//!
//! The first failure — a chunk that does not match its value, a write
//! error — stops the pool: later jobs are dropped unprocessed, `submit`
//! and `try_buffer` return that error, and [`VerifierPool::finish`] joins
//! the threads and returns it, naming the chunk.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::chunk_pool::{
    BoundedQueue, BufferPool, ChunkBuffer, PipelineError, PoolSize, Serve, Workers,
};
use super::digest::{ChainingValue, ChunkGeometry, FileDigest};

/// Chunk values the digest has room for ahead of the next one in order.
/// Threads finish out of order, and one that stalls (descheduled, say)
/// lets the others run ahead: their values wait in the digest's queue.
/// Reserving 4096 entries (132 KiB; 1 GiB of data at 256 KiB a chunk) up
/// front means only a longer stall makes the queue grow, once.
const REORDER_RESERVE: usize = 4096;

/// Checks, writes and digests one file's chunks on a pool of threads.
pub struct VerifierPool {
    shared: Arc<Shared>,
    buffers: BufferPool,
    workers: Workers,
}

struct Job {
    index: u64,
    expected: ChainingValue,
    chunk: ChunkBuffer,
}

struct Shared {
    file: Arc<File>,
    geometry: ChunkGeometry,
    /// Chunks submitted and not yet taken by a thread.
    jobs: BoundedQueue<Job>,
    digest: Mutex<FileDigest>,
    failed: AtomicBool,
    first_error: Mutex<Option<PipelineError>>,
}

impl VerifierPool {
    /// A pool writing into `file` (opened for writing; the caller keeps it
    /// to sync and link it afterwards) the chunks of a file laid out by
    /// `geometry`, on `size.threads` threads with `size.buffers` chunk
    /// buffers ([`PoolSize::with_threads`] keeps every thread busy while
    /// the caller fills the next buffer).
    pub fn new(
        file: Arc<File>,
        geometry: ChunkGeometry,
        size: PoolSize,
    ) -> Result<Self, PipelineError> {
        let shared = Arc::new(Shared {
            file,
            geometry,
            // Every job holds one of the pool's buffers: room for all.
            jobs: BoundedQueue::new(size.buffers),
            digest: Mutex::new(FileDigest::new(geometry, REORDER_RESERVE)),
            failed: AtomicBool::new(false),
            first_error: Mutex::new(None),
        });
        Ok(Self {
            buffers: BufferPool::for_chunks(size.buffers, &geometry)?,
            workers: Workers::start("filexfer-verify", size.threads, &shared)?,
            shared,
        })
    }

    /// The layout of the file being received.
    pub fn geometry(&self) -> &ChunkGeometry {
        &self.shared.geometry
    }

    /// A free buffer to copy the next chunk into, `Ok(None)` when all are
    /// busy (back-pressure), or the error that stopped the pool. Never
    /// blocks and never allocates: for the busy-poll thread.
    pub fn try_buffer(&self) -> Result<Option<ChunkBuffer>, PipelineError> {
        self.shared.check()?;
        Ok(self.buffers.try_take())
    }

    /// A free buffer, waiting up to `timeout` for a thread to give one
    /// back if all are busy, or the error that stopped the pool. A buffer
    /// that does not come back in time (a write that hangs) is an error,
    /// never a wait without end.
    pub fn buffer(&self, timeout: Duration) -> Result<ChunkBuffer, PipelineError> {
        self.shared.check()?;
        // The pool's buffers always come back (a stopped pool drops its
        // jobs), and `buffers` is never closed.
        let buffer = self
            .buffers
            .take_within(timeout)
            .map_err(|_| PipelineError::Stalled(timeout))?
            .ok_or(PipelineError::Closed)?;
        self.shared.check()?;
        Ok(buffer)
    }

    /// Hands chunk `index`, held by `chunk` and sent with the value
    /// `expected`, to a thread that checks it, writes it at its offset and
    /// records its value. Returns at once: a bad length or index is an
    /// error here, a mismatch or a write error stops the pool and comes
    /// back from a later call and from [`finish`](Self::finish).
    pub fn submit(
        &self,
        index: u64,
        expected: ChainingValue,
        chunk: ChunkBuffer,
    ) -> Result<(), PipelineError> {
        self.shared.check()?;
        self.shared
            .geometry
            .sized_chunk_range(index, chunk.bytes().len())?;
        let job = Job {
            index,
            expected,
            chunk,
        };
        // Every job holds one of the pool's buffers and the queue has room
        // for all of them.
        self.shared
            .jobs
            .push(job)
            .map_err(|_| PipelineError::Closed)
    }

    /// Waits for every submitted chunk, joins the threads, and returns the
    /// file's BLAKE3 hash — or the first error, which names its chunk.
    /// A file with chunks never submitted is a
    /// [`DigestError::Missing`](super::digest::DigestError::Missing) error.
    pub fn finish(mut self) -> Result<blake3::Hash, PipelineError> {
        // Closing the queue lets the threads drain it before they return.
        if !self.workers.join() {
            self.shared.fail(PipelineError::WorkerPanicked);
        }
        self.shared.check()?;
        let digest = self
            .shared
            .digest
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(digest.finish()?)
    }
}

impl Drop for VerifierPool {
    /// An abandoned transfer: the queued chunks are dropped unprocessed, and
    /// the threads exit and are joined (by `Workers`). The caller removes
    /// the partial file.
    fn drop(&mut self) {
        self.shared.failed.store(true, Ordering::Release);
    }
}

impl Serve for Shared {
    /// Jobs until the queue is closed and empty.
    fn serve(&self) {
        while let Some(job) = self.jobs.pop() {
            if self.failed.load(Ordering::Acquire) {
                // Stopped: the chunk is dropped, its buffer goes back.
                continue;
            }
            let checked = std::panic::catch_unwind(AssertUnwindSafe(|| self.verify(&job)));
            match checked {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.fail(e),
                Err(_) => self.fail(PipelineError::WorkerPanicked),
            }
        }
    }

    fn stop(&self) {
        self.jobs.close();
    }
}

impl Shared {
    /// Checks one chunk, writes it, records its value.
    fn verify(&self, job: &Job) -> Result<(), PipelineError> {
        let bytes = job.chunk.bytes();
        let cv = self.geometry.check_chunk(job.index, bytes, &job.expected)?;
        let offset = self.geometry.chunk_range(job.index)?.start;
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| PipelineError::Write {
                index: job.index,
                offset,
                source: Arc::new(e),
            })?;
        self.digest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(job.index, cv)?;
        Ok(())
    }

    /// Records `error` if it is the first.
    fn fail(&self, error: PipelineError) {
        let mut first = self
            .first_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first.get_or_insert(error);
        self.failed.store(true, Ordering::Release);
    }

    fn error(&self) -> Option<PipelineError> {
        self.first_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The error that stopped the pool, if one did.
    fn check(&self) -> Result<(), PipelineError> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(self.error().unwrap_or(PipelineError::Closed))
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;

    use rand::seq::SliceRandom;
    use rand::SeedableRng;

    use super::*;

    fn size(threads: usize, buffers: usize) -> PoolSize {
        PoolSize { threads, buffers }
    }

    /// How long a test waits for a buffer: never reached when all is well.
    const WAIT: Duration = Duration::from_secs(60);
    use crate::filexfer::chunk_pool::test_support::{
        digest_error, seeded_bytes, ScratchFile, POOL_EDGE_SIZES,
    };
    use crate::filexfer::digest::{DigestError, CHUNK_LEN};

    fn writable(scratch: &ScratchFile) -> Arc<File> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(scratch.path())
            .unwrap();
        Arc::new(file)
    }

    fn chunk_of<'a>(geometry: &ChunkGeometry, data: &'a [u8], index: u64) -> &'a [u8] {
        let range = geometry.chunk_range(index).unwrap();
        &data[range.start as usize..range.end as usize]
    }

    /// Submits chunks `order` of `data` as a sender would send them, each
    /// with its true value, except that the bytes of chunk `corrupt` (if
    /// any) get a flipped byte after their value was computed.
    fn submit_all(
        pool: &VerifierPool,
        data: &[u8],
        order: &[u64],
        corrupt: Option<u64>,
    ) -> Result<(), PipelineError> {
        let geometry = *pool.geometry();
        for &index in order {
            let bytes = chunk_of(&geometry, data, index);
            let cv = geometry.chunk_cv(index, bytes).unwrap();
            let mut buffer = pool.buffer(WAIT)?;
            buffer.copy_from(bytes)?;
            if corrupt == Some(index) {
                let copy = buffer.bytes_mut(bytes.len())?;
                copy[bytes.len() / 3] ^= 0x40;
            }
            pool.submit(index, cv, buffer)?;
        }
        Ok(())
    }

    /// Receives `len` bytes in chunks of `chunk_len` on `threads` threads,
    /// submitted in a shuffled order, and checks the file and the digest.
    fn receive_and_check(len: u64, chunk_len: u64, threads: usize, buffers: usize) {
        let scratch = ScratchFile::new("receive");
        let file = writable(&scratch);
        let geometry = ChunkGeometry::new(len, chunk_len).unwrap();
        let data = seeded_bytes(len, len ^ chunk_len);
        let mut order: Vec<u64> = (0..geometry.chunk_count()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(len));
        let pool = VerifierPool::new(file, geometry, size(threads, buffers)).unwrap();
        submit_all(&pool, &data, &order, None).unwrap();
        let digest = pool.finish().unwrap();
        assert_eq!(digest, blake3::hash(&data), "{len} bytes");
        let written = std::fs::read(scratch.path()).unwrap();
        assert!(written == data, "{len} bytes: the file differs");
    }

    #[test]
    fn every_chunk_is_written_and_the_digest_is_blake3() {
        for len in POOL_EDGE_SIZES {
            receive_and_check(len, CHUNK_LEN, 2, 4);
        }
    }

    #[test]
    fn many_small_chunks_finishing_out_of_order_make_the_same_file() {
        receive_and_check(300 * 1024 + 77, 1024, 3, 7);
        receive_and_check(64 * 4096, 4096, 1, 1);
    }

    #[test]
    fn a_full_pool_pushes_back_instead_of_allocating() {
        let scratch = ScratchFile::new("backpressure");
        let geometry = ChunkGeometry::new(8 * 1024, 1024).unwrap();
        let pool = VerifierPool::new(writable(&scratch), geometry, size(1, 2)).unwrap();
        let a = pool.try_buffer().unwrap().expect("free");
        let b = pool.try_buffer().unwrap().expect("free");
        assert!(pool.try_buffer().unwrap().is_none(), "both buffers in use");
        drop(a);
        assert!(pool.try_buffer().unwrap().is_some());
        drop(b);
    }

    #[test]
    fn a_corrupted_chunk_is_named_not_written_and_stops_the_pool() {
        let scratch = ScratchFile::new("mismatch");
        let len = 5 * CHUNK_LEN + 1;
        let geometry = ChunkGeometry::v3(len);
        let data = seeded_bytes(len, 5);
        let pool = VerifierPool::new(writable(&scratch), geometry, size(2, 3)).unwrap();
        let order: Vec<u64> = (0..geometry.chunk_count()).collect();
        // The later chunks may or may not be processed; never past the error.
        let _ = submit_all(&pool, &data, &order, Some(3));
        assert_eq!(
            digest_error(pool.finish().unwrap_err()),
            DigestError::Mismatch { index: 3 }
        );
        let written = std::fs::read(scratch.path()).unwrap();
        let range = geometry.chunk_range(3).unwrap();
        let kept = written.get(range.start as usize..range.end as usize);
        let untouched = match kept {
            Some(bytes) => bytes.iter().all(|&b| b == 0),
            None => true,
        };
        assert!(untouched, "the corrupted chunk reached the file");
    }

    #[test]
    fn after_a_failure_the_pool_refuses_more_chunks() {
        let scratch = ScratchFile::new("refuse");
        let geometry = ChunkGeometry::new(4 * 1024, 1024).unwrap();
        let data = seeded_bytes(4 * 1024, 9);
        // One buffer: asking for the next waits for the failed chunk's.
        let pool = VerifierPool::new(writable(&scratch), geometry, size(1, 1)).unwrap();
        submit_all(&pool, &data, &[0], Some(0)).unwrap();
        assert_eq!(
            digest_error(pool.buffer(WAIT).unwrap_err()),
            DigestError::Mismatch { index: 0 }
        );
        assert!(pool.try_buffer().is_err());
        assert!(pool.finish().is_err());
    }

    #[test]
    fn a_write_error_names_the_chunk_and_its_offset() {
        let scratch = ScratchFile::new("readonly");
        std::fs::write(scratch.path(), b"").unwrap();
        let read_only = Arc::new(File::open(scratch.path()).unwrap());
        let geometry = ChunkGeometry::new(3 * 1024, 1024).unwrap();
        let data = seeded_bytes(3 * 1024, 1);
        let pool = VerifierPool::new(read_only, geometry, size(1, 1)).unwrap();
        let _ = submit_all(&pool, &data, &[1, 0, 2], None);
        match pool.finish().unwrap_err() {
            PipelineError::Write {
                index: 1,
                offset: 1024,
                source,
            } => assert_eq!(source.raw_os_error(), Some(9), "EBADF: {source}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(scratch.path()).unwrap(), b"");
    }

    #[test]
    fn bad_submissions_are_refused_and_missing_chunks_reported() {
        let scratch = ScratchFile::new("bad");
        let geometry = ChunkGeometry::new(2 * 1024 + 10, 1024).unwrap();
        let data = seeded_bytes(2 * 1024 + 10, 2);
        let pool = VerifierPool::new(writable(&scratch), geometry, size(2, 2)).unwrap();
        let mut buffer = pool.buffer(WAIT).unwrap();
        buffer.copy_from(&data[..1024]).unwrap();
        assert_eq!(
            digest_error(pool.submit(2, [0; 32], buffer).unwrap_err()),
            DigestError::WrongLength {
                index: 2,
                got: 1024,
                expected: 10
            }
        );
        let buffer = pool.buffer(WAIT).unwrap();
        assert_eq!(
            digest_error(pool.submit(3, [0; 32], buffer).unwrap_err()),
            DigestError::OutOfRange { index: 3, count: 3 }
        );
        // Refused input does not stop the pool.
        submit_all(&pool, &data, &[2, 0], None).unwrap();
        assert_eq!(
            digest_error(pool.finish().unwrap_err()),
            DigestError::Missing {
                first: 1,
                missing: 1,
                count: 3
            }
        );
        assert!(matches!(
            VerifierPool::new(writable(&ScratchFile::new("none")), geometry, size(0, 1)),
            Err(PipelineError::Empty("thread"))
        ));
    }

    #[test]
    fn a_dropped_pool_joins_its_threads() {
        let scratch = ScratchFile::new("drop");
        let geometry = ChunkGeometry::new(16 * 1024, 1024).unwrap();
        let data = seeded_bytes(16 * 1024, 4);
        let file = writable(&scratch);
        let pool = VerifierPool::new(Arc::clone(&file), geometry, size(2, 4)).unwrap();
        submit_all(&pool, &data, &[0, 1, 2, 3, 4, 5], None).unwrap();
        assert!(Arc::strong_count(&file) > 1);
        drop(pool);
        // The threads are gone with their share of the file.
        assert_eq!(Arc::strong_count(&file), 1);
    }

    /// Buffers that never come back — held by jobs whose writes hang —
    /// make the next `buffer` an error once its timeout ran out, not a
    /// wait without end.
    #[test]
    fn a_buffer_that_never_comes_back_is_an_error_after_the_timeout() {
        let scratch = ScratchFile::new("stalled");
        let geometry = ChunkGeometry::new(4 * 1024, 1024).unwrap();
        let pool = VerifierPool::new(writable(&scratch), geometry, size(1, 2)).unwrap();
        let mut held = Some([pool.buffer(WAIT).unwrap(), pool.buffer(WAIT).unwrap()]);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| tx.send(pool.buffer(Duration::from_millis(50)).map(|_| ())));
            match rx.recv_timeout(WAIT) {
                Ok(got) => assert!(
                    matches!(got, Err(PipelineError::Stalled(t)) if t == Duration::from_millis(50)),
                    "{got:?}"
                ),
                Err(_) => {
                    // Let the stuck call return so the test can end.
                    held.take();
                    panic!("buffer() was still waiting after {WAIT:?}");
                }
            }
        });
        let err = pool.buffer(Duration::ZERO).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no chunk buffer came back within 0ns (--timeout): writing the file is stuck"
        );
        assert!(held.is_some(), "both buffers were held throughout");
    }
}
