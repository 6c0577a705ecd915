//! Device tests of one poller serving many connections (issue 25, S3.3):
//! the poller's side shares one send CQ, one receive CQ and one shared
//! receive queue; each peer is an ordinary [`Connection`]. Run in the
//! guest like the other device tests.

use std::collections::HashMap;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;
use std::time::Duration;

use super::poller::{Poller, PoolConfig};
use super::slab::ConnId;
use crate::config::EngineConfig;
use crate::datapath::device_tests::{config, guest, pattern};
use crate::datapath::{Connection, Event};
use crate::error::{Error, Misuse};
use crate::sys::mr::Access;
use crate::wait::BoundedWait;

const WAIT: Duration = Duration::from_secs(10);
const MESSAGES: usize = 3;
/// Where the peers' and the poller's WRITEs land in the target rings, and
/// where the poller READs from the peers' rings.
const WRITE_AT: u64 = 0;
const READ_AT: usize = 8192;
const READ_LEN: usize = 700;

fn pool(max_connections: u32) -> PoolConfig {
    PoolConfig {
        max_connections,
        srq_depth: 32,
        srq_batch: 8,
    }
}

fn remote_access() -> Access {
    Access::REMOTE_WRITE | Access::REMOTE_READ
}

/// A peer connecting over TCP to the poller's `listener`, in a thread
/// (both handshakes block until the other side's).
fn peer(
    listener: &TcpListener,
    cfg: &EngineConfig,
) -> JoinHandle<crate::error::Result<Connection>> {
    let addr = listener.local_addr().expect("bound address");
    let cfg = cfg.clone();
    std::thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).expect("connect TCP");
        Connection::builder(&cfg)
            .remote_access(remote_access())
            .over_tcp(&mut stream)
    })
}

/// `n` peers joined to `poller`, in joining order.
fn join(poller: &mut Poller, cfg: &EngineConfig, n: usize) -> Vec<(ConnId, Connection)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    (0..n)
        .map(|_| {
            let client = peer(&listener, cfg);
            let mut stream = listener.accept().expect("accept TCP").0;
            let id = poller
                .over_tcp(&mut stream, remote_access())
                .expect("join the poller");
            (
                id,
                client
                    .join()
                    .expect("peer thread")
                    .expect("the peer connects"),
            )
        })
        .collect()
}

fn message(peer: usize, i: usize) -> Vec<u8> {
    pattern(100 + 37 * peer + 11 * i, (peer * 16 + i) as u8)
}

/// Has every request `conn` posted retire (a signaled marker behind
/// unsignaled ones).
fn settle_peer(conn: &mut Connection) {
    conn.flush_tail().expect("the peer's tail signaled");
    conn.wait_idle(|_| {}).expect("the peer's requests retire");
}

/// Four peers on one poller: every SEND and WRITE_WITH_IMM of each peer
/// reaches the poller as its own connection's, byte for byte; the
/// poller's SENDs, WRITEs and READs on each connection reach that peer
/// alone, and each READ brings back that peer's bytes. A fifth peer is
/// refused before any verb, and the poller saw no stale completion.
#[test]
#[ignore = "needs an RDMA device"]
fn connections_on_one_poller_arrive_byte_exact() {
    let cfg = config();
    let device = guest("PINPOLL_DEVICE");
    let mut poller = Poller::new(Some(&device), &cfg, pool(4)).expect("a poller");
    let mut peers = join(&mut poller, &cfg, 4);
    assert_eq!(poller.len(), 4);
    let ids: Vec<ConnId> = peers.iter().map(|(id, _)| *id).collect();
    let mut indexes: Vec<u32> = ids.iter().map(|id| id.index).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1, 2, 3], "{ids:?}");
    peers_to_poller(&mut poller, &mut peers);
    poller_to_peers(&mut poller, &mut peers);
    a_fifth_is_refused(&mut poller, &cfg);
    assert_eq!(poller.stats().stale, 0, "no completion went astray");
    let stale = ConnId {
        gen: ids[0].gen.wrapping_add(1),
        ..ids[0]
    };
    assert!(matches!(
        poller.conn(stale),
        Err(Error::Misuse(Misuse::StaleConnection))
    ));
}

/// Each peer SENDs and WRITEs with an immediate: all of it reaches the
/// poller on that peer's connection, byte for byte. Each peer's ring is
/// filled for the poller's READ.
fn peers_to_poller(poller: &mut Poller, peers: &mut [(ConnId, Connection)]) {
    for (p, (_, conn)) in peers.iter_mut().enumerate() {
        conn.target_mut()
            .copy_from(READ_AT, &pattern(READ_LEN, 200 + p as u8))
            .expect("fill the peer's ring");
        for i in 0..MESSAGES {
            conn.try_send(&message(p, i)).expect("the peer's SEND");
        }
        conn.try_write(&message(p, 9), WRITE_AT, Some(p as u32))
            .expect("the peer's WRITE_WITH_IMM");
        settle_peer(conn);
    }
    let mut got: HashMap<ConnId, Vec<Vec<u8>>> = HashMap::new();
    let mut imms: HashMap<ConnId, (u32, u32)> = HashMap::new();
    let mut wait = BoundedWait::new(WAIT, "every peer's messages at the poller");
    while got.values().map(Vec::len).sum::<usize>() < 4 * MESSAGES || imms.len() < 4 {
        poller
            .poll(|id, ev| match ev {
                Event::Received { data } => got.entry(id).or_default().push(data.to_vec()),
                Event::WriteImm { imm, len } => assert!(imms.insert(id, (imm, len)).is_none()),
                other => panic!("{id:?}: {other:?}"),
            })
            .expect("the poller polls");
        wait.tick().expect("every peer's messages");
    }
    for (p, (id, _)) in peers.iter().enumerate() {
        let expected: Vec<Vec<u8>> = (0..MESSAGES).map(|i| message(p, i)).collect();
        assert_eq!(
            got[id], expected,
            "peer {p}'s SENDs, in order, on its own connection"
        );
        let written = message(p, 9);
        assert_eq!(
            imms[id],
            (p as u32, written.len() as u32),
            "peer {p}'s immediate"
        );
        let mut landed = vec![0u8; written.len()];
        let conn = poller.conn(*id).expect("a live connection");
        conn.target()
            .copy_to(WRITE_AT as usize, &mut landed)
            .expect("the target ring");
        assert_eq!(
            landed, written,
            "peer {p}'s WRITE landed in its own target ring"
        );
        assert_eq!(
            conn.stats().received,
            MESSAGES as u64 + 1,
            "peer {p}'s SENDs and immediate, counted on its connection"
        );
    }
    assert_eq!(
        poller.receives_posted(),
        32,
        "every slot taken was released and posted again"
    );
}

/// The poller SENDs, WRITEs and READs on each connection: each reaches
/// that peer alone, and each READ brings back that peer's bytes.
fn poller_to_peers(poller: &mut Poller, peers: &mut [(ConnId, Connection)]) {
    let mut seqs = HashMap::new();
    for (p, (id, _)) in peers.iter().enumerate() {
        let mut conn = poller.conn(*id).expect("a live connection");
        conn.try_send(&message(p, 20)).expect("the poller's SEND");
        conn.try_write(&message(p, 21), WRITE_AT, None)
            .expect("the poller's WRITE");
        let read = conn
            .try_read(READ_AT as u64, READ_LEN)
            .expect("the poller's READ");
        seqs.insert(*id, read);
    }
    let mut reads: HashMap<ConnId, Vec<u8>> = HashMap::new();
    let mut wait = BoundedWait::new(WAIT, "the poller's requests to retire");
    while reads.len() < 4 {
        poller
            .poll(|id, ev| match ev {
                Event::ReadCompleted { seq, data } => {
                    assert_eq!(seq, seqs[&id], "{id:?}'s READ");
                    assert!(reads.insert(id, data.to_vec()).is_none());
                }
                Event::Completed { .. } => {}
                other => panic!("{id:?}: {other:?}"),
            })
            .expect("the poller polls");
        wait.tick().expect("the poller's READs");
    }
    for (id, _) in peers.iter() {
        let conn = poller.conn(*id).expect("a live connection");
        assert_eq!(
            conn.outstanding(),
            0,
            "the READ's completion retired all before it"
        );
    }
    for (p, (id, conn)) in peers.iter_mut().enumerate() {
        assert_eq!(
            reads[id],
            pattern(READ_LEN, 200 + p as u8),
            "peer {p}'s bytes"
        );
        let mut received = None;
        let mut wait = BoundedWait::new(WAIT, "the poller's SEND at the peer");
        while received.is_none() {
            conn.poll(|ev| match ev {
                Event::Received { data } => received = Some(data.to_vec()),
                other => panic!("peer {p}: {other:?}"),
            })
            .expect("the peer polls");
            wait.tick().expect("the poller's SEND");
        }
        assert_eq!(received, Some(message(p, 20)), "peer {p} got its own SEND");
        let written = message(p, 21);
        let mut landed = vec![0u8; written.len()];
        conn.target()
            .copy_to(WRITE_AT as usize, &mut landed)
            .expect("the peer's ring");
        assert_eq!(landed, written, "the poller's WRITE landed at peer {p}");
    }
}

/// A fifth peer is refused, before any verb: its handshake ends.
fn a_fifth_is_refused(poller: &mut Poller, cfg: &EngineConfig) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    let fifth = peer(&listener, cfg);
    let mut stream = listener.accept().expect("accept TCP").0;
    let refused = poller.over_tcp(&mut stream, remote_access()).unwrap_err();
    assert!(
        matches!(
            refused,
            Error::PoolFull {
                what: "connections",
                limit: 4
            }
        ),
        "{refused}"
    );
    drop(stream);
    assert!(fifth.join().expect("the fifth peer's thread").is_err());
    assert_eq!(poller.stats().refused, 1);
    assert_eq!(poller.len(), 4);
}

/// A callback that panics while handed receives loses no slot of the
/// shared queue: every receive the turn took is settled and freed, and
/// the poller hands on nothing more.
#[test]
#[ignore = "needs an RDMA device"]
fn a_panic_in_the_poll_callback_settles_every_receive() {
    let cfg = config();
    let device = guest("PINPOLL_DEVICE");
    let mut poller = Poller::new(Some(&device), &cfg, pool(2)).expect("a poller");
    let depth = poller.receives_posted();
    assert_eq!(depth, 32, "the shared queue is full at the start");
    let mut peers = join(&mut poller, &cfg, 2);
    for (p, (_, conn)) in peers.iter_mut().enumerate() {
        for i in 0..2 {
            conn.try_send(&message(p, i)).expect("the peer's SEND");
        }
        settle_peer(conn);
    }
    // Every SEND completed at its peer, so its receive completion is in
    // the poller's receive CQ; the first one handed on panics.
    let mut handed = 0;
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut wait = BoundedWait::new(WAIT, "a receive at the poller");
        loop {
            poller
                .poll(|_, _| {
                    handed += 1;
                    panic!("the application's callback fails");
                })
                .expect("the poller polls");
            wait.tick().expect("a receive");
        }
    }));
    assert!(panicked.is_err(), "the callback panicked");
    assert_eq!(handed, 1, "one receive was handed on");
    assert_eq!(
        poller.receives_posted() + poller.free_slots(),
        depth,
        "no slot is lost: {} posted, {} free",
        poller.receives_posted(),
        poller.free_slots()
    );
    // The panic unwound before the turn's top-up: exactly the four
    // receives it took are free, none is lent or left unsettled.
    assert_eq!(
        (poller.free_slots(), poller.receives_posted()),
        (4, depth - 4),
        "every receive the turn took was settled and freed"
    );
    assert!(matches!(
        poller.poll(|_, _| {}),
        Err(Error::CallbackPanicked)
    ));
}

/// Two pollers whose connections are each other's peers: every SEND and
/// WRITE_WITH_IMM of each connection reaches the other poller on the
/// connection it was joined to, in order and byte for byte, both ways at
/// once.
#[test]
#[ignore = "needs an RDMA device"]
fn two_pollers_carry_each_other_s_connections_byte_exact() {
    const N: usize = 4;
    let cfg = config();
    let device = guest("PINPOLL_DEVICE");
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    let (cfg_b, device_b) = (cfg.clone(), device.clone());
    let b = std::thread::spawn(move || {
        let mut b = Poller::new(Some(&device_b), &cfg_b, pool(N as u32)).expect("poller B");
        let ids: Vec<ConnId> = (0..N)
            .map(|_| {
                let mut stream = TcpStream::connect(addr).expect("connect TCP");
                b.over_tcp(&mut stream, remote_access()).expect("B joins")
            })
            .collect();
        (b, ids)
    });
    let mut a = Poller::new(Some(&device), &cfg, pool(N as u32)).expect("poller A");
    let a_ids: Vec<ConnId> = (0..N)
        .map(|_| {
            let mut stream = listener.accept().expect("accept TCP").0;
            a.over_tcp(&mut stream, remote_access()).expect("A joins")
        })
        .collect();
    let (mut b, b_ids) = b.join().expect("poller B's thread");
    // The i-th join of each side is the same connection.
    for i in 0..N {
        for k in 0..MESSAGES {
            let mut to_b = a.conn(a_ids[i]).expect("A's connection");
            to_b.try_send(&message(i, k)).expect("A's SEND");
            let mut to_a = b.conn(b_ids[i]).expect("B's connection");
            to_a.try_send(&message(i + N, k)).expect("B's SEND");
        }
        let mut to_b = a.conn(a_ids[i]).expect("A's connection");
        to_b.try_write(&message(i, 9), WRITE_AT, Some(i as u32))
            .expect("A's WRITE_WITH_IMM");
    }
    let mut at_a: HashMap<ConnId, Vec<Vec<u8>>> = HashMap::new();
    let mut at_b: HashMap<ConnId, Vec<Vec<u8>>> = HashMap::new();
    let mut imms: HashMap<ConnId, u32> = HashMap::new();
    let complete = |got: &HashMap<ConnId, Vec<Vec<u8>>>| {
        got.values().map(Vec::len).sum::<usize>() == N * MESSAGES
    };
    let mut wait = BoundedWait::new(WAIT, "every message at both pollers");
    while !complete(&at_a) || !complete(&at_b) || imms.len() < N {
        a.poll(|id, ev| match ev {
            Event::Received { data } => at_a.entry(id).or_default().push(data.to_vec()),
            Event::Completed { .. } => {}
            other => panic!("A {id:?}: {other:?}"),
        })
        .expect("A polls");
        b.poll(|id, ev| match ev {
            Event::Received { data } => at_b.entry(id).or_default().push(data.to_vec()),
            Event::WriteImm { imm, .. } => assert!(imms.insert(id, imm).is_none()),
            Event::Completed { .. } => {}
            other => panic!("B {id:?}: {other:?}"),
        })
        .expect("B polls");
        wait.tick().expect("every message");
    }
    for i in 0..N {
        let from_a: Vec<Vec<u8>> = (0..MESSAGES).map(|k| message(i, k)).collect();
        let from_b: Vec<Vec<u8>> = (0..MESSAGES).map(|k| message(i + N, k)).collect();
        assert_eq!(at_b[&b_ids[i]], from_a, "connection {i} at B");
        assert_eq!(at_a[&a_ids[i]], from_b, "connection {i} at A");
        assert_eq!(imms[&b_ids[i]], i as u32, "connection {i}'s immediate");
        let written = message(i, 9);
        let mut landed = vec![0u8; written.len()];
        b.conn(b_ids[i])
            .expect("B's connection")
            .target()
            .copy_to(WRITE_AT as usize, &mut landed)
            .expect("B's target ring");
        assert_eq!(landed, written, "A's WRITE on connection {i}");
    }
    assert_eq!((a.stats().stale, b.stats().stale), (0, 0));
}

/// A callback that panics while handed send completions loses none:
/// the turn's completions of other connections are retired too, and the
/// poller hands on nothing more, nor lets any connection post.
#[test]
#[ignore = "needs an RDMA device"]
fn a_panic_in_the_poll_callback_retires_every_send_request() {
    let cfg = config();
    let device = guest("PINPOLL_DEVICE");
    let mut poller = Poller::new(Some(&device), &cfg, pool(2)).expect("a poller");
    let peers = join(&mut poller, &cfg, 2);
    for (id, _) in &peers {
        poller
            .conn(*id)
            .expect("a live connection")
            .try_read(0, 64)
            .expect("a READ");
    }
    // Both READs' completions in the send CQ before the one turn below:
    // time for the peers' NIC to answer (a turn that took only one would
    // fail the test, never pass it).
    std::thread::sleep(Duration::from_secs(2));
    let mut handed = 0;
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        poller.poll(|_, ev| {
            assert!(matches!(ev, Event::ReadCompleted { .. }), "{ev:?}");
            handed += 1;
            panic!("the application's callback fails");
        })
    }));
    assert!(panicked.is_err(), "the callback panicked");
    assert_eq!(handed, 1, "one completion was handed on");
    for (id, _) in &peers {
        assert_eq!(
            poller.outstanding_of(*id),
            Some(0),
            "{id:?}'s READ retired in the turn that panicked"
        );
    }
    assert!(matches!(
        poller.conn(peers[0].0),
        Err(Error::CallbackPanicked)
    ));
    assert!(matches!(
        poller.poll(|_, _| {}),
        Err(Error::CallbackPanicked)
    ));
}
