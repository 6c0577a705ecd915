//! The instruction-count guard of the hot path, on a real device: post →
//! poll → dispatch, counted by callgrind (iai-callgrind), with hard limits
//! that fail `cargo bench` when a change makes them dearer.
//!
//! Instruction counts are deterministic, which is what makes them a guard
//! (a timing never could be). Posting and reaping are counted apart, per
//! request and per completion: a `post_*` bench hands one request (or one
//! batch of 32) to the provider, doorbell included, and its teardown reaps
//! it outside the count; a `reap_*` bench's setup posts and gives rxe time,
//! so its one poll finds the completion already there (checked, never
//! assumed) — no empty poll, whose number depends on timing, is counted.
//! Setup and teardown are not counted (iai-callgrind toggles collection
//! around the benchmark function). The counts include the provider and
//! libibverbs in user space (not the kernel);
//! `scripts/hot-path-instructions.sh` splits them by object, pinpoll's
//! own share first.
//!
//! Needs an RDMA device (`$PINPOLL_DEVICE`): run it in the guest with
//! `scripts/softroce-vm -- cargo bench -p pinpoll-benches --bench hot_path`,
//! or as `scripts/test.sh` does. Needs valgrind and `iai-callgrind-runner`
//! of the same version as the `iai-callgrind` crate.

use std::hint::black_box;
use std::time::Duration;

use iai_callgrind::{
    library_benchmark, library_benchmark_group, main, Callgrind, EventKind, LibraryBenchmarkConfig,
};
use pinpoll::{Connection, EngineConfig, Event};

/// Long enough for rxe to finish any of these operations, so the one poll
/// after it always finds the completion (checked, never assumed).
const SETTLE: Duration = Duration::from_millis(200);

/// A connected pair in this process; only the client thread runs while
/// measuring (the peer's side of WRITE, READ and SEND is the kernel's).
/// Boxed: a benchmark takes and returns it, and moving two connections
/// by value would count a kilobyte-sized memcpy into every figure.
type Pair = Box<Connected>;

struct Connected {
    client: Connection,
    server: Connection,
}

fn connected(signal_interval: u32, batch_size: u32) -> Pair {
    let device = pinpoll_testkit::device();
    let mut cfg = EngineConfig::load("latency").expect("the built-in latency profile");
    cfg.signal_interval = signal_interval;
    cfg.batch_size = batch_size;
    cfg.slot_count = cfg.slot_count.max(2 * batch_size);
    cfg.qp.max_send_wr = cfg.qp.max_send_wr.max(batch_size + signal_interval);
    cfg.qp.cq_depth = cfg.qp.cq_depth.max(2 * cfg.qp.max_send_wr);
    cfg.heartbeat_interval = None;
    let (client, server) = pinpoll_perf::session::loopback_pair(&cfg, Some(&device))
        .expect("a connected pair over the device");
    Box::new(Connected { client, server })
}

/// A benchmark's hard limit: its instructions (Ir, every object in user
/// space) as measured in the SoftRoCE guest (`scripts/hot-path-instructions.sh`,
/// table in BENCHMARKS.md) plus about 10 %. Going over fails `cargo bench`.
fn limit(instructions: u64) -> LibraryBenchmarkConfig {
    let mut config = LibraryBenchmarkConfig::default();
    config.tool(Callgrind::default().hard_limits([(EventKind::Ir, instructions)]));
    config
}

fn every_request_signaled() -> Pair {
    connected(1, 1)
}

fn batches_of_32() -> Pair {
    connected(32, 32)
}

/// Gives rxe time to finish what was posted, then reaps it (outside the
/// count): the next measured post finds an empty queue.
fn settle_and_reap(mut pair: Pair) -> Pair {
    std::thread::sleep(SETTLE);
    while pair.client.outstanding() > 0 {
        assert!(pair.client.reap().unwrap() > 0, "the completion arrived");
    }
    while pair.server.try_recv().unwrap().is_some() {}
    pair
}

fn close(pair: Pair) {
    drop(settle_and_reap(pair));
}

/// A pair whose one signaled WRITE of 8 bytes has completed, unreaped.
fn write_done() -> Pair {
    let mut pair = every_request_signaled();
    pair.client.try_write(&[7u8; 8], 0, None).unwrap();
    std::thread::sleep(SETTLE);
    pair
}

/// A pair whose client SENT 8 bytes, arrived and completed, unreaped.
fn send_done() -> Pair {
    let mut pair = every_request_signaled();
    pair.client.try_send(&[7u8; 8]).unwrap();
    std::thread::sleep(SETTLE);
    pair
}

/// A pair whose one READ of 8 bytes has completed, unreaped.
fn read_done() -> Pair {
    let mut pair = every_request_signaled();
    pair.client.try_read(0, 8).unwrap();
    std::thread::sleep(SETTLE);
    pair
}

/// A pair whose batch of 32 WRITEs (one signaled) has completed.
fn batch_done() -> Pair {
    let mut pair = batches_of_32();
    let mut batch = pair.client.batch();
    for i in 0..32 {
        batch.write(&[9u8; 64], i * 64, None).unwrap();
    }
    assert_eq!(batch.post().unwrap(), 32);
    std::thread::sleep(SETTLE);
    pair
}

// Posting: one request (or one batch) handed to the provider, doorbell
// included; its completion is reaped by the teardown, outside the count.

#[library_benchmark]
#[bench::inline(setup = every_request_signaled, teardown = close, config = limit(430))]
fn post_write_8b(mut pair: Pair) -> Pair {
    black_box(
        pair.client
            .try_write(black_box(&[7u8; 8]), 0, None)
            .unwrap(),
    );
    pair
}

#[library_benchmark]
#[bench::inline(setup = every_request_signaled, teardown = close, config = limit(420))]
fn post_send_8b(mut pair: Pair) -> Pair {
    black_box(pair.client.try_send(black_box(&[7u8; 8])).unwrap());
    pair
}

#[library_benchmark]
#[bench::one(setup = every_request_signaled, teardown = close, config = limit(420))]
fn post_read_8b(mut pair: Pair) -> Pair {
    black_box(pair.client.try_read(0, black_box(8)).unwrap());
    pair
}

#[library_benchmark]
#[bench::one_doorbell(setup = batches_of_32, teardown = close, config = limit(9000))]
fn post_write_32x64b(mut pair: Pair) -> Pair {
    let data = [9u8; 64];
    let mut batch = pair.client.batch();
    for i in 0..32 {
        batch.write(black_box(&data), i * 64, None).unwrap();
    }
    assert_eq!(batch.post().unwrap(), 32);
    pair
}

// Reaping: one poll that finds the completion already there (set up,
// then given time), so no empty poll is ever counted.

#[library_benchmark]
#[bench::write(setup = write_done, teardown = close, config = limit(225))]
fn reap_write(mut pair: Pair) -> Pair {
    assert_eq!(pair.client.reap().unwrap(), 1, "the WRITE's completion");
    assert_eq!(pair.client.outstanding(), 0);
    pair
}

#[library_benchmark]
#[bench::send(setup = send_done, teardown = close, config = limit(440))]
fn reap_send_and_receive(mut pair: Pair) -> Pair {
    let got = pair.server.try_recv().unwrap().expect("the SEND arrived");
    assert_eq!(black_box(got.data), &[7u8; 8]);
    assert_eq!(pair.client.reap().unwrap(), 1, "the SEND's completion");
    pair
}

#[library_benchmark]
#[bench::read(setup = read_done, teardown = close, config = limit(290))]
fn reap_read_and_dispatch(mut pair: Pair) -> Pair {
    let mut delivered = 0;
    pair.client
        .poll(|ev| {
            if let Event::ReadCompleted { data, .. } = ev {
                assert_eq!(black_box(data).len(), 8);
                delivered += 1;
            }
        })
        .unwrap();
    assert_eq!(delivered, 1, "the READ's data");
    pair
}

#[library_benchmark]
#[bench::batch(setup = batch_done, teardown = close, config = limit(640))]
fn reap_write_32x64b(mut pair: Pair) -> Pair {
    assert_eq!(pair.client.reap().unwrap(), 1, "one signal for the batch");
    assert_eq!(pair.client.outstanding(), 0);
    pair
}

library_benchmark_group!(
    name = post;
    benchmarks = post_write_8b, post_send_8b, post_read_8b, post_write_32x64b
);

library_benchmark_group!(
    name = reap;
    benchmarks = reap_write, reap_send_and_receive, reap_read_and_dispatch, reap_write_32x64b
);

main!(
    config = LibraryBenchmarkConfig::default()
        .pass_through_envs(["PINPOLL_DEVICE", "PINPOLL_ADDR4", "PINPOLL_ADDR6"]);
    library_benchmark_groups = post, reap
);
