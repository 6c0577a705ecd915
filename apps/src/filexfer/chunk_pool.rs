//! What protocol v3's hashing pools ([`super::verify`], [`super::read_ahead`])
//! share: a fixed set of chunk buffers allocated once and recycled
//! ([`BufferPool`], [`ChunkBuffer`]), their size ([`PoolSize`],
//! [`default_threads`]), their error type ([`PipelineError`]), and inside
//! the crate the bounded queue and the thread set both are built on.
//!
//! The buffers are the private memory a chunk is copied into before it is
//! hashed (and, on the receiver, written): the bytes checked are the bytes
//! kept. A pool's memory is bounded by its buffer count, and neither taking
//! nor returning a buffer allocates, so a busy-poll thread can take one per
//! chunk. Their pages are touched when the pool is made, so the data path
//! takes no page faults either.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::digest::{ChunkGeometry, DigestError};

/// Why a verifier pool or a hashing reader stopped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PipelineError {
    /// A chunk failed its check, or the chunks did not make up the file.
    #[error(transparent)]
    Digest(#[from] DigestError),
    /// Writing a checked chunk to the file failed.
    #[error("writing chunk {index} at byte {offset}")]
    Write {
        index: u64,
        offset: u64,
        #[source]
        source: Arc<io::Error>,
    },
    /// Reading a chunk from the file failed.
    #[error("reading chunk {index} at byte {offset} (did the file change?)")]
    Read {
        index: u64,
        offset: u64,
        #[source]
        source: Arc<io::Error>,
    },
    /// More bytes than a buffer holds.
    #[error("{len} bytes do not fit a {capacity}-byte chunk buffer")]
    TooLong { len: usize, capacity: usize },
    /// A pool needs at least one thread and one buffer.
    #[error("a hashing pool needs at least one {0}")]
    Empty(&'static str),
    /// The system would not start a thread.
    #[error("starting a hashing thread")]
    Spawn(#[source] Arc<io::Error>),
    /// A hashing thread panicked (a bug): its chunk was not checked.
    #[error("a hashing thread panicked")]
    WorkerPanicked,
    /// The pool was shut down.
    #[error("the hashing pool was shut down")]
    Closed,
    /// No buffer came back in time: the threads holding them are stuck
    /// (a write to the file that does not return, say).
    #[error("no chunk buffer came back within {0:?} (--timeout): writing the file is stuck")]
    Stalled(Duration),
}

/// A wait that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

/// A FIFO queue of at most `capacity` items whose room is allocated up
/// front, so neither pushing nor popping allocates; [`pop`](Self::pop)
/// waits for an item. std's futex-based lock and condition variable keep
/// it free of lazily allocated per-thread state, so the first wait of a
/// thread does not allocate either.
pub(crate) struct BoundedQueue<T> {
    state: Mutex<QueueState<T>>,
    pushed: Condvar,
}

struct QueueState<T> {
    items: VecDeque<T>,
    capacity: usize,
    closed: bool,
}

impl<T> BoundedQueue<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self::filled(VecDeque::with_capacity(capacity), capacity)
    }

    /// A queue holding `items`, with room for `capacity` in all.
    fn filled(items: VecDeque<T>, capacity: usize) -> Self {
        Self {
            state: Mutex::new(QueueState {
                items,
                capacity,
                closed: false,
            }),
            pushed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        // The lock guards no invariant a panic could break halfway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `item`, or gives it back if the queue is full.
    pub(crate) fn push(&self, item: T) -> Result<(), T> {
        let mut state = self.lock();
        if state.items.len() == state.capacity {
            return Err(item);
        }
        state.items.push_back(item);
        drop(state);
        self.pushed.notify_one();
        Ok(())
    }

    /// The oldest item, if there is one.
    pub(crate) fn try_pop(&self) -> Option<T> {
        self.lock().items.pop_front()
    }

    /// The oldest item, waiting for one to be pushed; `None` once the
    /// queue is closed and empty.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut state = self.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                return Some(item);
            }
            if state.closed {
                return None;
            }
            state = self
                .pushed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// As [`pop`](Self::pop), but waiting only until `deadline`.
    pub(crate) fn pop_until(&self, deadline: Instant) -> Result<Option<T>, TimedOut> {
        let mut state = self.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                return Ok(Some(item));
            }
            if state.closed {
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TimedOut);
            }
            state = self
                .pushed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Wakes every waiting [`pop`](Self::pop): those that find the queue
    /// empty, now or later, return `None`.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.pushed.notify_all();
    }
}

/// The memory a chunk buffer is made of: plain memory of this process
/// (`Box<[u8]>`, the default), or registered memory the NIC sends from
/// ([`pinpoll::MemoryRegion`], the sender's: read into, hashed and sent
/// with no copy).
pub trait BufferMemory: Send + 'static {
    fn as_bytes(&self) -> &[u8];
    fn as_bytes_mut(&mut self) -> &mut [u8];
}

impl BufferMemory for Box<[u8]> {
    fn as_bytes(&self) -> &[u8] {
        self
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl BufferMemory for pinpoll::MemoryRegion {
    fn as_bytes(&self) -> &[u8] {
        self.as_slice()
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// A fixed number of equal buffers, handed out as [`ChunkBuffer`]s that
/// come back when dropped (or, once taken out with
/// [`ChunkBuffer::into_memory`], by [`put_back`](Self::put_back)).
pub struct BufferPool<M = Box<[u8]>> {
    free: Arc<BoundedQueue<M>>,
    buffer_len: usize,
    count: usize,
}

impl<M> Clone for BufferPool<M> {
    fn clone(&self) -> Self {
        Self {
            free: Arc::clone(&self.free),
            buffer_len: self.buffer_len,
            count: self.count,
        }
    }
}

impl BufferPool {
    /// `count` buffers, each the size of the largest chunk of the file
    /// laid out by `geometry` (one byte for an empty file: its pool is
    /// never used, but exists like any other).
    pub fn for_chunks(count: usize, geometry: &ChunkGeometry) -> Result<Self, PipelineError> {
        Self::new(count, largest_chunk(geometry))
    }

    /// `count` buffers of `buffer_len` bytes each.
    pub fn new(count: usize, buffer_len: usize) -> Result<Self, PipelineError> {
        // Filled with a non-zero byte so that every page is written, hence
        // mapped, now rather than on the first chunk.
        Self::from_memory(
            (0..count)
                .map(|_| vec![0xa5; buffer_len].into_boxed_slice())
                .collect(),
        )
    }
}

/// The bytes of the largest chunk of the file `geometry` lays out (at
/// least one).
pub fn largest_chunk(geometry: &ChunkGeometry) -> usize {
    geometry.chunk_len().min(geometry.file_len().max(1)) as usize
}

impl<M: BufferMemory> BufferPool<M> {
    /// A pool of these buffers, all free; the shortest sets the length
    /// every buffer is used to.
    pub fn from_memory(buffers: Vec<M>) -> Result<Self, PipelineError> {
        let count = buffers.len();
        let Some(buffer_len) = buffers.iter().map(|b| b.as_bytes().len()).min() else {
            return Err(PipelineError::Empty("buffer"));
        };
        Ok(Self {
            free: Arc::new(BoundedQueue::filled(buffers.into(), count)),
            buffer_len,
            count,
        })
    }

    /// How many buffers the pool has, free or not.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The bytes each buffer holds.
    pub fn buffer_len(&self) -> usize {
        self.buffer_len
    }

    /// A free buffer, or `None` if all are in use.
    pub fn try_take(&self) -> Option<ChunkBuffer<M>> {
        self.free.try_pop().map(|memory| self.wrap(memory))
    }

    /// A free buffer, waiting for one to come back if all are in use;
    /// `None` if the pool is closed and none is free.
    pub fn take(&self) -> Option<ChunkBuffer<M>> {
        self.free.pop().map(|memory| self.wrap(memory))
    }

    /// As [`take`](Self::take), but waiting at most `timeout`.
    pub fn take_within(&self, timeout: Duration) -> Result<Option<ChunkBuffer<M>>, TimedOut> {
        let deadline = Instant::now().checked_add(timeout);
        let popped = match deadline {
            Some(deadline) => self.free.pop_until(deadline)?,
            None => self.free.pop(),
        };
        Ok(popped.map(|memory| self.wrap(memory)))
    }

    /// Returns a buffer's memory that [`ChunkBuffer::into_memory`] took
    /// out (e.g. after the NIC sent from it).
    pub fn put_back(&self, memory: M) {
        // The queue has room for every buffer of the pool, so this fits.
        let _ = self.free.push(memory);
    }

    /// Wakes every [`take`](Self::take) waiting for a buffer, and makes it
    /// and every later one that finds none free return `None`.
    pub fn close(&self) {
        self.free.close();
    }

    fn wrap(&self, memory: M) -> ChunkBuffer<M> {
        ChunkBuffer {
            memory: Some(memory),
            len: 0,
            capacity: self.buffer_len,
            home: Arc::clone(&self.free),
        }
    }
}

/// One buffer of a [`BufferPool`] holding one chunk's bytes; it goes back
/// to its pool when dropped.
pub struct ChunkBuffer<M = Box<[u8]>> {
    /// `None` only once [`into_memory`](Self::into_memory) took it.
    memory: Option<M>,
    len: usize,
    capacity: usize,
    home: Arc<BoundedQueue<M>>,
}

impl<M: BufferMemory> ChunkBuffer<M> {
    /// The most bytes this buffer holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn memory(&self) -> &[u8] {
        self.memory
            .as_ref()
            .map_or(&[], |m| &m.as_bytes()[..self.capacity])
    }

    fn memory_mut(&mut self) -> &mut [u8] {
        let capacity = self.capacity;
        self.memory
            .as_mut()
            .map_or(&mut [], |m| &mut m.as_bytes_mut()[..capacity])
    }

    /// The chunk's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.memory()[..self.len]
    }

    /// The chunk's bytes and the `extra` bytes after them, if the buffer
    /// holds that many.
    pub fn bytes_and_next(&self, extra: usize) -> Option<&[u8]> {
        self.memory().get(..self.len + extra)
    }

    /// Makes the buffer hold `len` bytes and returns them to be filled
    /// (with whatever they held before: nothing is zeroed).
    pub fn bytes_mut(&mut self, len: usize) -> Result<&mut [u8], PipelineError> {
        let capacity = self.capacity();
        if len > capacity {
            return Err(PipelineError::TooLong { len, capacity });
        }
        self.len = len;
        Ok(&mut self.memory_mut()[..len])
    }

    /// The buffer's bytes after the chunk's, to be filled.
    pub fn after_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.memory_mut()[len..]
    }

    /// Makes the buffer hold a copy of `src`.
    pub fn copy_from(&mut self, src: &[u8]) -> Result<(), PipelineError> {
        self.bytes_mut(src.len())?.copy_from_slice(src);
        Ok(())
    }

    /// The buffer's memory, out of the pool's hands until
    /// [`BufferPool::put_back`] returns it (if never, the pool has one
    /// buffer fewer).
    pub fn into_memory(mut self) -> M {
        self.memory
            .take()
            .expect("a ChunkBuffer holds its memory until this")
    }
}

impl<M> Drop for ChunkBuffer<M> {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            // The queue has room for every buffer of the pool, so this fits.
            let _ = self.home.push(memory);
        }
    }
}

impl<M: BufferMemory> std::fmt::Debug for ChunkBuffer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkBuffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// How many threads a hashing pool runs, and how many chunk buffers it
/// has: the bound on its memory (`buffers × chunk length`) and on the
/// chunks in its hands at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSize {
    pub threads: usize,
    pub buffers: usize,
}

impl PoolSize {
    /// `threads` threads and two buffers each: one being hashed while the
    /// busy-poll thread fills the other.
    pub fn with_threads(threads: usize) -> Self {
        Self {
            threads,
            buffers: 2 * threads,
        }
    }
}

/// What the threads of a hashing pool share: how each thread serves it,
/// and how they are all told to stop.
pub(crate) trait Serve: Send + Sync + 'static {
    /// A thread's life: returns once the pool is done or stopped.
    fn serve(&self);
    /// Makes every [`serve`](Self::serve) return soon.
    fn stop(&self);
}

/// The threads of a hashing pool, each serving one shared state; stopped
/// and joined when dropped, so no thread outlives its pool.
pub(crate) struct Workers {
    handles: Vec<JoinHandle<()>>,
    shared: Arc<dyn Serve>,
}

impl Workers {
    /// Starts `threads` threads named `{name}-{n}` serving `shared`. If one
    /// fails to start, those already running are stopped and joined.
    pub(crate) fn start<S: Serve>(
        name: &str,
        threads: usize,
        shared: &Arc<S>,
    ) -> Result<Self, PipelineError> {
        if threads == 0 {
            return Err(PipelineError::Empty("thread"));
        }
        let mut workers = Self {
            handles: Vec::with_capacity(threads),
            shared: Arc::clone(shared) as Arc<dyn Serve>,
        };
        let (started, running) = std::sync::mpsc::channel();
        for n in 0..threads {
            let shared = Arc::clone(shared);
            let started = started.clone();
            let handle = std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || {
                    let _ = started.send(());
                    shared.serve()
                })
                .map_err(|e| PipelineError::Spawn(Arc::new(e)))?;
            workers.handles.push(handle);
        }
        // A thread allocates as it starts (its handle, its thread-locals):
        // waiting for every one to run keeps that out of the data path.
        // Only the threads hold senders now: one that died unannounced
        // makes this an error, not a wait forever.
        drop(started);
        for _ in 0..threads {
            running.recv().map_err(|_| PipelineError::WorkerPanicked)?;
        }
        Ok(workers)
    }

    /// Stops the threads and joins them; `false` if one had panicked.
    pub(crate) fn join(&mut self) -> bool {
        self.shared.stop();
        // Every thread is joined, whether or not an earlier one panicked.
        let mut clean = true;
        for handle in self.handles.drain(..) {
            clean &= handle.join().is_ok();
        }
        clean
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.join();
    }
}

/// The hashing threads a host can spare beside the busy-poll thread: all
/// cores but one, and at least one.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_bounded_and_come_back_when_dropped() {
        let pool = BufferPool::new(2, 4096).unwrap();
        let mut a = pool.try_take().expect("first");
        let b = pool.try_take().expect("second");
        assert!(pool.try_take().is_none(), "only two buffers");
        a.copy_from(b"chunk bytes").unwrap();
        assert_eq!(a.bytes(), b"chunk bytes");
        assert_eq!(a.bytes_mut(4096).unwrap().len(), 4096);
        assert!(matches!(
            a.bytes_mut(4097),
            Err(PipelineError::TooLong {
                len: 4097,
                capacity: 4096
            })
        ));
        assert_eq!(a.bytes().len(), 4096, "a refused length changes nothing");
        drop(b);
        let c = pool.take().expect("the dropped one is back");
        assert_eq!(c.capacity(), 4096);
        assert!(matches!(
            BufferPool::new(0, 1),
            Err(PipelineError::Empty(_))
        ));
    }

    #[test]
    fn a_waiting_take_gets_the_next_returned_buffer_or_none_on_close() {
        let pool = BufferPool::new(1, 16).unwrap();
        let held = pool.take().unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| pool.take().map(|b| b.capacity()));
            drop(held);
            assert_eq!(waiter.join().unwrap(), Some(16));
            let held = pool.take().unwrap();
            let waiter = s.spawn(|| pool.take().is_none());
            pool.close();
            assert!(waiter.join().unwrap(), "close wakes the waiter with None");
            drop(held);
        });
        // Closing stops the waiting, not the buffers coming back.
        assert_eq!(pool.take().map(|b| b.capacity()), Some(16));
    }
}

/// Files and data for the tests of the hashing pools.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};

    use rand::{Rng, SeedableRng};

    use super::PipelineError;
    use crate::filexfer::digest::{DigestError, CHUNK_LEN};

    /// File sizes at the edges of protocol v3's chunk: none, one short
    /// chunk, one full chunk, a byte more, and many with a short tail.
    pub const POOL_EDGE_SIZES: [u64; 6] = [
        0,
        1,
        CHUNK_LEN - 1,
        CHUNK_LEN,
        CHUNK_LEN + 1,
        7 * CHUNK_LEN + 12345,
    ];

    /// The chunk or file error inside `err`, which must be one.
    pub fn digest_error(err: PipelineError) -> DigestError {
        match err {
            PipelineError::Digest(e) => e,
            other => panic!("not a digest error: {other:?}"),
        }
    }

    /// `len` seeded pseudo-random bytes: different at every position and
    /// for every seed.
    pub fn seeded_bytes(len: u64, seed: u64) -> Vec<u8> {
        let mut bytes = vec![0; len as usize];
        rand::rngs::StdRng::seed_from_u64(seed).fill(&mut bytes[..]);
        bytes
    }

    /// A path under the temp dir that nothing else uses; the file is
    /// removed on drop.
    pub struct ScratchFile(PathBuf);

    impl ScratchFile {
        pub fn new(tag: &str) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = format!("pinpoll-pool-{}-{tag}-{n}", std::process::id());
            let path = std::env::temp_dir().join(name);
            let _ = std::fs::remove_file(&path);
            Self(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for ScratchFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
