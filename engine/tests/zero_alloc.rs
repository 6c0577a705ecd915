//! Zero heap allocations on the data path, as a measured fact: a counting
//! global allocator, a warm-up, then 100 000 operations of each kind — SEND,
//! WRITE, WRITE_WITH_IMM, READ and a mixed batch — in direct mode and in
//! engine mode, with the allocation count unchanged. The peer (a direct-mode
//! connection on another thread of this process) is counted too.
//!
//! Runs without the libtest harness, whose own threads allocate (e.g. the
//! "has been running for over 60 seconds" notice) and would be counted.
//! Like a harnessed device test it runs only with `--include-ignored`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::cm_addr;
use pinpoll::alloc::CountingAllocator;
use pinpoll::connect::cm::Listener;
use pinpoll::{Connection, Engine, EngineConfig, EngineEvent, Error, Event, QpConfig};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const OPS: u64 = 100_000;
const WARM_UP: u64 = 2_000;
/// Messages the server consumes before it acknowledges with one SEND: the
/// client never has more in flight than the server has receives posted.
const WINDOW: u64 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    WriteImm,
    Read,
    Mixed,
}

const KINDS: [Kind; 5] = [
    Kind::Send,
    Kind::Write,
    Kind::WriteImm,
    Kind::Read,
    Kind::Mixed,
];

fn config() -> EngineConfig {
    EngineConfig {
        qp: QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            cq_depth: 256,
            max_inline_data: 64,
            timeout: 14,
            retry_count: 7,
            rnr_retry: 6,
            connect_timeout: Duration::from_secs(10),
            ..QpConfig::default()
        },
        batch_size: 16,
        signal_interval: 16,
        inline_threshold: 64,
        slot_size: 1024,
        slot_count: 64,
        handoff_depth: 256,
        completion_timeout: Duration::from_secs(30),
        ..EngineConfig::default()
    }
}

/// The peer: consumes SENDs and immediates, acknowledging every WINDOW.
fn serve(mut conn: Connection, stop: Arc<AtomicBool>, consumed: Arc<AtomicU64>) {
    let ack = [0xACu8; 8];
    let mut since_ack = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut got = 0u64;
        conn.poll(|ev| match ev {
            Event::Received { .. } | Event::WriteImm { .. } => got += 1,
            Event::Failed(e) => panic!("server: {e}"),
            _ => {}
        })
        .unwrap();
        if got > 0 {
            consumed.fetch_add(got, Ordering::Relaxed);
            since_ack += got;
            while since_ack >= WINDOW {
                since_ack -= WINDOW;
                conn.send(&ack).unwrap();
            }
        }
    }
}

fn direct(client: &mut Connection, kind: Kind, n: u64) {
    let small = [1u8; 48]; // inline
    let large = [2u8; 600]; // through the send ring
    let payload = |i: u64| {
        if i.is_multiple_of(2) {
            &small[..]
        } else {
            &large[..]
        }
    };
    let wait_ack = |client: &mut Connection| {
        let got = client.recv().unwrap();
        assert_eq!(got.data, &[0xAC; 8]);
    };
    match kind {
        Kind::Send | Kind::WriteImm => {
            for w in 0..n / WINDOW {
                for i in 0..WINDOW {
                    if kind == Kind::Send {
                        client.send(payload(i)).unwrap();
                    } else {
                        client
                            .write(payload(i), (i % 32) * 1024, Some((w * WINDOW + i) as u32))
                            .unwrap();
                    }
                }
                wait_ack(client);
            }
        }
        Kind::Write => {
            for i in 0..n {
                client.write(payload(i), (i % 32) * 1024, None).unwrap();
            }
        }
        Kind::Read => {
            for i in 0..n / 8 {
                let mut batch = client.batch();
                for j in 0..8 {
                    batch.read(((i + j) % 32) * 1024, 256).unwrap();
                }
                batch.post().unwrap();
                let mut done = 0;
                while done < 8 {
                    client
                        .poll(|ev| match ev {
                            Event::ReadCompleted { data, .. } => {
                                assert_eq!(data.len(), 256);
                                done += 1;
                            }
                            Event::Failed(e) => panic!("{e}"),
                            _ => {}
                        })
                        .unwrap();
                }
            }
        }
        Kind::Mixed => {
            // Each round: send, write, write-with-imm, read in one batch.
            let mut consumed = 0;
            for round in 0..n / 4 {
                while client.outstanding() + 4 > 128 - 16 {
                    client.reap().unwrap();
                }
                let mut batch = client.batch();
                batch.send(payload(round)).unwrap();
                batch.write(payload(round + 1), 0, None).unwrap();
                batch
                    .write(payload(round), 2048, Some(round as u32))
                    .unwrap();
                batch.read(4096, 128).unwrap();
                batch.post().unwrap();
                consumed += 2;
                if consumed == WINDOW {
                    consumed = 0;
                    wait_ack(client);
                }
            }
        }
    }
    client
        .wait_idle(|ev| assert!(!matches!(ev, Event::Failed(_)), "{ev:?}"))
        .unwrap();
}

/// Submits through the worker, retrying on back-pressure while taking
/// completions; returns how many acknowledgements (SENDs) arrived.
fn engine(e: &mut Engine, kind: Kind, n: u64) {
    let small = [1u8; 48];
    let large = [2u8; 600];
    let mut acks = 0u64;
    let mut reads_done = 0u64;
    let drain = |e: &mut Engine, acks: &mut u64, reads: &mut u64| {
        while let Some(c) = e.poll() {
            match c {
                EngineEvent::Received { data } => {
                    assert_eq!(data, &[0xAC; 8]);
                    *acks += 1;
                }
                EngineEvent::ReadCompleted { .. } => *reads += 1,
                EngineEvent::Failed(err) => panic!("{err}"),
                EngineEvent::Refused { id } => panic!("op {id} refused"),
                _ => {}
            }
        }
    };
    let submit = |e: &mut Engine,
                  acks: &mut u64,
                  reads: &mut u64,
                  f: &mut dyn FnMut(&mut Engine) -> pinpoll::Result<u64>| loop {
        match f(e) {
            Ok(_) => return,
            Err(Error::Full { .. }) => drain(e, acks, reads),
            Err(err) => panic!("{err}"),
        }
    };
    let mut recv_consuming = 0u64;
    let mut reads_posted = 0u64;
    for i in 0..n {
        let data: &[u8] = if i.is_multiple_of(2) { &small } else { &large };
        let op = match kind {
            Kind::Mixed => [Kind::Send, Kind::Write, Kind::WriteImm, Kind::Read][(i % 4) as usize],
            k => k,
        };
        // Never more un-acknowledged messages than the server has receives.
        if matches!(op, Kind::Send | Kind::WriteImm) {
            while recv_consuming >= (acks + 2) * WINDOW {
                drain(e, &mut acks, &mut reads_done);
            }
            recv_consuming += 1;
        }
        match op {
            Kind::Send => submit(e, &mut acks, &mut reads_done, &mut |e| e.send(data)),
            Kind::Write => submit(e, &mut acks, &mut reads_done, &mut |e| {
                e.write(data, (i % 32) * 1024, None)
            }),
            Kind::WriteImm => submit(e, &mut acks, &mut reads_done, &mut |e| {
                e.write(data, (i % 32) * 1024, Some(i as u32))
            }),
            Kind::Read => {
                reads_posted += 1;
                submit(e, &mut acks, &mut reads_done, &mut |e| {
                    e.read((i % 32) * 1024, 256)
                })
            }
            Kind::Mixed => unreachable!(),
        }
    }
    while acks < recv_consuming / WINDOW || reads_done < reads_posted {
        drain(e, &mut acks, &mut reads_done);
    }
}

fn pair(
    cfg: &EngineConfig,
) -> (
    Connection,
    std::thread::JoinHandle<()>,
    Arc<AtomicBool>,
    Arc<AtomicU64>,
) {
    let listener = Listener::bind(cm_addr()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (scfg, stop, consumed) = (
        cfg.clone(),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (s2, c2) = (Arc::clone(&stop), Arc::clone(&consumed));
    let server = std::thread::spawn(move || {
        let conn = Connection::accept(&listener, &scfg, Duration::from_secs(10)).unwrap();
        serve(conn, s2, c2)
    });
    (
        Connection::connect(addr, cfg).unwrap(),
        server,
        stop,
        consumed,
    )
}

const NAME: &str = "the_data_path_never_allocates";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args
        .iter()
        .any(|a| a == "--include-ignored" || a == "--ignored")
    {
        println!("test {NAME} ... ignored, needs an RDMA device");
        println!("\ntest result: ok. 0 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out");
        return;
    }
    println!("running 1 test");
    the_data_path_never_allocates();
    println!("test {NAME} ... ok");
    println!("\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}

fn the_data_path_never_allocates() {
    let cfg = config();

    // Direct mode.
    let (mut client, server, stop, consumed) = pair(&cfg);
    for kind in KINDS {
        direct(&mut client, kind, WARM_UP);
    }
    for kind in KINDS {
        let before = ALLOCATOR.allocations();
        direct(&mut client, kind, OPS);
        let after = ALLOCATOR.allocations();
        assert_eq!(
            after - before,
            0,
            "direct mode, {OPS} x {kind:?}: {} allocations",
            after - before
        );
        eprintln!("direct {kind:?}: {OPS} operations, 0 allocations");
    }
    let stats = client.stats();
    assert_eq!((stats.failed, stats.flushed), (0, 0));
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    assert!(
        consumed.load(Ordering::Relaxed) >= 3 * OPS / 2,
        "the server saw the messages"
    );
    drop(client);

    // Engine mode: the worker and this thread, both counted.
    let (client, server, stop, _) = pair(&cfg);
    let mut e = Engine::spawn(client, &cfg).unwrap();
    for kind in KINDS {
        engine(&mut e, kind, WARM_UP);
    }
    for kind in KINDS {
        let before = ALLOCATOR.allocations();
        engine(&mut e, kind, OPS);
        let after = ALLOCATOR.allocations();
        assert_eq!(
            after - before,
            0,
            "engine mode, {OPS} x {kind:?}: {} allocations",
            after - before
        );
        eprintln!("engine {kind:?}: {OPS} operations, 0 allocations");
    }
    let report = e.shutdown().unwrap();
    assert_eq!(
        (report.stats.failed, report.stats.flushed),
        (0, 0),
        "{:?}",
        report.stats
    );
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}
