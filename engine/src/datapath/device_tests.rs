//! Device tests that need the engine's inside: a provider that fails a
//! post after queueing every request, as rxe does when its doorbell fails
//! (`sys::wr::fault`), and the queues' own accounting. Run in the guest
//! like the other device tests.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::{Connection, Event, Rings};
use crate::config::PageSize;
use crate::config::{EngineConfig, QpConfig};
use crate::connect::cm::Listener;
use crate::connect::oob::Prepared;
use crate::connect::parse_socket_addr;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::sys::mr::Access;
use crate::sys::posted::CompleteError;
use crate::sys::qp::QpState;
use crate::sys::region::RegionOp;
use crate::sys::wr::fault;
use crate::wait::BoundedWait;

const WAIT: Duration = Duration::from_secs(10);

// The workspace's test kit has the next three too, but it is not
// published: the packaged crate's tests must build without it.

/// A variable `scripts/softroce-vm` sets in the guest, or a failure
/// saying where these tests run.
#[track_caller]
pub(crate) fn guest(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{var} is not set: device tests need an RDMA device: run them inside the \
             SoftRoCE guest with `scripts/test.sh --device-only`"
        ),
    }
}

pub(crate) fn cm_addr() -> SocketAddr {
    let host = guest("PINPOLL_ADDR4");
    parse_socket_addr(&host, 0).unwrap_or_else(|e| panic!("PINPOLL_ADDR4={host:?}: {e}"))
}

/// `len` bytes of a pattern that differs per `seed` and per offset.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Small queues (the test kit's configurations are another crate's types
/// to these tests).
pub(crate) fn qp_config() -> QpConfig {
    QpConfig {
        max_send_wr: 16,
        max_recv_wr: 32,
        cq_depth: 64,
        max_inline_data: 64,
        ..QpConfig::default()
    }
}

pub(crate) fn config() -> EngineConfig {
    EngineConfig {
        qp: qp_config(),
        batch_size: 8,
        signal_interval: 4,
        inline_threshold: 64,
        slot_size: 4096,
        slot_count: 32,
        completion_timeout: WAIT,
        heartbeat_interval: None,
        ..EngineConfig::default()
    }
}

/// A connected (client, server) pair over rdma_cm.
fn pair(cfg: &EngineConfig) -> (Connection, Connection) {
    let listener = Listener::bind(cm_addr()).expect("rdma_cm listen");
    let addr = listener.local_addr().expect("bound address");
    let scfg = cfg.clone();
    let server =
        std::thread::spawn(move || Connection::accept(&listener, &scfg, WAIT).expect("accept"));
    let client = Connection::connect(addr, cfg).expect("connect");
    (client, server.join().expect("server thread"))
}

/// Polls `conn` until nothing is outstanding on its send queue, within
/// [`WAIT`]; returns how many events said a request completed or flushed.
fn retire_everything(conn: &mut Connection) -> usize {
    let mut wait = BoundedWait::new(WAIT, "every request to retire");
    let mut events = 0;
    while conn.outstanding() > 0 {
        let _ = conn.poll(|ev| {
            if matches!(
                ev,
                Event::Completed { .. }
                    | Event::ReadCompleted { .. }
                    | Event::Failed(_)
                    | Event::Flushed { .. }
            ) {
                events += 1;
            }
        });
        wait.tick().expect("the requests retire");
    }
    events
}

/// Finding 4 of issue 23: an unknown `bad_wr` was read as "nothing was
/// posted", and the batch rolled back while the NIC had it.
#[test]
#[ignore = "needs an RDMA device"]
fn a_batch_whose_post_fails_unnamed_stays_posted_until_its_requests_complete() {
    let cfg = config();
    let (mut client, server) = pair(&cfg);
    let data = pattern(4096, 3);
    let mut region = client
        .endpoint()
        .register(4096, PageSize::Base, Access::LOCAL_READ)
        .unwrap();
    region.as_mut_slice().copy_from_slice(&data);
    let mut batch = client.batch();
    batch.write_region(region, 4096, 0, None).unwrap();
    batch.write(&[5u8; 1000], 8192, None).unwrap();
    batch.read(16384, 512).unwrap();
    fault::fail_next_post_after_queueing(libc::EIO);
    let err = batch.post().unwrap_err();
    assert!(
        matches!(
            err,
            Error::PostIndeterminate {
                call: "ibv_post_send",
                requests: 3,
                ..
            }
        ),
        "{err}"
    );
    // Nothing rolled back: no region comes back, no sequence number is
    // reused, while the NIC may still read or write.
    assert_eq!(client.outstanding(), 3, "the batch was rolled back");
    assert!(
        client.reclaim().is_none(),
        "a lent region came back while its WRITE may be queued"
    );
    assert_eq!(client.endpoint().state().unwrap(), QpState::Err);
    match client.try_send(b"more") {
        Err(Error::PostIndeterminate { .. }) => {}
        other => panic!("a broken queue must refuse new work, got {other:?}"),
    }
    assert!(retire_everything(&mut client) >= 1);
    let region = client
        .reclaim()
        .expect("the region, after its request retired");
    assert_eq!(region.as_slice(), &data[..]);
    client.close().unwrap();
    drop(server);
}

/// Finding 4 of issue 23 on the receive queue: a refill whose post fails
/// unnamed counts its receives as posted, so no slot is ever given a
/// second receive while the first may still land in it.
#[test]
#[ignore = "needs an RDMA device"]
fn a_refill_whose_post_fails_unnamed_counts_every_receive_as_posted() {
    let cfg = config();
    let (mut client, mut server) = pair(&cfg);
    server.send(b"one").unwrap();
    assert_eq!(client.recv().unwrap().data, b"one");
    let depth = u64::from(cfg.qp.max_recv_wr);
    assert_eq!(client.rq.outstanding(), depth - 1);
    fault::fail_next_post_after_queueing(libc::EIO);
    match client.try_recv() {
        Err(Error::PostIndeterminate {
            call: "ibv_post_recv",
            requests: 1,
            ..
        }) => {}
        other => panic!("expected the unnamed failure, got {other:?}"),
    }
    assert_eq!(
        client.rq.outstanding(),
        depth,
        "the receive the provider may have queued was not counted"
    );
    assert_eq!(client.endpoint().state().unwrap(), QpState::Err);
    // Flushed receives come back (rxe flushes after the move to ERR, on
    // its own time: a poll may find none yet); the slots are never
    // posted again.
    let posted = client.rq.receives_posted();
    assert_eq!(posted, depth + 1);
    let mut wait = BoundedWait::new(WAIT, "the flushed receives");
    let mut ended = 0;
    while ended < depth {
        match client.try_recv() {
            Err(_) => ended += 1,
            Ok(None) => {
                wait.tick().expect("the receives flush");
            }
            Ok(Some(m)) => panic!("a message after the connection's end: {m:?}"),
        }
    }
    assert_eq!(
        client.rq.receives_posted(),
        posted,
        "a broken receive queue posted a slot again"
    );
}

/// Two endpoints connected by the out-of-band exchange.
fn endpoints() -> (Endpoint, Endpoint) {
    fn side(stream: &mut TcpStream) -> Endpoint {
        let device = guest("PINPOLL_DEVICE");
        let prepared =
            Prepared::new(Some(&device), &qp_config(), Access::REMOTE_WRITE).expect("prepare QP");
        prepared.handshake(stream, None).expect("handshake")
    }
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    let addr = tcp.local_addr().expect("bound address");
    let server = std::thread::spawn(move || side(&mut tcp.accept().expect("accept TCP").0));
    let client = side(&mut TcpStream::connect(addr).expect("connect TCP"));
    (client, server.join().expect("server thread"))
}

/// Finding 4 of issue 23 on a whole region's post: taken as queued, it
/// gives its region back only with its (flushed) completion.
#[test]
#[ignore = "needs an RDMA device"]
fn a_region_post_that_fails_unnamed_gives_the_region_back_only_with_its_completion() {
    let (mut client, _server) = endpoints();
    let data = pattern(256, 7);
    let mut region = client
        .register(256, PageSize::Base, Access::LOCAL_READ)
        .unwrap();
    region.as_mut_slice().copy_from_slice(&data);
    fault::fail_next_post_after_queueing(libc::EIO);
    let posted = client
        .post(region, 256, RegionOp::Send)
        .expect("taken as queued");
    assert_eq!(client.state().unwrap(), QpState::Err);
    match client.complete(posted, WAIT) {
        Err(CompleteError::Failed {
            error: Error::PostIndeterminate { .. },
            region: Some(region),
        }) => assert_eq!(region.as_slice(), &data[..]),
        other => panic!("expected the region back with the cause, got {other:?}"),
    }
}

/// A connection whose setup fails after posting receives keeps its
/// receive ring with the queue pair, which may still write into it.
#[test]
#[ignore = "needs an RDMA device"]
fn a_setup_that_fails_after_posting_receives_keeps_their_ring_with_the_queue_pair() {
    let cfg = config();
    let device = guest("PINPOLL_DEVICE");
    let mut prepared =
        Prepared::new(Some(&device), &cfg.qp, Access::REMOTE_WRITE).expect("prepare QP");
    fault::fail_next_post_after_queueing(libc::EIO);
    let err = Rings::prepare(prepared.endpoint(), &cfg, Access::REMOTE_WRITE).unwrap_err();
    assert!(matches!(err, Error::PostIndeterminate { .. }), "{err}");
    assert_eq!(
        prepared.endpoint().parked_regions(),
        1,
        "the receive ring was freed while its receives may be queued"
    );
}

/// A send queue handed completions polled from another CQ believes none
/// of them (hostile reads 36a F2, 36b F3): the completion of the client's
/// receive CQ names position 0 of the receive ring, which is also the id
/// of the send queue's first request, a WRITE still outstanding. Had the
/// send queue believed it, it would have retired the WRITE (and a READ's
/// slot so retired would be viewed while the NIC may still write it). A
/// queue's own `poll` cannot be handed another CQ at all: it owns its
/// CQ's poller; `retire` is the door a poller of many queues uses.
#[test]
#[ignore = "needs an RDMA device"]
fn a_send_queue_believes_no_completion_polled_from_another_cq() {
    let cfg = EngineConfig {
        signal_interval: 1,
        ..config()
    };
    let (mut client, mut server) = pair(&cfg);
    let seq = client.try_write(&[7u8; 8], 0, None).expect("WRITE");
    assert_eq!(seq, 0, "the send queue's first request");
    server.try_send(b"to the client").expect("SEND");
    // The SEND completed at the server: its receive's completion is in
    // the client's receive CQ.
    assert_eq!(retire_everything(&mut server), 1, "the SEND completes");
    // The receive's completion is shown to the send queue (which must
    // refuse it), then settled by its own queue.
    let mut wait = BoundedWait::new(WAIT, "the receive's completion");
    let (mut refused, mut received) = (None, None);
    while received.is_none() {
        let sq = &mut client.sq;
        client
            .rq
            .poll_shown(
                1,
                |reaped| {
                    if let Some(wc) = reaped.wcs().first() {
                        assert_eq!(
                            wc.wr_id(),
                            0,
                            "the receive of position 0: the WRITE's id too"
                        );
                        refused = Some(sq.retire(reaped, |retired| {
                            panic!("the send queue retired {retired:?} for a receive's completion")
                        }));
                    }
                },
                |_, data| received = Some(data.to_vec()),
            )
            .expect("poll the receive queue");
        wait.tick().expect("the receive's completion");
    }
    assert!(
        matches!(
            refused,
            Some(Err(Error::Misuse(
                crate::error::Misuse::OtherQueuesCompletions
            )))
        ),
        "{refused:?}"
    );
    assert_eq!(
        received.as_deref(),
        Some(&b"to the client"[..]),
        "the receive reached its own queue"
    );
    assert_eq!(client.outstanding(), 1, "the WRITE is still outstanding");
    let mut wait = BoundedWait::new(WAIT, "the WRITE's own completion");
    let mut completed = 0;
    while completed == 0 {
        client
            .poll(|ev| match ev {
                Event::Completed { .. } => completed += 1,
                other => panic!("{other:?}"),
            })
            .expect("poll");
        wait.tick().expect("the WRITE's completion");
    }
    assert_eq!(
        (completed, client.outstanding()),
        (1, 0),
        "the WRITE retired as its own"
    );
}
