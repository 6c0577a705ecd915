//! What pinpoll's own code costs where no device is needed, so a
//! regression shows without a NIC:
//!
//! - remote-range checks done by every RDMA WRITE/READ,
//! - the engine-mode hand-off ring (push, peek, release; a batch view),
//! - the clocks a measurement can use (why pinpoll-perf reads the TSC).
//!
//! Posting, polling and dispatch need a queue pair and a CQ: their
//! instruction counts are guarded by the `hot_path` bench on the device
//! (`scripts/count-instructions.sh`, BENCHMARKS.md).
//!
//! `cargo bench -p pinpoll-benches --bench hotpath`

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pinpoll::handoff::handoff_ring;
use pinpoll::RemoteSlice;

/// Requests per batch in these benches (the throughput profile's N).
const BATCH: u64 = 32;

fn remote_ranges(c: &mut Criterion) {
    let mut g = c.benchmark_group("hotpath/remote");
    g.throughput(Throughput::Elements(BATCH));
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
    // One iteration is the whole round: 32 pushes, one view of all of
    // them, 32 releases, so the ring is empty again for the next one.
    g.bench_function("push_32_view_release_32", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                assert!(w.push(black_box(&data)));
            }
            let view = r.published();
            assert_eq!(view.len(), BATCH as usize);
            for i in 0..BATCH as usize {
                black_box(view.get(i));
            }
            for _ in 0..BATCH {
                r.release();
            }
        })
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

criterion_group!(benches, remote_ranges, handoff, clocks);
criterion_main!(benches);
