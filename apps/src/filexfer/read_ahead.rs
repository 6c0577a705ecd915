//! The sender's side of protocol v3: reads a file's chunks with `pread` on
//! a pool of threads, ahead of the sender, each into a private buffer
//! together with its chaining value, and hands them out in index order —
//! every chunk, or with `--streams N` those of one [`Lane`]: chunks
//! `lane, lane + N, lane + 2N, ...`.
//!
//! Each buffer holds a chunk's bytes with its value right after them, the
//! layout of a slot on the wire; the sender's buffers are registered
//! memory ([`pinpoll::MemoryRegion`]) that it sends from as they are, no
//! copy, and puts back once the NIC is done with them. The value is
//! computed from the same buffer the bytes are sent from, so a file that
//! changes while it is sent gives chunks that match their values (and a
//! digest of what was sent), never a value of bytes that were not sent.
//! The sender merges the values it was handed into the file's digest
//! ([`FileDigest`](super::digest::FileDigest)) for the `Finish` message.
//!
//! The look-ahead is bounded by the buffers: a thread reads chunk `i` only
//! once it holds a free buffer, and buffers come back as the sender drops
//! the chunks it was handed.

use std::fs::File;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::chunk_pool::{
    largest_chunk, BufferMemory, BufferPool, ChunkBuffer, PipelineError, PoolSize, Serve, Workers,
};
use super::digest::{ChainingValue, ChunkGeometry};
/// The bytes of a chunk's value, which follow its bytes in a buffer as in
/// a slot.
use super::TRAILER as VALUE_LEN;

/// Which chunks a reader reads: every `count`-th, from chunk `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    pub index: u64,
    pub count: u64,
}

impl Lane {
    /// Every chunk.
    pub const ALL: Lane = Lane { index: 0, count: 1 };

    /// The `position`-th chunk of this lane (counted from 0).
    pub fn chunk(&self, position: u64) -> u64 {
        self.index + position * self.count
    }

    /// How many of `chunks` chunks this lane has.
    pub fn len(&self, chunks: u64) -> u64 {
        chunks.saturating_sub(self.index).div_ceil(self.count)
    }
}

/// Reads, hashes and hands out one file's chunks (or one lane's) in order.
pub struct HashingReader<M: BufferMemory = Box<[u8]>> {
    shared: Arc<Shared<M>>,
    /// Held only to be dropped with the reader: that stops and joins them.
    _workers: Workers,
    /// Handed out: the lane's chunks before this position.
    handed: u64,
}

/// A chunk handed out by [`HashingReader`]: its bytes and its value. Its
/// buffer goes back to the reader when it is dropped, which the borrow on
/// the reader enforces before the next chunk is asked for.
pub struct HashedChunk<'a, M: BufferMemory = Box<[u8]>> {
    index: u64,
    cv: ChainingValue,
    chunk: ChunkBuffer<M>,
    _reader: PhantomData<&'a mut HashingReader<M>>,
}

impl<M: BufferMemory> HashedChunk<'_, M> {
    /// The chunk's index in the file.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The chunk's value, for its notice.
    pub fn cv(&self) -> &ChainingValue {
        &self.cv
    }

    /// The chunk's bytes, exactly those hashed.
    pub fn bytes(&self) -> &[u8] {
        self.chunk.bytes()
    }

    /// The chunk's bytes with its value after them.
    pub fn bytes_and_value(&self) -> &[u8] {
        self.chunk
            .bytes_and_next(VALUE_LEN)
            .expect("a reader's buffers have room for the value")
    }

    /// The buffer holding [`bytes_and_value`](Self::bytes_and_value), out
    /// of the reader's hands until [`HashingReader::put_back`] returns it.
    pub fn into_memory(self) -> M {
        self.chunk.into_memory()
    }
}

struct Shared<M: BufferMemory> {
    file: Arc<File>,
    geometry: ChunkGeometry,
    lane: Lane,
    /// The lane's chunks.
    chunks: u64,
    buffers: BufferPool<M>,
    state: Mutex<State<M>>,
    /// Signalled whenever a chunk is done or the reader failed.
    done: Condvar,
}

struct State<M> {
    /// The lane's chunks before this position have been taken by a thread.
    next_claim: u64,
    /// `hashed[p % len]` holds the lane's chunk at position `p` once it is
    /// read and hashed. A claimed chunk holds a buffer until handed out, so
    /// chunks claimed and not yet handed out span fewer positions than
    /// there are buffers (the ring's length): they never share an entry.
    hashed: Vec<Option<(ChainingValue, ChunkBuffer<M>)>>,
    failure: Option<PipelineError>,
    stopping: bool,
}

impl HashingReader {
    /// A reader of every chunk of `file`, laid out by `geometry`, on
    /// `size.threads` threads with `size.buffers` chunk buffers: at most
    /// that many chunks are read ahead of the caller.
    pub fn new(
        file: Arc<File>,
        geometry: ChunkGeometry,
        size: PoolSize,
    ) -> Result<Self, PipelineError> {
        Self::for_lane(file, geometry, Lane::ALL, size)
    }

    /// A reader of the chunks of `lane` only (see [`new`](Self::new)).
    pub fn for_lane(
        file: Arc<File>,
        geometry: ChunkGeometry,
        lane: Lane,
        size: PoolSize,
    ) -> Result<Self, PipelineError> {
        let buffers = BufferPool::new(size.buffers, Self::buffer_len(&geometry))?;
        HashingReader::with_buffers(file, geometry, lane, size.threads, buffers)
    }
}

impl<M: BufferMemory> HashingReader<M> {
    /// The bytes a buffer needs for the largest chunk of a file laid out
    /// by `geometry` and its value.
    pub fn buffer_len(geometry: &ChunkGeometry) -> usize {
        largest_chunk(geometry) + VALUE_LEN
    }

    /// A reader of the chunks of `lane` on `threads` threads into
    /// `buffers` (each at least [`buffer_len`](Self::buffer_len) long): at
    /// most that many chunks are read ahead of the caller.
    pub fn with_buffers(
        file: Arc<File>,
        geometry: ChunkGeometry,
        lane: Lane,
        threads: usize,
        buffers: BufferPool<M>,
    ) -> Result<Self, PipelineError> {
        if lane.count == 0 || lane.index >= lane.count {
            return Err(PipelineError::Empty("lane"));
        }
        let (len, capacity) = (Self::buffer_len(&geometry), buffers.buffer_len());
        if capacity < len {
            return Err(PipelineError::TooLong { len, capacity });
        }
        let hashed = (0..buffers.count()).map(|_| None).collect();
        let shared = Arc::new(Shared {
            file,
            geometry,
            lane,
            chunks: lane.len(geometry.chunk_count()),
            buffers,
            state: Mutex::new(State {
                next_claim: 0,
                hashed,
                failure: None,
                stopping: false,
            }),
            done: Condvar::new(),
        });
        Ok(Self {
            _workers: Workers::start("filexfer-hash", threads, &shared)?,
            shared,
            handed: 0,
        })
    }

    /// The lane this reader reads.
    pub fn lane(&self) -> Lane {
        self.shared.lane
    }

    /// How many buffers the reader has, in its hands or taken out.
    pub fn buffer_count(&self) -> usize {
        self.shared.buffers.count()
    }

    /// Returns a buffer [`HashedChunk::into_memory`] took out.
    pub fn put_back(&self, memory: M) {
        self.shared.buffers.put_back(memory);
    }

    /// The layout of the file being read.
    pub fn geometry(&self) -> &ChunkGeometry {
        &self.shared.geometry
    }

    /// Whether every chunk (of the lane) has been handed out.
    pub fn is_done(&self) -> bool {
        self.handed == self.shared.chunks
    }

    /// The next chunk, waiting for it to be read and hashed; `Ok(None)`
    /// once every chunk has been handed out.
    pub fn next_chunk(&mut self) -> Result<Option<HashedChunk<'_, M>>, PipelineError> {
        self.hand_out(true)
    }

    /// The next chunk if it is ready, `Ok(None)` if it is not yet (or
    /// every chunk has been handed out: see [`is_done`](Self::is_done)).
    /// Never blocks: for the busy-poll thread.
    pub fn try_next_chunk(&mut self) -> Result<Option<HashedChunk<'_, M>>, PipelineError> {
        self.hand_out(false)
    }

    fn hand_out(&mut self, wait: bool) -> Result<Option<HashedChunk<'_, M>>, PipelineError> {
        if self.is_done() {
            return Ok(None);
        }
        let position = self.handed;
        let (cv, chunk) = {
            let mut state = self.shared.lock();
            let entry = (position % state.hashed.len() as u64) as usize;
            loop {
                if let Some(e) = &state.failure {
                    return Err(e.clone());
                }
                if let Some(hashed) = state.hashed[entry].take() {
                    break hashed;
                }
                if !wait {
                    return Ok(None);
                }
                state = self
                    .shared
                    .done
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        self.handed += 1;
        Ok(Some(HashedChunk {
            index: self.shared.lane.chunk(position),
            cv,
            chunk,
            _reader: PhantomData,
        }))
    }
}

impl<M: BufferMemory> Serve for Shared<M> {
    /// Take a buffer, claim the next chunk, read and hash it, until the
    /// file is read, the reader fails or stops.
    fn serve(&self) {
        while let Some(mut chunk) = self.buffers.take() {
            let Some(position) = self.claim() else { return };
            let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.read_and_hash(self.lane.chunk(position), &mut chunk)
            }));
            let mut state = self.lock();
            let entry = (position % state.hashed.len() as u64) as usize;
            match read {
                Ok(Ok(cv)) => state.hashed[entry] = Some((cv, chunk)),
                Ok(Err(e)) => drop(state.failure.get_or_insert(e)),
                Err(_) => drop(state.failure.get_or_insert(PipelineError::WorkerPanicked)),
            }
            drop(state);
            self.done.notify_all();
        }
    }

    /// Threads reading a chunk finish it; the others return at once.
    fn stop(&self) {
        self.lock().stopping = true;
        self.buffers.close();
    }
}

impl<M: BufferMemory> Shared<M> {
    fn lock(&self) -> MutexGuard<'_, State<M>> {
        // A panic is caught before it could leave the state half-changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The position of the lane's next chunk no thread has taken, unless
    /// there is none or the reader failed or stopped.
    fn claim(&self) -> Option<u64> {
        let mut state = self.lock();
        if state.stopping || state.failure.is_some() || state.next_claim == self.chunks {
            return None;
        }
        state.next_claim += 1;
        Some(state.next_claim - 1)
    }

    /// Reads chunk `index` into `chunk` and puts its value after it.
    fn read_and_hash(
        &self,
        index: u64,
        chunk: &mut ChunkBuffer<M>,
    ) -> Result<ChainingValue, PipelineError> {
        let range = self.geometry.chunk_range(index)?;
        let bytes = chunk.bytes_mut((range.end - range.start) as usize)?;
        self.file
            .read_exact_at(bytes, range.start)
            .map_err(|e| PipelineError::Read {
                index,
                offset: range.start,
                source: Arc::new(e),
            })?;
        let cv = self.geometry.chunk_cv(index, chunk.bytes())?;
        chunk.after_bytes_mut()[..VALUE_LEN].copy_from_slice(&cv);
        Ok(cv)
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;

    fn size(threads: usize, buffers: usize) -> PoolSize {
        PoolSize { threads, buffers }
    }
    use crate::filexfer::chunk_pool::test_support::{seeded_bytes, ScratchFile, POOL_EDGE_SIZES};
    use crate::filexfer::digest::{FileDigest, CHUNK_LEN};
    use crate::filexfer::verify::VerifierPool;

    fn file_with(scratch: &ScratchFile, data: &[u8]) -> Arc<File> {
        std::fs::write(scratch.path(), data).unwrap();
        Arc::new(File::open(scratch.path()).unwrap())
    }

    /// Reads `len` bytes in chunks of `chunk_len` and checks every chunk,
    /// its order and value, and the digest.
    fn read_and_check(len: u64, chunk_len: u64, threads: usize, buffers: usize) {
        let scratch = ScratchFile::new("read");
        let data = seeded_bytes(len, len + chunk_len);
        let geometry = ChunkGeometry::new(len, chunk_len).unwrap();
        let mut reader =
            HashingReader::new(file_with(&scratch, &data), geometry, size(threads, buffers))
                .unwrap();
        let mut sent = Vec::with_capacity(data.len());
        let mut digest = FileDigest::new(geometry, 1);
        let mut expected_index = 0;
        while let Some(chunk) = reader.next_chunk().unwrap() {
            assert_eq!(chunk.index(), expected_index);
            let cv = geometry.chunk_cv(chunk.index(), chunk.bytes()).unwrap();
            assert_eq!(chunk.cv(), &cv, "{len}: chunk {expected_index}");
            sent.extend_from_slice(chunk.bytes());
            digest.record(chunk.index(), cv).unwrap();
            expected_index += 1;
        }
        assert_eq!(expected_index, geometry.chunk_count());
        assert!(sent == data, "{len} bytes: the chunks differ from the file");
        assert_eq!(digest.finish().unwrap(), blake3::hash(&data), "{len}");
    }

    #[test]
    fn every_chunk_comes_in_order_with_its_value_and_the_digest_is_blake3() {
        for len in POOL_EDGE_SIZES {
            read_and_check(len, CHUNK_LEN, 2, 4);
        }
        read_and_check(300 * 1024 + 5, 1024, 3, 5);
        read_and_check(40 * 2048, 2048, 1, 1);
    }

    #[test]
    fn what_the_reader_sends_the_verifier_stores() {
        let len = 6 * 4096 + 100;
        let data = seeded_bytes(len, 11);
        let (source, target) = (ScratchFile::new("source"), ScratchFile::new("target"));
        let geometry = ChunkGeometry::new(len, 4096).unwrap();
        let mut reader =
            HashingReader::new(file_with(&source, &data), geometry, size(2, 3)).unwrap();
        let written = Arc::new(File::create(target.path()).unwrap());
        let verifier = VerifierPool::new(written, geometry, size(2, 3)).unwrap();
        // A chunk is copied out of the reader's buffer as into a slot, and
        // out of the "slot" into the verifier's.
        while let Some(chunk) = reader.next_chunk().unwrap() {
            let mut copy = verifier.buffer(std::time::Duration::from_secs(60)).unwrap();
            copy.copy_from(chunk.bytes()).unwrap();
            verifier.submit(chunk.index(), *chunk.cv(), copy).unwrap();
        }
        assert_eq!(verifier.finish().unwrap(), blake3::hash(&data));
        assert!(std::fs::read(target.path()).unwrap() == data);
    }

    #[test]
    fn each_buffer_holds_its_chunk_then_its_value_and_comes_back_by_put_back() {
        let scratch = ScratchFile::new("lend");
        let data = seeded_bytes(5 * 1024 + 9, 16);
        let geometry = ChunkGeometry::new(data.len() as u64, 1024).unwrap();
        let len = HashingReader::<Box<[u8]>>::buffer_len(&geometry);
        // Two buffers, taken out of the pool in turn: the reader goes on
        // only as they are put back.
        let buffers = BufferPool::new(2, len).unwrap();
        let mut reader = HashingReader::with_buffers(
            file_with(&scratch, &data),
            geometry,
            Lane::ALL,
            1,
            buffers,
        )
        .unwrap();
        let mut lent = std::collections::VecDeque::new();
        let mut sent = Vec::new();
        while !reader.is_done() {
            if lent.len() == 2 {
                reader.put_back(lent.pop_front().unwrap());
            }
            let chunk = reader.next_chunk().unwrap().unwrap();
            let wire = chunk.bytes_and_value();
            let (bytes, value) = wire.split_at(wire.len() - VALUE_LEN);
            assert_eq!(value, chunk.cv(), "chunk {}", chunk.index());
            sent.extend_from_slice(bytes);
            lent.push_back(chunk.into_memory());
        }
        assert!(sent == data);
        // Too short for a chunk and its value: refused.
        let short = BufferPool::new(1, len - 1).unwrap();
        assert!(matches!(
            HashingReader::with_buffers(file_with(&scratch, &data), geometry, Lane::ALL, 1, short),
            Err(PipelineError::TooLong { .. })
        ));
    }

    #[test]
    fn a_busy_poller_gets_every_chunk_without_blocking() {
        let scratch = ScratchFile::new("poll");
        let data = seeded_bytes(9 * 1024 + 1, 12);
        let geometry = ChunkGeometry::new(data.len() as u64, 1024).unwrap();
        let mut reader =
            HashingReader::new(file_with(&scratch, &data), geometry, size(2, 2)).unwrap();
        let mut sent = Vec::new();
        while !reader.is_done() {
            match reader.try_next_chunk().unwrap() {
                Some(chunk) => sent.extend_from_slice(chunk.bytes()),
                None => std::thread::yield_now(),
            }
        }
        assert!(reader.try_next_chunk().unwrap().is_none());
        assert!(sent == data);
    }

    #[test]
    fn lanes_read_every_nth_chunk_in_order_and_together_the_whole_file() {
        let len = 10 * 1024 + 7;
        let data = seeded_bytes(len, 15);
        let scratch = ScratchFile::new("lanes");
        let file = file_with(&scratch, &data);
        let geometry = ChunkGeometry::new(len, 1024).unwrap();
        let mut digest = FileDigest::new(geometry, 16);
        let mut seen = vec![false; 11];
        for index in 0..3 {
            let lane = Lane { index, count: 3 };
            let mut reader =
                HashingReader::for_lane(Arc::clone(&file), geometry, lane, size(2, 3)).unwrap();
            let mut expected = index;
            while let Some(chunk) = reader.next_chunk().unwrap() {
                assert_eq!(chunk.index(), expected, "lane {index}");
                let range = geometry.chunk_range(expected).unwrap();
                assert!(chunk.bytes() == &data[range.start as usize..range.end as usize]);
                digest.record(chunk.index(), *chunk.cv()).unwrap();
                seen[expected as usize] = true;
                expected += 3;
            }
            assert_eq!(lane.len(11), (expected - index) / 3, "lane {index}");
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
        assert_eq!(digest.finish().unwrap(), blake3::hash(&data));
        // A lane past the last chunk has none; a lane that is none is refused.
        let lane = Lane { index: 3, count: 4 };
        let mut short = HashingReader::for_lane(
            Arc::clone(&file),
            ChunkGeometry::new(3 * 1024, 1024).unwrap(),
            lane,
            size(1, 1),
        )
        .unwrap();
        assert!(short.is_done() && short.next_chunk().unwrap().is_none());
        let bad = Lane { index: 2, count: 2 };
        assert!(matches!(
            HashingReader::for_lane(file, geometry, bad, size(1, 1)),
            Err(PipelineError::Empty("lane"))
        ));
    }

    #[test]
    fn a_file_shorter_than_announced_is_a_read_error_naming_the_chunk() {
        let scratch = ScratchFile::new("short");
        let data = seeded_bytes(5 * 1024, 13);
        // The sender announced 100 bytes more than the file now holds.
        let geometry = ChunkGeometry::new(5 * 1024 + 100, 1024).unwrap();
        let mut reader =
            HashingReader::new(file_with(&scratch, &data), geometry, size(2, 2)).unwrap();
        let err = loop {
            match reader.next_chunk() {
                Ok(Some(chunk)) => assert!(chunk.index() < 5),
                Ok(None) => panic!("the short chunk was handed out"),
                Err(e) => break e,
            }
        };
        match err {
            PipelineError::Read {
                index: 5,
                offset: 5120,
                source,
            } => assert_eq!(source.kind(), ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_abandoned_reader_joins_its_threads() {
        let scratch = ScratchFile::new("abandon");
        let data = seeded_bytes(64 * 1024, 14);
        let geometry = ChunkGeometry::new(data.len() as u64, 1024).unwrap();
        let file = file_with(&scratch, &data);
        let mut reader = HashingReader::new(Arc::clone(&file), geometry, size(2, 4)).unwrap();
        assert_eq!(reader.next_chunk().unwrap().map(|c| c.index()), Some(0));
        assert!(Arc::strong_count(&file) > 1);
        drop(reader);
        // The threads are gone with their share of the file.
        assert_eq!(Arc::strong_count(&file), 1);
        assert!(matches!(
            HashingReader::new(file, geometry, size(0, 1)),
            Err(PipelineError::Empty("thread"))
        ));
    }
}
