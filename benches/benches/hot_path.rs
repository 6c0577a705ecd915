//! The instruction-count guard of the hot path, on a real device: post →
//! poll → dispatch, counted by callgrind (iai-callgrind), with hard limits
//! that fail `cargo bench` when a change makes them dearer.
//!
//! Instruction counts are deterministic, which is what makes them a guard
//! (a timing never could be): each measured function posts, sleeps while
//! rxe does its kernel work (the sleep's own instructions are the same
//! every run), then polls *once* and checks that the completion was there
//! — so no empty poll, whose number depends on timing, is ever counted.
//! The counts include the provider and libibverbs in user space (not the
//! kernel); `scripts/count-instructions.sh` reports pinpoll's own share.
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
struct Pair {
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
    Pair { client, server }
}

fn every_request_signaled() -> Pair {
    connected(1, 1)
}

fn batches_of_32() -> Pair {
    connected(32, 32)
}

fn close(pair: Pair) {
    drop(pair);
}

#[library_benchmark]
#[bench::inline(setup = every_request_signaled, teardown = close)]
fn write_8b_post_poll(mut pair: Pair) -> Pair {
    let seq = pair
        .client
        .try_write(black_box(&[7u8; 8]), 0, None)
        .unwrap();
    std::thread::sleep(SETTLE);
    assert_eq!(pair.client.reap().unwrap(), 1, "the WRITE's completion");
    assert!(pair.client.is_retired(seq));
    pair
}

#[library_benchmark]
#[bench::inline(setup = every_request_signaled, teardown = close)]
fn send_8b_post_poll_receive(mut pair: Pair) -> Pair {
    pair.client.try_send(black_box(&[7u8; 8])).unwrap();
    std::thread::sleep(SETTLE);
    let got = pair.server.try_recv().unwrap().expect("the SEND arrived");
    assert_eq!(black_box(got.data).len(), 8);
    assert_eq!(pair.client.reap().unwrap(), 1, "the SEND's completion");
    pair
}

#[library_benchmark]
#[bench::read(setup = every_request_signaled, teardown = close)]
fn read_8b_post_poll_dispatch(mut pair: Pair) -> Pair {
    let seq = pair.client.try_read(0, 8).unwrap();
    std::thread::sleep(SETTLE);
    let mut delivered = 0;
    pair.client
        .poll(|ev| {
            if let Event::ReadCompleted { seq: done, data } = ev {
                assert_eq!((done, data.len()), (seq, 8));
                delivered += 1;
            }
        })
        .unwrap();
    assert_eq!(delivered, 1, "the READ's data");
    pair
}

#[library_benchmark]
#[bench::batch(setup = batches_of_32, teardown = close)]
fn write_32x64b_one_doorbell(mut pair: Pair) -> Pair {
    let data = [9u8; 64];
    let mut batch = pair.client.batch();
    for i in 0..32 {
        batch.write(black_box(&data), i * 64, None).unwrap();
    }
    assert_eq!(batch.post().unwrap(), 32);
    std::thread::sleep(SETTLE);
    assert_eq!(pair.client.reap().unwrap(), 1, "one signal for the batch");
    assert_eq!(pair.client.outstanding(), 0);
    pair
}

library_benchmark_group!(
    name = hot_path;
    benchmarks = write_8b_post_poll, send_8b_post_poll_receive, read_8b_post_poll_dispatch,
        write_32x64b_one_doorbell
);

main!(
    config = LibraryBenchmarkConfig::default()
        .pass_through_envs(["PINPOLL_DEVICE", "PINPOLL_ADDR4", "PINPOLL_ADDR6"])
        .tool(Callgrind::default().hard_limits([(EventKind::Ir, 1_000_000)]));
    library_benchmark_groups = hot_path
);
