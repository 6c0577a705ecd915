//! What every fuzz target shares: a global allocator that counts bytes,
//! and the check that a decoder allocated no more than its input pays for.

use pinpoll::alloc::CountingAllocator;
use pinpoll::connect::RegionDescriptor;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// What any decoder may allocate whatever its input: its error's text and
/// the first use of lazily built statics (anyhow's, std's). Less than
/// any length a peer names in a message (a u16 of them is 64 KiB).
pub const FIXED_BUDGET: u64 = 16 << 10;

/// Runs `f`, which decodes an input of `input_len` bytes, and fails (a
/// crash libFuzzer reports) if it asked for more than `per_byte` bytes per
/// input byte plus [`FIXED_BUDGET`]: no decoder may allocate in
/// proportion to a length the peer claims rather than sends.
pub fn within_budget<T>(what: &str, input_len: usize, per_byte: u64, f: impl FnOnce() -> T) -> T {
    let before = ALLOCATOR.bytes();
    let out = f();
    let asked = ALLOCATOR.bytes() - before;
    let budget = per_byte * input_len as u64 + FIXED_BUDGET;
    assert!(
        asked <= budget,
        "{what}: {asked} bytes allocated for a {input_len}-byte input (budget {budget})"
    );
    out
}

/// Bytes of private data an rdma_cm reject carries: the reason a server
/// refuses a connect request with, and its NUL, must fit to arrive whole.
pub const REJECT_LEN: usize = 148;

/// Decodes `bytes` as the engine decodes a peer's ring descriptor (in
/// rdma_cm private data, zero-padded, or a message of its own) and checks
/// what it accepts: a region that does not wrap the address space, and
/// exactly the bytes the encoder writes but for the reserved 5..8.
pub fn region_descriptor(bytes: &[u8]) {
    let decoded = within_budget("RegionDescriptor::decode", bytes.len(), 0, || {
        RegionDescriptor::decode(bytes)
    });
    let Ok(ring) = decoded else {
        return;
    };
    assert!(
        ring.0.addr.checked_add(ring.0.len).is_some(),
        "{ring:?} wraps"
    );
    let (sent, encoded) = (&bytes[..RegionDescriptor::LEN], ring.encode());
    assert_eq!(
        (&encoded[..5], &encoded[8..]),
        (&sent[..5], &sent[8..]),
        "{ring:?}"
    );
    assert_eq!(RegionDescriptor::decode(&encoded).ok(), Some(ring));
}
