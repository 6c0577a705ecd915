//! The counting allocator counts what it hands out: allocations and the
//! bytes they ask for, reallocations at their new size. The fuzz targets
//! rely on the byte count to prove that a decoder allocates no more than
//! its input pays for.

use pinpoll::alloc::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

#[test]
fn allocations_and_their_bytes_are_counted() {
    let (calls, bytes) = (ALLOCATOR.allocations(), ALLOCATOR.bytes());
    let mut v: Vec<u8> = Vec::with_capacity(10_000);
    v.push(1);
    let zeroed = vec![0u64; 1_000];
    assert!(ALLOCATOR.allocations() - calls >= 2);
    assert!(ALLOCATOR.bytes() - bytes >= 10_000 + 8_000);
    let (calls, bytes) = (ALLOCATOR.allocations(), ALLOCATOR.bytes());
    v.reserve_exact(50_000);
    assert!(ALLOCATOR.allocations() - calls >= 1);
    assert!(
        ALLOCATOR.bytes() - bytes >= 50_001,
        "a reallocation counts its new size"
    );
    assert_eq!((v[0], zeroed[999]), (1, 0));
}
