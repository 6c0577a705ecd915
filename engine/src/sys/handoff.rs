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

use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::Ordering;

use crossbeam::utils::CachePadded;

use self::sync::{Arc, AtomicU64};
use super::layout::SlotLayout;
use crate::error::Result;

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
    slots: Storage,
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
        let len = self.lens[layout.slot(pos)].load(Ordering::Relaxed) as usize;
        // SAFETY: the producer stored `len` (at most the slot size: push_with
        // checks it) before its Release store that published `pos`, which the
        // caller's Acquire load synchronised with; nothing writes the slot
        // before it is released, and the caller keeps it unreleased.
        unsafe { self.slots.read(layout.range(pos, len)) }
    }
}

/// Creates a ring of `count` slots (a power of two) of `size` bytes.
pub fn handoff_ring(size: usize, count: usize) -> Result<(SlotWriter, SlotReader)> {
    let shared = Arc::new(Shared {
        slots: Storage::new(SlotLayout::new(size, count))?,
        published: CachePadded::new(AtomicU64::new(0)),
        released: CachePadded::new(AtomicU64::new(0)),
        lens: (0..count).map(|_| AtomicU64::new(0)).collect(),
    });
    Ok((
        SlotWriter {
            shared: Arc::clone(&shared),
            head: 0,
            cached_released: 0,
            _not_sync: PhantomData,
        },
        SlotReader {
            shared,
            tail: 0,
            cached_published: 0,
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

    /// Free slots (refreshing the consumer's index when it looks short).
    #[inline]
    pub fn free(&mut self) -> usize {
        let count = self.shared.slots.layout().count() as u64;
        if self.head - self.cached_released >= count {
            self.cached_released = self.shared.released.load(Ordering::Acquire);
        }
        let mut free = count - (self.head - self.cached_released);
        if free < count {
            self.cached_released = self.shared.released.load(Ordering::Acquire);
            free = count - (self.head - self.cached_released);
        }
        free as usize
    }

    /// Copies `data` into the next free slot and publishes it. `false`
    /// when every slot is in use (back-pressure) or `data` is too large.
    #[inline]
    pub fn push(&mut self, data: &[u8]) -> bool {
        self.push_with(data.len(), |slot| slot.copy_from_slice(data))
    }

    /// Lets `fill` write `len` bytes into the next free slot, then
    /// publishes it. `false` when full or `len` exceeds the slot size.
    #[inline]
    pub fn push_with(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        let layout = self.shared.slots.layout();
        if len > layout.size() {
            return false;
        }
        if self.head - self.cached_released >= layout.count() as u64 {
            self.cached_released = self.shared.released.load(Ordering::Acquire);
            if self.head - self.cached_released >= layout.count() as u64 {
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
        self.head += 1;
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
        if self.tail < self.cached_published || self.peek().is_some() {
            self.tail += 1;
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
    pub fn len(&self) -> usize {
        (self.published - self.tail) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of the `i`-th oldest published slot.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let pos = self.tail + i as u64;
        if pos >= self.published {
            return None;
        }
        // SAFETY: tail <= pos < published, read with Acquire when this view
        // was made; releasing needs the reader this view borrows for 'a.
        Some(unsafe { self.shared.published_bytes(pos) })
    }
}

/// The slots' bytes: one mmap'd buffer, or under `cfg(loom)` one loom
/// `UnsafeCell` per slot, so that loom checks every access to a slot
/// against the conflicting accesses of the other side. The ring's indices
/// decide who may touch a slot; these methods only carry that out.
#[derive(Debug)]
struct Storage {
    layout: SlotLayout,
    /// `layout.bytes()` long.
    #[cfg(not(loom))]
    buf: super::mem::Buffer,
    /// One cell of `layout.size()` bytes per slot.
    #[cfg(loom)]
    cells: Box<[loom::cell::UnsafeCell<Box<[u8]>>]>,
}

impl Storage {
    #[inline]
    fn layout(&self) -> SlotLayout {
        self.layout
    }
}

#[cfg(not(loom))]
impl Storage {
    fn new(layout: SlotLayout) -> Result<Storage> {
        use super::mem::{Buffer, PageSize};
        Ok(Storage {
            buf: Buffer::new(layout.bytes(), PageSize::Base)?,
            layout,
        })
    }

    /// Lets `fill` write the bytes of `range`.
    ///
    /// # Safety
    /// `range` is `self.layout().range(pos, len)` for some position `pos`
    /// and `len` at most the slot size (so it lies in that position's slot),
    /// and no other access to the slot happens until `fill` returns.
    #[inline]
    unsafe fn write(&self, range: Range<usize>, fill: impl FnOnce(&mut [u8])) {
        // `end - start`, not `range.len()`: the optimiser folds the former
        // to the caller's `len`, but keeps the latter's empty-range check.
        let len = range.end - range.start;
        // SAFETY: the range lies in one slot, so in the buffer (which is
        // layout.bytes() long); the caller rules out any other access while
        // the &mut lives.
        fill(unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr().add(range.start), len) })
    }

    /// The bytes of `range`.
    ///
    /// # Safety
    /// `range` is as for `write`; every write to the slot happened before
    /// this call, and none happens while the slice lives.
    #[inline]
    unsafe fn read(&self, range: Range<usize>) -> &[u8] {
        let len = range.end - range.start; // as in `write`
                                           // SAFETY: in the buffer, as in `write`; the caller rules out writes
                                           // while the slice lives.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(range.start), len) }
    }
}

// SAFETY: as for the mmap'd buffer (`mem::Buffer` is Sync): the cells are
// reached only through `write` and `read`, whose callers give each slot to
// one side at a time, in happens-before order; loom checks exactly that at
// every `with` and `with_mut` below.
#[cfg(loom)]
unsafe impl Sync for Storage {}

#[cfg(loom)]
impl Storage {
    fn new(layout: SlotLayout) -> Result<Storage> {
        let cells = (0..layout.count())
            .map(|_| loom::cell::UnsafeCell::new(vec![0u8; layout.size()].into_boxed_slice()))
            .collect();
        Ok(Storage { layout, cells })
    }

    /// The cell of the slot that `range` (which starts it) lies in.
    fn cell(&self, range: &Range<usize>) -> &loom::cell::UnsafeCell<Box<[u8]>> {
        &self.cells[range.start / self.layout.size()]
    }

    /// As the mmap'd storage's `write`; loom records the write access.
    ///
    /// # Safety
    /// As the mmap'd storage's `write`.
    unsafe fn write(&self, range: Range<usize>, fill: impl FnOnce(&mut [u8])) {
        self.cell(&range).with_mut(|cell| {
            // SAFETY: the cell holds a live slot of `size` >= range.len()
            // bytes; loom has just checked that no other access is concurrent.
            fill(unsafe { &mut (&mut *cell)[..range.len()] })
        })
    }

    /// As the mmap'd storage's `read`; loom records the read access when
    /// the slice is made, and checks any later write against it.
    ///
    /// # Safety
    /// As the mmap'd storage's `read`.
    unsafe fn read(&self, range: Range<usize>) -> &[u8] {
        self.cell(&range).with(|cell| {
            // SAFETY: the cell holds a live slot of `size` >= range.len() bytes,
            // owned by `self`; loom has just checked that every write to it
            // happened before, and the caller rules out later writes while
            // the slice lives.
            unsafe { &(&*cell)[..range.len()] }
        })
    }
}

#[cfg(all(test, not(loom)))]
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
/// by loom: its atomics model the weak memory orderings, and its cells flag
/// any access to a slot's bytes that does not happen-after the other side's
/// conflicting one. Run by scripts/test.sh (its loom step):
/// `RUSTFLAGS="--cfg loom" cargo test -p pinpoll --release --lib -- loom_tests`.
#[cfg(all(test, loom))]
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

    #[test]
    fn push_peek_release_wrapping() {
        check(|| {
            let (writer, mut reader) = handoff_ring(SLOT, 2).unwrap();
            let producer = thread::spawn(move || push_all(writer, &MESSAGES));
            for m in MESSAGES {
                take(&mut reader, m);
            }
            assert!(reader.peek().is_none());
            producer.join().unwrap();
        });
    }

    #[test]
    fn published_batches_wrapping() {
        check(|| {
            let (writer, mut reader) = handoff_ring(SLOT, 2).unwrap();
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

    #[test]
    fn free_while_the_consumer_releases() {
        check(|| {
            let (mut writer, mut reader) = handoff_ring(SLOT, 2).unwrap();
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
