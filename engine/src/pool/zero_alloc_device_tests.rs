//! The pooled data path allocates nothing: four connections on one
//! poller, SENDs both ways, WRITE_WITH_IMM and READ, the shared receive
//! queue refilled, each operation a round trip, counted by the LD_PRELOAD
//! interposer of `engine/tests/zero_alloc.rs` (`tests/malloc_count`),
//! which counts every call of the malloc family in the process: Rust's
//! allocator calls malloc, so Rust's allocations and C's (libibverbs',
//! the provider's) are both in the count. Beside the libtest harness,
//! this test runs itself again, alone, under the interposer; the harness's
//! other thread only waits meanwhile.
//!
//! The poller is crate-private (issue 25): `engine/tests/zero_alloc.rs`
//! cannot reach it, hence a unit test here.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use pinpoll_malloc_count::{is_counted_run, CHeap, FILE_VAR, INTERPOSER};

use super::event::PoolEvent;
use super::poller::{Poller, PoolConfig};
use super::slab::ConnId;
use crate::datapath::device_tests::{config, guest};
use crate::datapath::{Connection, Event};
use crate::sys::mr::Access;

const NAME: &str = "pool::zero_alloc_device_tests::the_pooled_data_path_never_allocates";
/// Operations of each kind (SEND to the poller, SEND from it,
/// WRITE_WITH_IMM, READ), round robin over the connections.
const OPS: u64 = 2_000;
const WARM_UP: u64 = 256;
const CONNECTIONS: usize = 4;
static MESSAGE: [u8; 48] = [7; 48];
/// One round trip, however slow the guest: a stuck one fails the test.
const STEP: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs an RDMA device"]
fn the_pooled_data_path_never_allocates() {
    if cfg!(pinpoll_asan) {
        // ASan's runtime refuses to start beside the interposer: the work
        // runs instrumented, uncounted (the plain build counts it).
        pooled_round_trips(None);
        return;
    }
    if !is_counted_run() {
        let counters =
            std::env::temp_dir().join(format!("pinpoll-malloc-count-pool-{}", std::process::id()));
        std::fs::File::create(&counters).expect("the counter file");
        let status = Command::new(std::env::current_exe().expect("this test binary"))
            .args([NAME, "--exact", "--include-ignored", "--test-threads=1"])
            .env("LD_PRELOAD", INTERPOSER)
            .env(FILE_VAR, &counters)
            .status()
            .expect("run again under the interposer");
        let _ = std::fs::remove_file(&counters);
        assert!(status.success(), "the counted run: {status}");
        return;
    }
    let heap = CHeap::attach().unwrap_or_else(|e| panic!("{e}"));
    // The count is live: an allocation is seen.
    let before = heap.read().expect("the counters");
    let probe = std::hint::black_box(vec![0u8; 4096]);
    drop(probe);
    assert!(
        heap.read().expect("the counters").since(&before).total() > 0,
        "the interposer counts nothing"
    );
    pooled_round_trips(Some(&heap));
}

/// Joins four peers to a poller, warms up, then runs [`OPS`] operations of
/// each kind; with `heap`, none of them may allocate.
fn pooled_round_trips(heap: Option<&CHeap>) {
    let cfg = config();
    let device = guest("PINPOLL_DEVICE");
    let pool = PoolConfig {
        max_connections: CONNECTIONS as u32,
        srq_depth: 32,
        srq_batch: 8,
        srq_grace: Duration::from_millis(200),
        per_conn_budget: 8,
    };
    let mut poller = Poller::new(Some(&device), &cfg, pool).expect("a poller");
    let mut peers = join(&mut poller, &cfg);
    let mut turn = Turns::default();
    for i in 0..WARM_UP * 4 {
        turn.step(&mut poller, &mut peers, i);
    }
    let before = heap.map(|h| h.read().expect("the counters"));
    for i in 0..OPS * 4 {
        turn.step(&mut poller, &mut peers, i);
    }
    if let (Some(heap), Some(before)) = (heap, before) {
        let calls = heap.read().expect("the counters").since(&before);
        assert_eq!(
            calls.total(),
            0,
            "the pooled data path allocated: {calls} in {} operations",
            OPS * 4
        );
    }
    assert_eq!(turn.done, (OPS + WARM_UP) * 4, "every operation came round");
}

fn join(poller: &mut Poller, cfg: &crate::config::EngineConfig) -> Vec<(ConnId, Connection)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    let access = Access::REMOTE_WRITE | Access::REMOTE_READ;
    (0..CONNECTIONS)
        .map(|_| {
            let cfg = cfg.clone();
            let peer = std::thread::spawn(move || {
                let mut stream = std::net::TcpStream::connect(addr).expect("connect TCP");
                Connection::builder(&cfg)
                    .remote_access(access)
                    .over_tcp(&mut stream)
                    .expect("the peer connects")
            });
            let mut stream = listener.accept().expect("accept TCP").0;
            let id = poller.over_tcp(&mut stream, access).expect("join");
            (id, peer.join().expect("the peer's thread"))
        })
        .collect()
}

/// Operations done, and what the last poll saw.
#[derive(Default)]
struct Turns {
    done: u64,
}

impl Turns {
    /// Operation `i`: its kind and connection round robin; returns once
    /// its effect arrived, both sides polled meanwhile.
    fn step(&mut self, poller: &mut Poller, peers: &mut [(ConnId, Connection)], i: u64) {
        let (id, peer) = &mut peers[(i % CONNECTIONS as u64) as usize];
        let id = *id;
        let deadline = Instant::now() + STEP;
        let mut arrived = false;
        match (i / CONNECTIONS as u64) % 4 {
            0 => {
                peer.try_send(&MESSAGE).expect("the peer's SEND");
                while !arrived {
                    poller
                        .poll(|from, ev| {
                            if let PoolEvent::Conn(Event::Received { data }) = ev {
                                assert!(from == id && data == MESSAGE);
                                arrived = true;
                            }
                        })
                        .expect("the poller polls");
                    peer.poll(|_| {}).expect("the peer polls");
                    assert!(Instant::now() < deadline, "the peer's SEND never arrived");
                }
            }
            kind => {
                let mut conn = poller.conn(id).expect("a live connection");
                match kind {
                    1 => conn.try_send(&MESSAGE).map(drop),
                    2 => conn.try_write(&MESSAGE, 0, Some(i as u32)).map(drop),
                    _ => conn.try_read(0, 64).map(drop),
                }
                .expect("the poller's post");
                while !arrived {
                    poller
                        .poll(|_, ev| {
                            if kind == 3 {
                                arrived |=
                                    matches!(ev, PoolEvent::Conn(Event::ReadCompleted { .. }));
                            }
                        })
                        .expect("the poller polls");
                    peer.poll(|ev| {
                        arrived |= match (kind, ev) {
                            (1, Event::Received { data }) => data == MESSAGE,
                            (2, Event::WriteImm { imm, .. }) => imm == i as u32,
                            _ => false,
                        };
                    })
                    .expect("the peer polls");
                    assert!(Instant::now() < deadline, "operation {i} never came round");
                }
            }
        }
        self.done += 1;
    }
}
