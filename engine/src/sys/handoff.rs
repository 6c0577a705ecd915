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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam::utils::CachePadded;

use super::layout::SlotLayout;
use super::mem::{Buffer, PageSize};
use crate::error::Result;

#[derive(Debug)]
struct Shared {
    buf: Buffer,
    layout: SlotLayout,
    /// Slots published by the producer (next position to publish).
    published: CachePadded<AtomicU64>,
    /// Slots released by the consumer (next position to release).
    released: CachePadded<AtomicU64>,
    /// Bytes used in each slot, written before publishing.
    lens: Box<[AtomicU64]>,
}

/// Creates a ring of `count` slots (a power of two) of `size` bytes.
pub fn handoff_ring(size: usize, count: usize) -> Result<(SlotWriter, SlotReader)> {
    let layout = SlotLayout::new(size, count);
    let shared = Arc::new(Shared {
        buf: Buffer::new(layout.bytes(), PageSize::Base)?,
        layout,
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
        self.shared.layout.size()
    }

    /// Free slots (refreshing the consumer's index when it looks short).
    #[inline]
    pub fn free(&mut self) -> usize {
        let count = self.shared.layout.count() as u64;
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
        let layout = self.shared.layout;
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
        let range = layout.range(self.head, len);
        // SAFETY: slot `head` is not yet published, so the consumer does
        // not read it, and it was released (head - released < count), so
        // no earlier reader borrow of it exists; the range is inside the
        // buffer (layout.bytes() == buf.len()). The &mut lives only for `fill`.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(self.shared.buf.as_ptr().add(range.start), len)
        };
        fill(bytes);
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
        let layout = self.shared.layout;
        let slot = layout.slot(self.tail);
        let len = self.shared.lens[slot].load(Ordering::Relaxed) as usize;
        let range = layout.range(self.tail, len);
        // SAFETY: tail < published (Acquire above, or cached from an
        // earlier Acquire), so the producer finished writing this slot and
        // will not touch it until we release it, which needs &mut self and
        // so ends this borrow first.
        Some(unsafe { std::slice::from_raw_parts(self.shared.buf.as_ptr().add(range.start), len) })
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
        let layout = self.shared.layout;
        let slot = layout.slot(pos);
        let len = self.shared.lens[slot].load(Ordering::Relaxed) as usize;
        let range = layout.range(pos, len);
        // SAFETY: tail <= pos < published (read with Acquire when this view
        // was made): the producer finished this slot and cannot reuse it
        // before it is released, which needs the reader this view borrows.
        Some(unsafe { std::slice::from_raw_parts(self.shared.buf.as_ptr().add(range.start), len) })
    }
}

#[cfg(test)]
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
