//! The file digest of protocol v3: BLAKE3 computed chunk by chunk, in any
//! order, without ever hashing a byte twice.
//!
//! A file of `S` bytes is cut into chunks of `C` bytes ([`CHUNK_LEN`], one
//! ring slot): chunk `i` covers `[i*C, min((i+1)*C, S))`. `C` is a power of
//! two and a multiple of BLAKE3's 1024-byte chunk, so every chunk starts at
//! a subtree boundary of BLAKE3's tree and, except the last, *is* a
//! complete subtree of it: its chaining value (CV) depends only on its
//! bytes and its offset ([`ChunkGeometry::chunk_cv`], through
//! [`blake3::hazmat`]). The sender puts each chunk's CV after its data in the slot (a 32-byte trailer), the
//! receiver recomputes and compares it, and [`FileDigest`] merges the CVs
//! into the root hash, which equals `blake3::hash(file)` (`b3sum FILE`).
//!
//! # Why this tree shape
//!
//! BLAKE3's tree is left-balanced: a node over `n` bytes has a left child
//! over the largest power of two strictly below `n`
//! ([`blake3::hazmat::left_subtree_len`]). Counted in chunks of `C`, the left
//! child of a node over `n >= 2` chunks holds the largest power of two
//! *strictly below* `n` chunks — never `n` itself, so a file of exactly
//! 4 chunks splits 2 + 2, and 5 chunks split 4 + 1. [`FileDigest`] builds
//! exactly that tree: it folds CVs in index order onto a stack, merging
//! the two top subtrees as soon as they form an aligned power-of-two block
//! that cannot be the root (more chunks follow), and when the last chunk
//! arrives it merges the stack from right to left, the final merge being
//! the root merge. CVs that arrive ahead of their turn wait in a queue
//! indexed by their distance from the next expected chunk; verifier threads
//! finish only slightly out of order, so that queue stays short.
//!
//! # One chunk or none
//!
//! A file of at most `C` bytes has no parent node: its root is the root
//! finalization of its only chunk, which no merge of chaining values can
//! produce. For such a file the per-chunk value is therefore defined as
//! the file's root hash itself (`blake3::hash(bytes)`): the sender puts it
//! in the notice, the receiver computes it the same way from the same
//! geometry and compares, and the digest is that value. Both sides know
//! the file size before any chunk moves, so they always agree on which
//! rule applies. An empty file has no chunks and the digest of `b""`.

use std::collections::VecDeque;
use std::ops::Range;

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};

use super::CHUNK;

/// The 32-byte value checked per chunk: a BLAKE3 chaining value, or for a
/// one-chunk file its root hash (see the [module documentation](self)).
pub type ChainingValue = blake3::hazmat::ChainingValue;

/// Bytes per chunk in protocol v3 (its chaining value follows it in the slot).
pub const CHUNK_LEN: u64 = CHUNK;

/// The largest chunk this module accepts: a chunk must fit one buffer.
pub const MAX_CHUNK_LEN: u64 = 1 << 30;

/// A chunk, a CV or a file's chunk layout that cannot be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// The chunk length is not a power of two in `1024..=MAX_CHUNK_LEN`.
    #[error("a chunk length must be a power of two from 1024 to {MAX_CHUNK_LEN} bytes, not {0}")]
    BadChunkLen(u64),
    /// The index names no chunk of the file.
    #[error("chunk {index} does not exist: the file has {count} chunks")]
    OutOfRange { index: u64, count: u64 },
    /// The bytes given for a chunk are not as long as the chunk.
    #[error("chunk {index} is {expected} bytes long, not {got}")]
    WrongLength { index: u64, got: u64, expected: u64 },
    /// The chunk's bytes do not hash to the value it was sent with.
    #[error("chunk {index} does not match its BLAKE3 chaining value (corrupted in transit or at the sender)")]
    Mismatch { index: u64 },
    /// The chunk's CV was recorded before.
    #[error("chunk {index} arrived twice")]
    Duplicate { index: u64 },
    /// The digest was asked for before every chunk's CV was recorded.
    #[error("{missing} of the file's {count} chunks never arrived (the first is chunk {first})")]
    Missing {
        first: u64,
        missing: u64,
        count: u64,
    },
}

/// How a file of `file_len` bytes is cut into chunks of `chunk_len` bytes,
/// and what each chunk's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkGeometry {
    file_len: u64,
    chunk_len: u64,
}

impl ChunkGeometry {
    /// The layout of a `file_len`-byte file in chunks of `chunk_len` bytes,
    /// which must be a power of two from 1024 to [`MAX_CHUNK_LEN`].
    pub fn new(file_len: u64, chunk_len: u64) -> Result<Self, DigestError> {
        let blake3_chunk = blake3::CHUNK_LEN as u64;
        if !chunk_len.is_power_of_two() || !(blake3_chunk..=MAX_CHUNK_LEN).contains(&chunk_len) {
            return Err(DigestError::BadChunkLen(chunk_len));
        }
        Ok(Self {
            file_len,
            chunk_len,
        })
    }

    /// Protocol v3's layout of a `file_len`-byte file: chunks of [`CHUNK_LEN`].
    pub fn v3(file_len: u64) -> Self {
        Self {
            file_len,
            chunk_len: CHUNK_LEN,
        }
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The length of every chunk but the last.
    pub fn chunk_len(&self) -> u64 {
        self.chunk_len
    }

    /// The number of chunks: none for an empty file.
    pub fn chunk_count(&self) -> u64 {
        self.file_len.div_ceil(self.chunk_len)
    }

    /// The bytes of the file that chunk `index` covers.
    pub fn chunk_range(&self, index: u64) -> Result<Range<u64>, DigestError> {
        let count = self.chunk_count();
        if index >= count {
            return Err(DigestError::OutOfRange { index, count });
        }
        let start = index * self.chunk_len;
        Ok(start..self.file_len.min(start + self.chunk_len))
    }

    /// The bytes of the file that chunk `index` covers, if it is `len`
    /// bytes long.
    pub fn sized_chunk_range(&self, index: u64, len: usize) -> Result<Range<u64>, DigestError> {
        let range = self.chunk_range(index)?;
        let expected = range.end - range.start;
        if len as u64 != expected {
            return Err(DigestError::WrongLength {
                index,
                got: len as u64,
                expected,
            });
        }
        Ok(range)
    }

    /// The value of chunk `index` whose bytes are `bytes`: its BLAKE3
    /// chaining value, or the file's root hash if it is the only chunk.
    pub fn chunk_cv(&self, index: u64, bytes: &[u8]) -> Result<ChainingValue, DigestError> {
        let range = self.sized_chunk_range(index, bytes.len())?;
        if self.chunk_count() == 1 {
            return Ok(*blake3::hash(bytes).as_bytes());
        }
        // A power-of-two multiple of 1024 at a multiple of itself: the
        // offset is chunk-aligned and the bytes fit the subtree it starts.
        Ok(blake3::Hasher::new()
            .set_input_offset(range.start)
            .update(bytes)
            .finalize_non_root())
    }

    /// Checks chunk `index` against the `expected` value it was sent with,
    /// and returns that value when it matches.
    pub fn check_chunk(
        &self,
        index: u64,
        bytes: &[u8],
        expected: &ChainingValue,
    ) -> Result<ChainingValue, DigestError> {
        let cv = self.chunk_cv(index, bytes)?;
        if cv != *expected {
            return Err(DigestError::Mismatch { index });
        }
        Ok(cv)
    }
}

/// Merges the per-chunk values of one file, recorded in any order, into the
/// file's BLAKE3 hash.
///
/// Memory: a stack of at most 64 CVs, plus one queue entry (33 bytes) per
/// chunk between the next one expected in order and the furthest one
/// recorded ahead of it. The queue keeps its capacity, so once it has
/// grown to the largest reordering seen, recording does not allocate.
#[derive(Debug, Clone)]
pub struct FileDigest {
    geometry: ChunkGeometry,
    /// Chunks `0..folded` are merged into `stack`.
    folded: u64,
    recorded: u64,
    /// `ahead[k]` holds the value of chunk `folded + k`, once recorded.
    ahead: VecDeque<Option<ChainingValue>>,
    /// Roots of complete subtrees, left to right, of decreasing size.
    stack: Vec<ChainingValue>,
    root: Option<blake3::Hash>,
}

impl FileDigest {
    /// A digest of the file laid out by `geometry`, with room for values
    /// recorded up to `window` chunks ahead of their turn (never more than
    /// the file has) before the queue has to grow.
    pub fn new(geometry: ChunkGeometry, window: usize) -> Self {
        let count = geometry.chunk_count();
        let window = usize::try_from(count).map_or(window, |count| window.min(count));
        Self {
            geometry,
            folded: 0,
            recorded: 0,
            ahead: VecDeque::with_capacity(window),
            // One entry per bit of a chunk count, plus the one being pushed.
            stack: Vec::with_capacity(u64::BITS as usize + 1),
            root: (count == 0).then(|| blake3::hash(b"")),
        }
    }

    /// The layout this digest is for.
    pub fn geometry(&self) -> &ChunkGeometry {
        &self.geometry
    }

    /// Records the value of chunk `index` (from [`ChunkGeometry::chunk_cv`]).
    pub fn record(&mut self, index: u64, cv: ChainingValue) -> Result<(), DigestError> {
        let count = self.geometry.chunk_count();
        if index >= count {
            return Err(DigestError::OutOfRange { index, count });
        }
        if index < self.folded {
            return Err(DigestError::Duplicate { index });
        }
        // At most `count` entries, each of which the file's own size pays for.
        let distance = (index - self.folded) as usize;
        if distance >= self.ahead.len() {
            self.ahead.resize(distance + 1, None);
        }
        let entry = &mut self.ahead[distance];
        if entry.is_some() {
            return Err(DigestError::Duplicate { index });
        }
        *entry = Some(cv);
        self.recorded += 1;
        while let Some(Some(next)) = self.ahead.front() {
            let next = *next;
            self.ahead.pop_front();
            self.fold(next);
        }
        Ok(())
    }

    /// How many chunk values have been recorded.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// The file's BLAKE3 hash, once every chunk's value is recorded.
    pub fn finish(&self) -> Result<blake3::Hash, DigestError> {
        self.root.ok_or_else(|| {
            let count = self.geometry.chunk_count();
            DigestError::Missing {
                // Recording drains every value in order, so chunk
                // `folded` is the first one that has not arrived.
                first: self.folded,
                missing: count - self.recorded,
                count,
            }
        })
    }

    /// Folds the value of chunk `self.folded`, the next in order.
    fn fold(&mut self, cv: ChainingValue) {
        self.folded += 1;
        let count = self.geometry.chunk_count();
        if count == 1 {
            // The only chunk's value is already the root hash.
            self.root = Some(blake3::Hash::from_bytes(cv));
            return;
        }
        if self.folded < count {
            self.stack.push(cv);
            // Each trailing zero of the count folded so far closes an
            // aligned block of twice the size, and one that is not the root,
            // since more chunks follow.
            let mut closed = self.folded;
            while closed & 1 == 0 {
                let right = self.stack.pop();
                let left = self.stack.pop();
                if let (Some(left), Some(right)) = (left, right) {
                    self.stack
                        .push(merge_subtrees_non_root(&left, &right, Mode::Hash));
                }
                closed >>= 1;
            }
            return;
        }
        // The last chunk: merge right to left; the topmost merge is the root.
        let mut right = cv;
        while let Some(left) = self.stack.pop() {
            if self.stack.is_empty() {
                self.root = Some(merge_subtrees_root(&left, &right, Mode::Hash));
            } else {
                right = merge_subtrees_non_root(&left, &right, Mode::Hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filexfer::chunk_pool::test_support::seeded_bytes as data;
    use proptest::prelude::*;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;

    const C: u64 = CHUNK_LEN;

    fn chunk<'a>(geometry: &ChunkGeometry, bytes: &'a [u8], index: u64) -> &'a [u8] {
        let range = geometry.chunk_range(index).unwrap();
        &bytes[range.start as usize..range.end as usize]
    }

    /// The digest of `bytes` with the chunk values recorded in `order`.
    fn digest_in_order(geometry: ChunkGeometry, bytes: &[u8], order: &[u64]) -> blake3::Hash {
        let mut digest = FileDigest::new(geometry, 4);
        for &i in order {
            let cv = geometry.chunk_cv(i, chunk(&geometry, bytes, i)).unwrap();
            digest.record(i, cv).unwrap();
        }
        digest.finish().unwrap()
    }

    fn check_orders(len: u64, chunk_len: u64, seed: u64) {
        let geometry = ChunkGeometry::new(len, chunk_len).unwrap();
        let bytes = data(len, seed);
        let expected = blake3::hash(&bytes);
        let mut order: Vec<u64> = (0..geometry.chunk_count()).collect();
        assert_eq!(
            digest_in_order(geometry, &bytes, &order),
            expected,
            "{len} in order"
        );
        order.reverse();
        assert_eq!(
            digest_in_order(geometry, &bytes, &order),
            expected,
            "{len} reversed"
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
        for round in 0..3 {
            order.shuffle(&mut rng);
            assert_eq!(
                digest_in_order(geometry, &bytes, &order),
                expected,
                "{len} shuffled {round}: {order:?}"
            );
        }
    }

    #[test]
    fn the_digest_is_blake3_of_the_file_for_every_shape_and_order() {
        let sizes = [
            0,
            1,
            1023,
            1024,
            1025,
            C - 1,
            C,
            C + 1,
            2 * C,
            3 * C,
            4 * C,
            5 * C + 1,
            7 * C + 12345,
            8 * C,
            9 * C - 1,
        ];
        for (seed, len) in sizes.into_iter().enumerate() {
            check_orders(len, C, seed as u64);
        }
    }

    #[test]
    fn a_small_chunk_length_gives_the_same_digest() {
        for len in [
            0,
            1,
            1024,
            1025,
            2048,
            3 * 1024 + 7,
            16 * 1024,
            33 * 1024 - 1,
        ] {
            check_orders(len, 1024, len);
            check_orders(len, 4096, len + 1);
        }
    }

    #[test]
    fn a_one_chunk_file_is_checked_by_its_root_hash() {
        for len in [1, 1023, 1024, 1025, C - 1, C] {
            let geometry = ChunkGeometry::v3(len);
            let bytes = data(len, len);
            assert_eq!(geometry.chunk_count(), 1);
            let cv = geometry.chunk_cv(0, &bytes).unwrap();
            assert_eq!(&cv, blake3::hash(&bytes).as_bytes(), "{len}");
        }
        let empty = FileDigest::new(ChunkGeometry::v3(0), 0);
        assert_eq!(empty.finish().unwrap(), blake3::hash(b""));
        assert_eq!(ChunkGeometry::v3(0).chunk_count(), 0);
    }

    #[test]
    fn a_flipped_byte_in_any_chunk_is_caught_and_named() {
        for len in [C / 2, 5 * C + 1, 3 * C] {
            let geometry = ChunkGeometry::v3(len);
            let bytes = data(len, 7);
            for index in 0..geometry.chunk_count() {
                let good = chunk(&geometry, &bytes, index);
                let cv = geometry.chunk_cv(index, good).unwrap();
                assert_eq!(geometry.check_chunk(index, good, &cv), Ok(cv));
                for at in [0, good.len() / 2, good.len() - 1] {
                    let mut bad = good.to_vec();
                    bad[at] ^= 0x01;
                    assert_eq!(
                        geometry.check_chunk(index, &bad, &cv),
                        Err(DigestError::Mismatch { index }),
                        "{len}: chunk {index} byte {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_same_bytes_at_another_offset_have_another_value() {
        let geometry = ChunkGeometry::v3(4 * C);
        let bytes = data(C, 3);
        let at0 = geometry.chunk_cv(0, &bytes).unwrap();
        let at1 = geometry.chunk_cv(1, &bytes).unwrap();
        assert_ne!(at0, at1);
        assert_eq!(
            geometry.check_chunk(1, &bytes, &at0),
            Err(DigestError::Mismatch { index: 1 })
        );
    }

    #[test]
    fn bad_geometry_and_bad_chunks_are_errors() {
        assert_eq!(ChunkGeometry::new(77, CHUNK_LEN), Ok(ChunkGeometry::v3(77)));
        for bad in [0, 512, 1000, 3072, 2 * MAX_CHUNK_LEN] {
            assert_eq!(
                ChunkGeometry::new(10, bad),
                Err(DigestError::BadChunkLen(bad))
            );
        }
        let geometry = ChunkGeometry::new(2500, 1024).unwrap();
        assert_eq!(
            geometry.chunk_cv(3, &[0; 452]),
            Err(DigestError::OutOfRange { index: 3, count: 3 })
        );
        assert_eq!(
            geometry.chunk_cv(2, &[0; 453]),
            Err(DigestError::WrongLength {
                index: 2,
                got: 453,
                expected: 452
            })
        );
        assert_eq!(
            geometry.chunk_cv(0, &[0; 1023]),
            Err(DigestError::WrongLength {
                index: 0,
                got: 1023,
                expected: 1024
            })
        );
    }

    #[test]
    fn duplicates_strays_and_gaps_are_errors() {
        let geometry = ChunkGeometry::new(5 * 1024, 1024).unwrap();
        let mut digest = FileDigest::new(geometry, 0);
        let cv = [7; 32];
        digest.record(3, cv).unwrap();
        assert_eq!(
            digest.record(3, cv),
            Err(DigestError::Duplicate { index: 3 })
        );
        digest.record(0, cv).unwrap();
        assert_eq!(
            digest.record(0, cv),
            Err(DigestError::Duplicate { index: 0 })
        );
        assert_eq!(
            digest.record(5, cv),
            Err(DigestError::OutOfRange { index: 5, count: 5 })
        );
        assert_eq!(
            digest.finish(),
            Err(DigestError::Missing {
                first: 1,
                missing: 3,
                count: 5
            })
        );
        digest.record(1, cv).unwrap();
        digest.record(2, cv).unwrap();
        assert_eq!(
            digest.finish(),
            Err(DigestError::Missing {
                first: 4,
                missing: 1,
                count: 5
            })
        );
        assert_eq!(digest.recorded(), 4);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn any_size_and_order_gives_blake3(
            chunk_log in 10u32..=12,
            chunks in 0u64..=20,
            tail_fraction in 0.0f64..1.0,
            seed in any::<u64>(),
        ) {
            let chunk_len = 1u64 << chunk_log;
            // Anywhere inside the last chunk, its last byte included.
            let len = if chunks == 0 {
                0
            } else {
                (chunks - 1) * chunk_len + 1 + ((chunk_len - 1) as f64 * tail_fraction) as u64
            };
            let geometry = ChunkGeometry::new(len, chunk_len).unwrap();
            prop_assert_eq!(geometry.chunk_count(), chunks);
            let bytes = data(len, seed);
            let mut order: Vec<u64> = (0..chunks).collect();
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
            prop_assert_eq!(digest_in_order(geometry, &bytes, &order), blake3::hash(&bytes));
        }
    }
}
