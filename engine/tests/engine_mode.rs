//! Engine mode on a real device: a pinned worker thread owns the queue
//! pair; this thread hands it operations and takes completions back.

use std::time::Duration;

use pinpoll::{Engine, EngineConfig, EngineEvent, Error, WcOpcode};
use pinpoll_testkit::pair::{cm_pair, target_bytes, WAIT};
use pinpoll_testkit::pattern;

/// Long enough for rxe to finish what was posted.
const SETTLE: Duration = Duration::from_millis(300);

/// Deeper queues than the fast-path tests: the worker batches what it takes.
fn engine_config() -> EngineConfig {
    let mut cfg = pinpoll_testkit::pair::engine_config();
    cfg.qp.max_send_wr = 64;
    cfg.qp.max_recv_wr = 64;
    cfg.qp.cq_depth = 128;
    cfg.slot_count = 64;
    cfg.handoff_depth = 128;
    cfg
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_worker_runs_pinned_to_its_core() {
    let cores = core_affinity::get_core_ids().unwrap();
    let last = cores.last().unwrap().id;
    let mut cfg = engine_config();
    cfg.core = Some(last);
    let (client, _server) = cm_pair(&cfg);
    let engine = Engine::spawn(client, &cfg).unwrap();
    assert_eq!(
        engine.worker_affinity(),
        &[last],
        "sched_getaffinity inside the worker"
    );
    let report = engine.shutdown().unwrap();
    assert_eq!(report.affinity, [last]);

    // A core that does not exist is a configuration error, before any I/O.
    cfg.core = Some(cores.len() + 64);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn operations_round_trip_through_the_worker() {
    let cfg = engine_config();
    let (client, mut server) = cm_pair(&cfg);
    let mut engine = Engine::spawn(client, &cfg).unwrap();

    for len in [8usize, 64, 65, 4096] {
        let data = pattern(len, len as u8);
        engine.signal_next().try_send(&data).unwrap();
        assert_eq!(
            server.recv().unwrap().data,
            &data[..],
            "{len} B to the server"
        );
        let mut sent = false;
        let mut received = false;
        while !(sent && received) {
            match engine.wait().unwrap() {
                EngineEvent::Completed { opcode, .. } => {
                    assert_eq!(opcode, WcOpcode::SEND);
                    sent = true;
                    server.send(&data).unwrap();
                }
                EngineEvent::Received { data: got } => {
                    assert_eq!(got, &data[..], "{len} B back from the server");
                    received = true;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    let data = pattern(3000, 7);
    let id = engine
        .signal_next()
        .try_write(&data, 8192, Some(0xfeed))
        .unwrap();
    let imm = server.recv().unwrap();
    assert_eq!((imm.imm, imm.len), (Some(0xfeed), 3000));
    assert_eq!(&target_bytes(&server, 8192..11192)[..], &data[..]);
    assert!(
        matches!(engine.wait().unwrap(), EngineEvent::Completed { id: done, .. } if done == id)
    );

    let published = pattern(2048, 31);
    server.target_mut().copy_from(0, &published).unwrap();
    let id = engine.try_read(0, 2048).unwrap();
    match engine.wait().unwrap() {
        EngineEvent::ReadCompleted { id: done, data } => {
            assert_eq!(done, id);
            assert_eq!(data, &published[..]);
        }
        other => panic!("unexpected {other:?}"),
    }

    // Bad input is refused before it reaches the worker.
    assert!(matches!(
        engine.try_write(&[0; 8], server.target().len() as u64, None),
        Err(Error::OutOfRegion { .. })
    ));
    assert!(matches!(
        engine.try_send(&vec![0; 4097]),
        Err(Error::TooLarge {
            len: 4097,
            limit: 4096
        })
    ));
    engine.shutdown().unwrap();
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_full_queue_is_backpressure_and_shutdown_drains_everything() {
    let cfg = engine_config();
    let (client, server) = cm_pair(&cfg);
    let mut engine = Engine::spawn(client, &cfg).unwrap();
    let data = pattern(512, 3);
    // Submit without ever taking completions: the hand-off queues fill.
    let mut submitted = 0u64;
    let mut full = 0;
    for i in 0..5000u64 {
        match engine.try_write(&data, (i % 64) * 512, None) {
            Ok(_) => submitted += 1,
            Err(Error::Full { .. }) => {
                full += 1;
                if full > 100 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        full > 0,
        "5000 writes into queues of 128 must meet back-pressure"
    );
    let report = engine.shutdown().unwrap();
    // Every write, plus the one signaled zero-length write that drains an
    // unsignaled tail, completed; nothing failed, nothing is left.
    let s = report.stats;
    assert_eq!(s.failed + s.flushed, 0, "{s:?}");
    assert_eq!(s.completed, s.posted, "{s:?}");
    assert!(
        s.posted == submitted || s.posted == submitted + 1,
        "{s:?} vs {submitted}"
    );
    assert_eq!(&target_bytes(&server, 0..512)[..], &data[..]);
}

/// The worker's id map and event queue are sized from the connection's
/// send queue, not from the config given to `spawn`: with a smaller
/// `max_send_wr` there, ids of requests more than its depth apart shared
/// one entry and completions named the wrong operations.
#[test]
#[ignore = "needs an RDMA device"]
fn engine_ids_follow_the_connection_whatever_the_spawn_config_says() {
    let mut cfg = engine_config();
    // The peer's receiver-not-ready timer at its longest (655 ms): a SEND
    // the server has no receive for holds everything behind it.
    cfg.qp.min_rnr_timer = 0;
    cfg.qp.rnr_retry = 6;
    let (client, mut server) = cm_pair(&cfg);
    let mut spawn_cfg = cfg.clone();
    spawn_cfg.qp.max_send_wr = 16;
    let mut engine = Engine::spawn(client, &spawn_cfg).unwrap();
    let data = pattern(64, 9);
    // One SEND more than the server has receives posted, and more than
    // spawn_cfg's depth behind it: all outstanding at once.
    let n = u64::from(cfg.qp.max_recv_wr) + 1 + 24;
    let mut submitted = Vec::new();
    for _ in 0..n {
        submitted.push(engine.signal_next().try_send(&data).unwrap());
    }
    // Only now does the server take messages (and repost).
    std::thread::sleep(Duration::from_millis(200));
    let taker = std::thread::spawn(move || {
        for _ in 0..n {
            server.recv().expect("every SEND arrives");
        }
        server
    });
    let mut completed = Vec::new();
    while (completed.len() as u64) < n {
        // Bounded: the engine's wait ends in its completion timeout.
        match engine.wait().unwrap() {
            EngineEvent::Completed { id, opcode } => {
                assert_eq!(opcode, WcOpcode::SEND);
                completed.push(id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    completed.sort_unstable();
    assert_eq!(
        completed, submitted,
        "each operation completed once, under its own id"
    );
    engine.shutdown().unwrap();
    drop(taker.join().expect("the server took every SEND"));
}

/// After a failure every operation the NIC had not done is reported once,
/// `Flushed` (or as the failure itself) under its own id; an operation it
/// had done is never reported lost, though its completion was silent and
/// retired by a flush; the engine's own requests (the drain's marker)
/// report nothing. Before, the silent ones were reported `Flushed` when
/// the receive failure was judged first, and a marker's flush came over
/// under whatever id last used its entry.
#[test]
#[ignore = "needs an RDMA device"]
fn a_failure_reports_each_undelivered_operation_once_and_no_delivered_one() {
    let base = engine_config();
    let cfg = {
        let mut built = base;
        built.qp.max_send_wr = 256;
        built.qp.cq_depth = 512;
        // The peer's receiver-not-ready timer at its longest (6 retries
        // of 655 ms): a SEND it has no receive for holds all behind it.
        built.qp.min_rnr_timer = 0;
        built.qp.rnr_retry = 6;
        built.batch_size = 16;
        built.signal_interval = 200;
        built.slot_count = 256;
        built.handoff_depth = 256;
        built.heartbeat_interval = None;
        built
    };
    // The server's slots are larger: its 6000-byte SEND overruns the
    // client's 4096-byte receive, which fails the client's connection.
    let server_cfg = {
        let mut built = cfg.clone();
        built.slot_size = 8192;
        built
    };
    let listener = pinpoll::connect::cm::Listener::bind(pinpoll_testkit::cm_addr()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        pinpoll::Connection::accept(&listener, &server_cfg, WAIT).expect("accept")
    });
    let client = pinpoll::Connection::connect(addr, &cfg).expect("connect");
    let mut server = server.join().unwrap();
    let mut engine = Engine::spawn(client, &cfg).unwrap();

    // As many SENDs as the server has receives: delivered, unsignaled.
    let delivered: Vec<u64> = (0..cfg.qp.max_recv_wr)
        .map(|_| engine.try_send(&[1u8; 32]).unwrap())
        .collect();
    // One SEND more stalls in RNR, and 150 WRITEs queue behind it.
    let mut stalled = vec![engine.try_send(&[2u8; 32]).unwrap()];
    stalled.extend((0..150u64).map(|i| engine.try_write(&[7u8; 8], i * 8, None).unwrap()));
    std::thread::sleep(SETTLE);
    server.try_send(&pattern(6000, 1)).unwrap();

    let mut reported = Vec::new();
    let mut receive_failed = 0;
    let wait = std::time::Instant::now();
    while reported.len() < stalled.len() || wait.elapsed() < SETTLE {
        match engine.poll() {
            Some(EngineEvent::Failed(e)) if e.opcode == Some(WcOpcode::RECV) => receive_failed += 1,
            Some(EngineEvent::Failed(e)) => reported.push(e.wr_id),
            Some(EngineEvent::Flushed { id } | EngineEvent::Refused { id }) => reported.push(id),
            Some(EngineEvent::RecvFlushed) => {}
            Some(other) => panic!("unexpected {other:?}"),
            None => assert!(
                wait.elapsed() < WAIT,
                "{} of {} stalled operations reported",
                reported.len(),
                stalled.len()
            ),
        }
    }
    assert!(receive_failed <= 1, "one failure at most: {receive_failed}");
    let lost: Vec<_> = reported
        .iter()
        .filter(|id| delivered.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "delivered operations reported lost: {lost:?}"
    );
    reported.sort_unstable();
    assert_eq!(
        reported, stalled,
        "each stalled operation once, under its own id"
    );
    let report = engine.shutdown().expect("the worker drained and stopped");
    assert_eq!(
        report.stats.undelivered,
        stalled.len() as u64,
        "{:?}",
        report.stats
    );
    assert_eq!(
        report.stats.completed,
        delivered.len() as u64,
        "{:?}",
        report.stats
    );
}

/// A worker that stopped (here: its peer left) is reported as stopped,
/// never as a full queue forever: a retry loop on `Full` would spin. Its
/// peer's leaving is news (`PeerLost`), not an error of the session.
#[test]
#[ignore = "needs an RDMA device"]
fn a_stopped_worker_says_so_instead_of_full_forever() {
    let cfg = engine_config();
    let (client, server) = cm_pair(&cfg);
    let mut engine = Engine::spawn(client, &cfg).unwrap();
    drop(server);
    let mut peer_lost = false;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never noticed its peer left"
        );
        match engine.wait() {
            Err(Error::WorkerStopped) => break,
            Ok(EngineEvent::PeerLost) => peer_lost = true,
            Err(Error::Timeout { .. }) | Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        peer_lost,
        "the application was told before the worker ended"
    );
    assert!(!engine.is_running());
    // Nothing drains the hand-off queue now: once it is full, the refusal
    // names the stopped worker.
    let data = pattern(64, 5);
    let mut accepted = 0u32;
    let refusal = loop {
        match engine.try_send(&data) {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted <= 2 * cfg.handoff_depth, "the queue never filled");
    };
    assert!(matches!(refusal, Error::WorkerStopped), "{refusal}");
    assert!(!refusal.is_retryable());
    let report = engine.shutdown().expect("a peer that left is no error");
    assert!(report.peer_left, "{report:?}");
}

/// Messages that arrived before the peer left are all handed on, even
/// when the application takes them late: the worker ends only once a poll
/// with room found nothing more. (Ending as soon as nothing of its own was
/// in flight lost what still waited in the receive CQ.)
#[test]
#[ignore = "needs an RDMA device"]
fn messages_before_the_peer_left_are_all_handed_on() {
    let mut cfg = engine_config();
    cfg.qp.max_recv_wr = 128;
    cfg.qp.cq_depth = 256;
    cfg.handoff_depth = 128;
    let (client, mut server) = cm_pair(&cfg);
    let mut engine = Engine::spawn(client, &cfg).unwrap();
    let sent: Vec<Vec<u8>> = (0..100u8).map(|i| pattern(200, i)).collect();
    for msg in &sent {
        server.send(msg).unwrap();
    }
    // close() delivers every SEND before it disconnects.
    server.close().unwrap();
    // Taken late: the worker's hand-off ring holds fewer than 100, so
    // some wait in the CQ until the application makes room.
    std::thread::sleep(Duration::from_secs(2));
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        assert!(std::time::Instant::now() < deadline, "got {}", got.len());
        match engine.wait() {
            Ok(EngineEvent::Received { data }) => got.push(data.to_vec()),
            Ok(EngineEvent::PeerLost) => break,
            Err(Error::Timeout { .. }) | Ok(_) => {}
            Err(e) => panic!("after {} messages: {e}: {:?}", got.len(), engine.shutdown()),
        }
    }
    assert_eq!(got.len(), sent.len(), "every message before PeerLost");
    assert!(got == sent, "byte for byte, in order");
    assert!(engine.shutdown().unwrap().peer_left);
}

/// Requests that completed unsignaled before the peer left make no
/// completion of their own: the worker retires them with a marker (as
/// `close` does) and still ends with PeerLost. (It waited for them
/// forever.)
#[test]
#[ignore = "needs an RDMA device"]
fn silent_completions_before_the_peer_left_do_not_keep_the_worker() {
    let mut cfg = engine_config();
    cfg.heartbeat_interval = None;
    let (client, mut server) = cm_pair(&cfg);
    let mut engine = Engine::spawn(client, &cfg).unwrap();
    for i in 0..3u8 {
        engine.try_send(&pattern(32, i)).unwrap();
    }
    for i in 0..3u8 {
        assert_eq!(server.recv().unwrap().data, &pattern(32, i)[..]);
    }
    drop(server);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no PeerLost: the worker waits for its silent requests"
        );
        match engine.wait() {
            Ok(EngineEvent::PeerLost) => break,
            Ok(EngineEvent::Failed(e)) => panic!("the end is no failure: {e}"),
            Err(Error::Timeout { .. }) | Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let report = engine.shutdown().unwrap();
    assert!(report.peer_left, "{report:?}");
    assert_eq!(
        report.stats.undelivered, 0,
        "all three were delivered: {report:?}"
    );
}
