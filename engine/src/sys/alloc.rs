//! A global allocator that counts, for proving that the data path never
//! touches the heap: install it in a test binary, warm up, and compare
//! [`CountingAllocator::allocations`] before and after the work. It counts
//! bytes too ([`CountingAllocator::bytes`]), for proving that a decoder
//! allocates no more than its input pays for (the fuzz targets).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting every allocation and reallocation.
#[derive(Debug, Default)]
pub struct CountingAllocator {
    allocations: AtomicU64,
    bytes: AtomicU64,
}

impl CountingAllocator {
    /// An allocator with both counts at zero; `const`, for the `static`
    /// that `#[global_allocator]` needs.
    pub const fn new() -> CountingAllocator {
        CountingAllocator {
            allocations: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Allocations and reallocations so far, on every thread.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::SeqCst)
    }

    /// Bytes asked for by allocations and reallocations (a reallocation
    /// counts its whole new size) so far, on every thread.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    fn count(&self, size: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so System's guarantees are ours; counting has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count(layout.size());
        // SAFETY: forwarded with the caller's layout (caller's contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.count(layout.size());
        // SAFETY: as in alloc.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr was allocated by System with this layout (caller's contract).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count(new_size);
        // SAFETY: forwarded unchanged (caller's contract).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
