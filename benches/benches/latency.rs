//! Ping-pong latency on an RDMA device, both sides in this process on two
//! pinned threads over a loopback connection: RDMA WRITE (the receiver
//! spins on the last byte, as perftest does), SEND/RECV and READ, at 8, 64,
//! 256 (inline where the device allows) and 4096 bytes, in engine mode and
//! direct mode. Criterion's time per iteration is one FULL round trip
//! (perftest prints half of it for WRITE and SEND).
//!
//! `scripts/softroce-vm -- cargo bench -p pinpoll-benches --bench latency`

use std::time::Instant;

use criterion::{BenchmarkId, Criterion};
use pinpoll_benches::{config, device, pair, pin_measuring_thread, SERVER_CORE};
use pinpoll_perf::session::Loopback;
use pinpoll_perf::{Kind, Mode, Plan};

const SIZES: [usize; 4] = [8, 64, 256, 4096];
/// Inline up to 256 bytes where the device allows it.
const INLINE: u32 = 256;

fn bench(c: &mut Criterion, dev: &str, mode: Mode) {
    for kind in [Kind::WriteLat, Kind::SendLat, Kind::ReadLat] {
        let mut group = c.benchmark_group(format!("latency/{}/{}", mode.name(), kind.name()));
        for size in SIZES {
            // Inline up to 256 B where the device allows it (creating the
            // queue pair fails where it does not): else the profile's.
            let inline = config(kind, mode, size, Some(INLINE));
            let plan = Plan::new(kind, mode, size, inline.qp.max_recv_wr);
            let mut lb = match Loopback::start(plan, &inline, Some(dev), Some(SERVER_CORE)) {
                Ok(lb) => lb,
                Err(_) => pair(dev, kind, mode, size, &config(kind, mode, size, None)),
            };
            group.bench_function(BenchmarkId::from_parameter(size), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        lb.driver.round_trip().expect("round trip");
                    }
                    start.elapsed()
                })
            });
            lb.finish().expect("teardown");
        }
        group.finish();
    }
}

fn main() {
    let Some(dev) = device("latency") else {
        return;
    };
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3))
        .configure_from_args();
    // Engine mode first, while this thread is still unpinned (the worker
    // takes the client core); then this thread pins itself for direct mode.
    bench(&mut c, &dev, Mode::Engine);
    pin_measuring_thread();
    bench(&mut c, &dev, Mode::Direct);
    c.final_summary();
}
