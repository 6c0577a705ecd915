//! filexfer v3's hashing pools touch the heap only when they are made:
//! a counting global allocator, a warm-up, then thousands of chunks through
//! the verifier pool (copy, check, write, merge) and the hashing reader
//! (pread, hash, hand out, copy, merge), with the count of every thread's
//! allocations unchanged — the busy-poll thread's and the pools' own; and
//! the server's protocol state taking as many chunks.
//!
//! Runs without the libtest harness, whose own threads allocate and would
//! be counted. No device needed: the pools write to /dev/null and read
//! /dev/zero.

use std::fs::{File, OpenOptions};
use std::sync::Arc;

use pinpoll::alloc::CountingAllocator;
use pinpoll_apps::filexfer::chunk_pool::PoolSize;
use pinpoll_apps::filexfer::digest::{ChunkGeometry, FileDigest, CHUNK_LEN};
use pinpoll_apps::filexfer::protocol::Msg;
use pinpoll_apps::filexfer::read_ahead::HashingReader;
use pinpoll_apps::filexfer::server_core::{Action, Config, Event, ServerCore};
use pinpoll_apps::filexfer::verify::VerifierPool;
use pinpoll_apps::filexfer::{SLOTS, SLOT_SIZE, TRAILER};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// Protocol v3's chunks: how far threads run ahead of each other, which
/// the digest's reserved queue must cover, depends on the time per chunk.
const CHUNK: u64 = CHUNK_LEN;
const CHUNKS: u64 = 160;
const WARM_UP: u64 = 16;
const NAME: &str = "filexfer_pools_never_allocate_per_chunk";

/// Reports as libtest does, for scripts/test.sh's runner to count.
fn main() {
    println!("running 1 test");
    let geometry = ChunkGeometry::new(CHUNKS * CHUNK, CHUNK).expect("a geometry");
    let size = PoolSize::with_threads(2);
    verifier(geometry, size);
    reader(geometry, size);
    server_core(geometry);
    println!("test {NAME} ... ok");
    println!("\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}

fn verifier(geometry: ChunkGeometry, size: PoolSize) {
    let sink = OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .expect("open /dev/null");
    // Every chunk alike is enough: a chunk's value depends on its offset.
    let pattern: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
    let ring = pattern.repeat(CHUNKS as usize);
    let cvs: Vec<_> = ring
        .chunks(CHUNK as usize)
        .enumerate()
        .map(|(i, c)| geometry.chunk_cv(i as u64, c).expect("a chunk"))
        .collect();
    let pool = VerifierPool::new(Arc::new(sink), geometry, size).expect("a verifier pool");
    let mut before = 0;
    for (index, slot) in ring.chunks(CHUNK as usize).enumerate() {
        if index as u64 == WARM_UP {
            before = ALLOCATOR.allocations();
        }
        let mut buffer = loop {
            // The busy-poll thread's way: never wait, try again.
            match pool.try_buffer().expect("no failure") {
                Some(buffer) => break buffer,
                None => std::hint::spin_loop(),
            }
        };
        buffer.copy_from(slot).expect("fits");
        pool.submit(index as u64, cvs[index], buffer)
            .expect("submitted");
    }
    let after = ALLOCATOR.allocations();
    let digest = pool.finish().expect("every chunk matches");
    assert_eq!(digest, blake3::hash(&ring), "the digest");
    assert_eq!(
        after - before,
        0,
        "verifier pool: allocations while chunks flowed"
    );
}

fn reader(geometry: ChunkGeometry, size: PoolSize) {
    let zeros = File::open("/dev/zero").expect("open /dev/zero");
    let mut reader = HashingReader::new(Arc::new(zeros), geometry, size).expect("a reader");
    let mut slot = vec![0u8; CHUNK as usize];
    // The sender merges the values as they are handed out, in order.
    let mut digest = FileDigest::new(geometry, 1);
    let (mut before, mut handed_out) = (0, 0);
    while !reader.is_done() {
        if handed_out == WARM_UP {
            before = ALLOCATOR.allocations();
        }
        if let Some(chunk) = reader.try_next_chunk().expect("no failure") {
            slot.copy_from_slice(chunk.bytes());
            digest.record(chunk.index(), *chunk.cv()).expect("in order");
            handed_out += 1;
        }
    }
    let after = ALLOCATOR.allocations();
    let digest = digest.finish().expect("every chunk read");
    let zeros = vec![0u8; (CHUNKS * CHUNK) as usize];
    assert_eq!(digest, blake3::hash(&zeros), "the digest");
    assert_eq!(
        after - before,
        0,
        "hashing reader: allocations while chunks flowed"
    );
}

/// The server's protocol state, as a stream's busy-poll thread drives it
/// (`handle_into` with the vectors it keeps): each chunk taken and handed
/// off, its credit asked for, without touching the heap.
fn server_core(geometry: ChunkGeometry) {
    let mut core = ServerCore::new(Config {
        slots: SLOTS,
        slot_size: SLOT_SIZE,
        min_rate: 1,
        deadline: std::time::Duration::from_secs(3600),
    });
    let now = std::time::Instant::now();
    let start = Msg::Start {
        size: geometry.file_len(),
        streams: 1,
        name: b"f.bin".to_vec(),
    };
    core.handle(Event::Message {
        stream: 0,
        msg: start,
    });
    core.handle(Event::Admitted { token: 0 });
    core.handle(Event::Joined { now });
    let (mut arrived, mut handed) = (Vec::with_capacity(2), Vec::with_capacity(2));
    let mut before = ALLOCATOR.allocations();
    for index in 0..CHUNKS {
        if index == WARM_UP {
            before = ALLOCATOR.allocations();
        }
        let slot = (index % u64::from(SLOTS)) as u32;
        let chunk = Event::Chunk {
            stream: 0,
            slot,
            len: (CHUNK as usize + TRAILER) as u32,
            now,
        };
        core.handle_into(chunk, &mut arrived);
        assert!(
            matches!(arrived[..], [Action::Verify { .. }]),
            "chunk {index}: {arrived:?}"
        );
        core.handle_into(Event::HandedOff { stream: 0, slot }, &mut handed);
        assert_eq!(handed, [Action::Credit { stream: 0 }], "chunk {index}");
    }
    let after = ALLOCATOR.allocations();
    assert_eq!(
        after - before,
        0,
        "server protocol state: allocations while chunks flowed"
    );
}
