//! The pure-Rust hot path, no device needed: what pinpoll's own
//! instructions cost per operation, so a regression shows without a NIC.
//!
//! - send-queue accounting under selective signaling (admit, retire),
//! - ring geometry and cursors (slot claim and release, byte ranges),
//! - remote-range checks done by every RDMA WRITE/READ,
//! - the engine-mode hand-off ring (push, peek, release; a batch view),
//! - the clocks a measurement can use (why pinpoll-perf reads the TSC).
//!
//! Patching a pre-built chain (`SendChain::patch`) and completion dispatch
//! (`Connection::poll`) are not reachable without a queue pair and a CQ;
//! see BENCHMARKS.md.
//!
//! `cargo bench -p pinpoll-benches --bench hotpath`

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pinpoll::datapath::ring::{RingCursor, SlotLayout};
use pinpoll::datapath::sq::SendQueueAccount;
use pinpoll::sys::handoff::handoff_ring;
use pinpoll::RemoteSlice;

/// Work requests per batch in these benches (the throughput profile's N and K).
const BATCH: u64 = 32;

fn send_queue(c: &mut Criterion) {
    let mut g = c.benchmark_group("hotpath/send_queue");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("admit_32_retire_1", |b| {
        let mut sq = SendQueueAccount::new(1024, BATCH as u32);
        b.iter(|| {
            let mut last = 0;
            for _ in 0..BATCH {
                let (seq, _signaled) = black_box(&mut sq).admit(false).expect("room");
                last = seq;
            }
            // One signaled completion retires the whole batch.
            black_box(sq.retire_through(last));
        })
    });
    g.bench_function("admit_32_rollback", |b| {
        let mut sq = SendQueueAccount::new(1024, BATCH as u32);
        b.iter(|| {
            let mark = sq.posted();
            for _ in 0..BATCH {
                black_box(black_box(&mut sq).admit(false));
            }
            sq.rollback(mark);
        })
    });
    g.finish();
    let mut g = c.benchmark_group("hotpath/send_queue_single");
    g.throughput(Throughput::Elements(1));
    g.bench_function("admit_signaled_retire", |b| {
        let mut sq = SendQueueAccount::new(64, 1);
        b.iter(|| {
            let (seq, signaled) = black_box(&mut sq).admit(true).expect("room");
            black_box(signaled);
            black_box(sq.retire_through(seq));
        })
    });
    g.finish();
}

fn rings(c: &mut Criterion) {
    let mut g = c.benchmark_group("hotpath/ring");
    g.throughput(Throughput::Elements(BATCH));
    let layout = SlotLayout::new(4096, 256);
    g.bench_function("claim_range_release_32", |b| {
        let mut cursor = RingCursor::default();
        b.iter(|| {
            for _ in 0..BATCH {
                let pos = black_box(&mut cursor)
                    .claim(layout.count())
                    .expect("free slot");
                black_box(layout.range(layout.slot(pos), 64));
            }
            cursor.release(BATCH);
        })
    });
    let peer = RemoteSlice {
        addr: 0x7f00_0000_0000,
        len: 1 << 20,
        rkey: 0x1234,
    };
    g.bench_function("remote_sub_32", |b| {
        b.iter(|| {
            for i in 0..BATCH {
                black_box(black_box(&peer).sub(i * 64, 64).expect("inside"));
            }
        })
    });
    g.finish();
}

fn handoff(c: &mut Criterion) {
    let mut g = c.benchmark_group("hotpath/handoff");
    for len in [8usize, 64, 4096] {
        g.throughput(Throughput::Bytes(len as u64));
        let (mut w, mut r) = handoff_ring(4096, 256).expect("ring");
        let data = vec![7u8; len];
        g.bench_function(format!("push_peek_release/{len}"), |b| {
            b.iter(|| {
                assert!(w.push(black_box(&data)));
                black_box(r.peek());
                r.release();
            })
        });
    }
    g.throughput(Throughput::Elements(BATCH));
    let (mut w, mut r) = handoff_ring(4096, 256).expect("ring");
    let data = [3u8; 64];
    g.bench_function("push_32_view_release_32", |b| {
        b.iter_batched(
            || {
                for _ in 0..BATCH {
                    assert!(w.push(&data));
                }
            },
            |()| {
                let view = r.published();
                for i in 0..BATCH as usize {
                    black_box(view.get(i));
                }
                for _ in 0..BATCH {
                    r.release();
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("hotpath/clock");
    g.bench_function("instant_now", |b| b.iter(|| black_box(Instant::now())));
    g.bench_function("tsc_ticks", |b| {
        b.iter(|| black_box(pinpoll_perf::clock::ticks()))
    });
    let mut samples = pinpoll_perf::report::Samples::new();
    g.bench_function("hdr_record", |b| {
        b.iter(|| samples.record(black_box(std::time::Duration::from_nanos(12_345))))
    });
    g.finish();
}

criterion_group!(benches, send_queue, rings, handoff, clocks);
criterion_main!(benches);
