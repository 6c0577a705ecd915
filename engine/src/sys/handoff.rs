//! A single-producer, single-consumer ring of fixed-size byte slots for
//! handing payloads between an application thread and the engine's worker
//! without allocating or locking (in the manner of rtrb).
//!
//! The producer writes a slot, then publishes it (a Release store of its
//! position); the consumer sees it with an Acquire load, reads it, and
//! releases it (a Release store) so the producer may reuse it. Each side
//! caches the other's index and touches the shared atomic only when the
//! cache says the ring looks full or empty. The two indices sit on separate
//! cache lines. Both halves are `Send` and not `Sync`.
//!
//! Positions are modular `u64`s: every difference of two is taken with
//! `wrapping_sub`, which is exact while fewer than 2^64 slots are in
//! flight (at most `count` are), so the ring works across the wrap of
//! its counters as anywhere else — the tests start it just below it.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;

use crossbeam::utils::CachePadded;

use self::sync::{Arc, AtomicU64};
use super::layout::SlotLayout;
use super::slot_storage::SlotStorage;
use crate::error::{Error, Result};

/// The shared pointer and atomics the ring synchronises through: loom's
/// under `cfg(loom)`, so that its model checker sees every access (the
/// tests at the end of this file), the standard library's otherwise.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::{atomic::AtomicU64, Arc};
    #[cfg(not(loom))]
    pub(super) use std::sync::{atomic::AtomicU64, Arc};
}

#[derive(Debug)]
struct Shared {
    slots: SlotStorage,
    /// Slots published by the producer (next position to publish).
    published: CachePadded<AtomicU64>,
    /// Slots released by the consumer (next position to release).
    released: CachePadded<AtomicU64>,
    /// Bytes used in each slot, written before publishing.
    lens: Box<[AtomicU64]>,
}

impl Shared {
    /// The bytes of the slot at position `pos`, as its producer published them.
    ///
    /// # Safety
    /// `pos` is published (seen through an Acquire load of `published`)
    /// and not released, and stays unreleased while the slice lives.
    #[inline]
    unsafe fn published_bytes(&self, pos: u64) -> &[u8] {
        let layout = self.slots.layout();
        // At most the slot size: push_with checks it (and `range` clamps).
        let len = self.lens[layout.slot(pos)].load(Ordering::Relaxed) as usize;
        // SAFETY: the producer stored `len` before its Release store that
        // published `pos`, which the caller's Acquire load synchronised
        // with; nothing writes the slot before it is released, and the
        // caller keeps it unreleased.
        unsafe { self.slots.read(layout.range(pos, len)) }
    }
}

/// Creates a ring of `count` slots (a power of two) of `size` bytes, or
/// says why it cannot: a count that is not a power of two, empty slots, or
/// more bytes than memory can hold.
pub fn handoff_ring(size: usize, count: usize) -> Result<(SlotWriter, SlotReader)> {
    ring_from(size, count, 0)
}

/// A ring whose first position is `start` (the tests start it near the
/// wrap of the `u64` positions).
fn ring_from(size: usize, count: usize, start: u64) -> Result<(SlotWriter, SlotReader)> {
    let layout = SlotLayout::new(size, count)?;
    let slots = SlotStorage::new(layout)?;
    let mut lens = Vec::new();
    lens.try_reserve_exact(count)
        .map_err(|_| Error::OutOfMemory {
            what: format!("the lengths of {count} slots"),
        })?;
    lens.extend((0..count).map(|_| AtomicU64::new(0)));
    let shared = Arc::new(Shared {
        slots,
        published: CachePadded::new(AtomicU64::new(start)),
        released: CachePadded::new(AtomicU64::new(start)),
        lens: lens.into_boxed_slice(),
    });
    Ok((
        SlotWriter {
            shared: Arc::clone(&shared),
            head: start,
            cached_released: start,
            _not_sync: PhantomData,
        },
        SlotReader {
            shared,
            tail: start,
            cached_published: start,
            _not_sync: PhantomData,
        },
    ))
}

/// The producing half.
pub struct SlotWriter {
    shared: Arc<Shared>,
    head: u64,
    cached_released: u64,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for SlotWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotWriter")
            .field("head", &self.head)
            .finish()
    }
}

impl SlotWriter {
    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.shared.slots.layout().size()
    }

    /// Slots in use: published and not yet released (as last seen).
    #[inline]
    fn in_use(&self) -> u64 {
        self.head.wrapping_sub(self.cached_released)
    }

    /// Free slots (refreshing the consumer's index when it looks short).
    #[inline]
    pub fn free(&mut self) -> usize {
        let count = self.shared.slots.layout().count() as u64;
        if self.in_use() != 0 {
            self.cached_released = self.shared.released.load(Ordering::Acquire);
        }
        // Never wraps: at most `count` slots are in use.
        count.wrapping_sub(self.in_use()) as usize
    }

    /// Copies `data` into the next free slot and publishes it. `false`
    /// when every slot is in use (back-pressure) or `data` is too large.
    #[inline]
    #[must_use = "false: the ring is full or the data too large, and nothing was handed over"]
    pub fn push(&mut self, data: &[u8]) -> bool {
        self.push_with(data.len(), |slot| slot.copy_from_slice(data))
    }

    /// Lets `fill` write `len` bytes into the next free slot, then
    /// publishes it. `false` when full or `len` exceeds the slot size.
    #[inline]
    #[must_use = "false: the ring is full or `len` too large, and nothing was handed over"]
    pub fn push_with(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        let layout = self.shared.slots.layout();
        if len > layout.size() {
            return false;
        }
        if self.in_use() >= layout.count() as u64 {
            self.cached_released = self.shared.released.load(Ordering::Acquire);
            if self.in_use() >= layout.count() as u64 {
                return false;
            }
        }
        let slot = layout.slot(self.head);
        // SAFETY: len <= size (checked above). Position `head` is not yet
        // published, so the consumer does not read its slot, and the slot's
        // previous position was released (head - released < count, read with
        // Acquire, which synchronised with the consumer's Release store), so
        // every earlier read of it happened before this write.
        unsafe { self.shared.slots.write(layout.range(self.head, len), fill) };
        self.shared.lens[slot].store(len as u64, Ordering::Relaxed);
        self.head = self.head.wrapping_add(1);
        self.shared.published.store(self.head, Ordering::Release);
        true
    }
}

/// The consuming half.
pub struct SlotReader {
    shared: Arc<Shared>,
    tail: u64,
    cached_published: u64,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for SlotReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotReader")
            .field("tail", &self.tail)
            .finish()
    }
}

impl SlotReader {
    /// The oldest published slot's bytes, if any, without releasing it.
    #[inline]
    pub fn peek(&mut self) -> Option<&[u8]> {
        if self.tail == self.cached_published {
            self.cached_published = self.shared.published.load(Ordering::Acquire);
            if self.tail == self.cached_published {
                return None;
            }
        }
        // SAFETY: tail < published (Acquire above, or cached from an
        // earlier Acquire), and the slot stays unreleased while the slice
        // lives: releasing needs &mut self, which this borrow holds.
        Some(unsafe { self.shared.published_bytes(self.tail) })
    }

    /// Every published, unreleased slot, oldest first, readable together
    /// (a batch can post several before releasing any).
    #[inline]
    pub fn published(&mut self) -> Published<'_> {
        self.cached_published = self.shared.published.load(Ordering::Acquire);
        Published {
            shared: &self.shared,
            tail: self.tail,
            published: self.cached_published,
        }
    }

    /// Releases the oldest published slot back to the producer.
    #[inline]
    pub fn release(&mut self) {
        // `tail` never passes `published`: unequal, one is unreleased.
        if self.tail != self.cached_published || self.peek().is_some() {
            self.tail = self.tail.wrapping_add(1);
            self.shared.released.store(self.tail, Ordering::Release);
        }
    }
}

/// The published slots at one moment, borrowed from the reader (so none
/// can be released while any is read).
#[derive(Debug)]
pub struct Published<'a> {
    shared: &'a Shared,
    tail: u64,
    published: u64,
}

impl<'a> Published<'a> {
    /// Slots in the view: those published and not released when it was
    /// made.
    pub fn len(&self) -> usize {
        // At most the slot count, which is a usize.
        self.published.wrapping_sub(self.tail) as usize
    }

    /// Whether the view holds no slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of the `i`-th oldest published slot; `None` past the last.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        // `i` first: the position is `tail + i`, and a large `i` would wrap
        // it onto a released slot that the producer may be rewriting.
        if i >= self.len() {
            return None;
        }
        let pos = self.tail.wrapping_add(i as u64);
        // SAFETY: pos is one of the len() positions from tail on, published
        // (read with Acquire when this view was made) and unreleased:
        // releasing needs the reader this view borrows for 'a.
        Some(unsafe { self.shared.published_bytes(pos) })
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    #[test]
    fn slots_go_across_in_order_and_come_back() {
        let (mut w, mut r) = handoff_ring(64, 4).unwrap();
        assert!(r.peek().is_none());
        for i in 0..4u8 {
            assert!(w.push(&[i; 10]));
        }
        assert!(!w.push(&[9]), "full: back-pressure");
        assert!(!w.push(&[0; 65]), "larger than a slot");
        assert_eq!(r.peek().unwrap(), &[0u8; 10]);
        r.release();
        assert!(w.push(&[4; 3]));
        for i in 1..4u8 {
            assert_eq!(r.peek().unwrap(), &[i; 10]);
            r.release();
        }
        assert_eq!(r.peek().unwrap(), &[4u8; 3]);
        r.release();
        assert!(r.peek().is_none());
        r.release(); // nothing to release: no effect
        assert!(w.push(&[5; 1]));
        assert!(w.push(&[6; 2]));
        assert_eq!(w.free(), 2);
        let view = r.published();
        assert_eq!(
            (view.len(), view.get(0), view.get(1), view.get(2)),
            (2, Some(&[5u8][..]), Some(&[6u8, 6][..]), None)
        );
        assert_eq!(r.peek().unwrap(), &[5u8]);
    }

    /// Finding 1 of issue 23: `get(usize::MAX)` wrapped `tail + i` onto
    /// a released slot, which the producer may be rewriting.
    #[test]
    fn a_view_never_reaches_past_its_published_slots() {
        let (mut w, mut r) = handoff_ring(64, 4).unwrap();
        for i in 0..4u8 {
            assert!(w.push(&[i; 8]));
        }
        r.release();
        r.release();
        // Positions 0 and 1 are released: the producer may rewrite their
        // slots now, while the consumer looks at 2 and 3.
        assert!(w.push(&[4; 8]));
        let view = r.published();
        assert_eq!(view.len(), 3);
        for i in [usize::MAX, usize::MAX - 1, usize::MAX - 2, 3, 4, 1 << 63] {
            assert_eq!(view.get(i), None, "get({i})");
        }
        assert_eq!(view.get(0), Some(&[2u8; 8][..]));
        assert_eq!(view.get(2), Some(&[4u8; 8][..]));
    }

    /// Finding 2 of issue 23: `size * count` wrapped, mapping one page for
    /// a ring that later pushes write megabytes into.
    #[test]
    fn a_ring_that_does_not_fit_in_memory_is_refused() {
        for (size, count) in [
            (1 << 62, 4),
            (usize::MAX, 2),
            (1 << 20, 1 << 60),
            (2, 1 << 63),
        ] {
            let err = handoff_ring(size, count).unwrap_err().to_string();
            assert!(
                err.contains("more bytes than one mapping can hold"),
                "{size} x {count}: {err}"
            );
        }
        let err = handoff_ring(64, 3).unwrap_err().to_string();
        assert!(err.contains("power of two"), "{err}");
        let err = handoff_ring(0, 4).unwrap_err().to_string();
        assert!(err.contains("at least one byte"), "{err}");
    }

    /// Positions are modular: a ring whose counters wrap past u64::MAX
    /// hands every message across intact, in order.
    #[test]
    fn the_ring_works_across_the_wrap_of_its_positions() {
        let (mut w, mut r) = ring_from(16, 4, u64::MAX - 5).unwrap();
        for i in 0..40u8 {
            assert!(w.push(&[i; 3]), "push {i}");
            assert_eq!(w.free(), 3);
            let view = r.published();
            assert_eq!(
                (view.len(), view.get(0), view.get(1)),
                (1, Some(&[i; 3][..]), None)
            );
            assert_eq!(view.get(usize::MAX), None);
            assert_eq!(r.peek(), Some(&[i; 3][..]));
            r.release();
            assert!(r.peek().is_none());
        }
        for i in 0..4u8 {
            assert!(w.push(&[i; 2]));
        }
        assert!(!w.push(&[9]), "full across the wrap");
        assert_eq!(r.published().len(), 4);
    }

    #[test]
    fn a_producer_thread_and_a_consumer_thread_see_every_byte() {
        let (mut w, mut r) = handoff_ring(256, 8).unwrap();
        const N: u32 = 20_000;
        let producer = std::thread::spawn(move || {
            for i in 0..N {
                let len = 1 + (i as usize % 200);
                while !w.push_with(len, |s| {
                    s.iter_mut()
                        .enumerate()
                        .for_each(|(j, b)| *b = (i as usize + j) as u8)
                }) {
                    std::hint::spin_loop();
                }
            }
        });
        for i in 0..N {
            let data = loop {
                if let Some(d) = r.peek() {
                    break d.to_vec();
                }
                std::hint::spin_loop();
            };
            r.release();
            let expected: Vec<u8> = (0..1 + (i as usize % 200))
                .map(|j| (i as usize + j) as u8)
                .collect();
            assert_eq!(data, expected, "message {i}");
        }
        producer.join().unwrap();
    }
}

/// Every interleaving of the two halves (up to a preemption bound), checked
/// by loom over the real ring — its mmap'd bytes and its index arithmetic:
/// loom's atomics model the weak memory orderings, and the storage's
/// per-byte cells flag any access to a byte that does not happen-after the
/// other side's conflicting one. Each scenario also runs with the
/// positions starting just below the wrap of `u64`. Run by scripts/test.sh
/// (its loom step):
/// `RUSTFLAGS="--cfg loom" cargo test -p pinpoll --release --lib -- loom_tests`.
#[cfg(all(test, loom))]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod loom_tests {
    use loom::thread;

    use super::*;

    /// Slot size of the rings below (two slots each).
    const SLOT: usize = 4;

    /// More messages than slots, so positions 2 and 3 reuse slots 0 and 1,
    /// each with fewer bytes and other contents than the one before it (a
    /// stale length or stale bytes would show).
    const MESSAGES: [&[u8]; 4] = [&[1, 2, 3], &[4, 5, 6, 7], &[8], &[9, 10]];

    /// Explores `f` with at most `PREEMPTIONS` preemptions per execution
    /// (LOOM_MAX_PREEMPTIONS overrides it), which bounds the state space
    /// of the spin loops below; loom's default is no bound.
    fn check(f: impl Fn() + Sync + Send + 'static) {
        const PREEMPTIONS: usize = 4;
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound.get_or_insert(PREEMPTIONS);
        builder.check(f);
    }

    fn push_all(mut writer: SlotWriter, messages: &'static [&'static [u8]]) {
        for m in messages {
            while !writer.push(m) {
                thread::yield_now();
            }
        }
    }

    /// Waits for the next message, checks its length and every byte, and
    /// releases it.
    fn take(reader: &mut SlotReader, expected: &[u8]) {
        loop {
            if let Some(bytes) = reader.peek() {
                assert_eq!(bytes, expected);
                break;
            }
            thread::yield_now();
        }
        reader.release();
    }

    /// First positions: the ordinary start, and two below the wrap of
    /// `u64` (the four messages then cross it).
    const STARTS: [u64; 2] = [0, u64::MAX - 1];

    #[test]
    fn push_peek_release_wrapping() {
        for start in STARTS {
            check(move || {
                let (writer, mut reader) = ring_from(SLOT, 2, start).unwrap();
                let producer = thread::spawn(move || push_all(writer, &MESSAGES));
                for m in MESSAGES {
                    take(&mut reader, m);
                }
                assert!(reader.peek().is_none());
                producer.join().unwrap();
            });
        }
    }

    #[test]
    fn published_batches_wrapping() {
        for start in STARTS {
            check(move || {
                let (writer, mut reader) = ring_from(SLOT, 2, start).unwrap();
                let producer = thread::spawn(move || push_all(writer, &MESSAGES));
                let mut next = 0;
                while next < MESSAGES.len() {
                    let view = reader.published();
                    let n = view.len();
                    for i in 0..n {
                        assert_eq!(
                            view.get(i),
                            Some(MESSAGES[next + i]),
                            "position {}",
                            next + i
                        );
                    }
                    assert_eq!(view.get(n), None);
                    // Indices past the view must not wrap onto the slots
                    // the producer is rewriting (loom flags the access).
                    assert_eq!(view.get(usize::MAX), None);
                    for _ in 0..n {
                        reader.release();
                    }
                    next += n;
                    if n == 0 {
                        thread::yield_now();
                    }
                }
                producer.join().unwrap();
            });
        }
    }

    #[test]
    fn free_while_the_consumer_releases() {
        for start in STARTS {
            free_while_the_consumer_releases_from(start);
        }
    }

    fn free_while_the_consumer_releases_from(start: u64) {
        check(move || {
            let (mut writer, mut reader) = ring_from(SLOT, 2, start).unwrap();
            assert!(writer.push(MESSAGES[0]) && writer.push(MESSAGES[1]));
            assert!(!writer.push(MESSAGES[2]), "full");
            assert_eq!(writer.free(), 0);
            let consumer = thread::spawn(move || {
                for m in &MESSAGES[..3] {
                    take(&mut reader, m);
                }
            });
            // Without pushes, free() never shrinks; as soon as it is above
            // zero, a push must succeed (and write a slot the consumer has
            // finished reading: loom checks that).
            let mut free = 0;
            while free == 0 {
                thread::yield_now();
                let now = writer.free();
                assert!(now >= free && now <= 2, "free() went from {free} to {now}");
                free = now;
            }
            assert!(writer.push(MESSAGES[2]), "free() said {free}");
            free -= 1;
            while free < 2 {
                let now = writer.free();
                assert!(now >= free && now <= 2, "free() went from {free} to {now}");
                free = now;
                thread::yield_now();
            }
            consumer.join().unwrap();
            assert_eq!(writer.free(), 2);
        });
    }
}
