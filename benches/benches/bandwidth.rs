//! Streaming bandwidth on an RDMA device in direct mode, with batching
//! (the `throughput` profile: 32 work requests per doorbell, one signaled
//! completion per 32): RDMA WRITE, WRITE_WITH_IMM, SEND and READ at 64 B,
//! 4 KiB, 64 KiB and 1 MiB, reported as bytes per second. Both sides run
//! in this process on two pinned threads; SEND and WRITE_WITH_IMM are
//! paced by credits from the receiver, so nothing is ever RNR-retried.
//!
//! `scripts/softroce-vm -- cargo bench -p pinpoll-benches --bench bandwidth`

use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use pinpoll_benches::{config, device, pair, pin_measuring_thread};
use pinpoll_perf::{Kind, Mode};

const SIZES: [usize; 4] = [64, 4096, 65536, 1 << 20];

fn main() {
    let Some(dev) = device("bandwidth") else {
        return;
    };
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3))
        .configure_from_args();
    pin_measuring_thread();
    for kind in [Kind::WriteBw, Kind::WriteImmBw, Kind::SendBw, Kind::ReadBw] {
        let mut group = c.benchmark_group(format!("bandwidth/{}", kind.name()));
        for size in SIZES {
            // Operations per criterion iteration: enough to fill the
            // pipeline (several batches), few enough for large messages.
            let ops: u64 = if size <= 4096 { 256 } else { 16 };
            let cfg = config(kind, Mode::Direct, size, None);
            let mut lb = pair(&dev, kind, Mode::Direct, size, &cfg);
            group.throughput(Throughput::Bytes(size as u64 * ops));
            group.bench_function(BenchmarkId::from_parameter(size), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    lb.driver.stream(iters * ops).expect("stream");
                    start.elapsed()
                })
            });
            lb.finish().expect("teardown");
        }
        group.finish();
    }
    c.final_summary();
}
