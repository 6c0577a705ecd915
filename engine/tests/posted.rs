//! Regions handed to the NIC by `Endpoint::post` and `post_recv` come back
//! only once the NIC is done with them: a wait that times out gives the
//! request back, a dropped `Posted` parks its region with the queue pair
//! until the request's completion is polled, and a refused post gives the
//! region back at once.

use std::time::Duration;

use pinpoll::{Access, CompleteError, Error, MemoryRegion, PageSize, Posted, RegionOp};
use pinpoll_testkit::pair::{pair, Method, Side, WAIT};
use pinpoll_testkit::{is_mapped, pattern};

/// A wait for a completion that cannot have come yet.
const SHORT: Duration = Duration::from_millis(50);

/// The server SENDs `data` to the client and waits for its completion.
fn send(server: &mut Side, data: &[u8]) {
    let posted = server
        .ep
        .post(server.buffer(data), data.len(), RegionOp::Send)
        .unwrap();
    server.ep.complete(posted, WAIT).unwrap();
}

/// What the receive `posted` got, and its region back.
fn received(side: &mut Side, posted: Posted) -> (Vec<u8>, MemoryRegion) {
    let done = side.ep.complete(posted, WAIT).unwrap();
    let region = done.region.expect("a receive with a buffer");
    let bytes = region.as_slice()[..done.done.byte_len as usize].to_vec();
    (bytes, region)
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_wait_that_times_out_gives_the_request_back_and_it_completes_later() {
    let (mut client, mut server) = pair(Method::Cm);
    let oldest = client.receives.pop_front().unwrap();
    let posted = match client.ep.complete(oldest, SHORT) {
        Err(CompleteError::Pending {
            error: Error::Timeout { .. },
            posted,
        }) => posted,
        other => panic!("expected the request back after a timeout, got {other:?}"),
    };
    let message = pattern(1000, 41);
    send(&mut server, &message);
    let (bytes, _) = received(&mut client, posted);
    assert_eq!(
        bytes, message,
        "the late message, in the region of the request given back"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_posted_parks_its_region_until_its_completion_is_polled() {
    let (mut client, mut server) = pair(Method::Cm);
    let earlier: Vec<Posted> = client.receives.drain(..).collect();
    let parked = client
        .ep
        .register(4096, PageSize::Base, Access::LOCAL_WRITE)
        .unwrap();
    let parked_at = parked.as_slice().as_ptr() as usize;
    let dropped = client.ep.post_recv(Some(parked)).unwrap();
    let last = client
        .ep
        .register(4096, PageSize::Base, Access::LOCAL_WRITE)
        .unwrap();
    let last = client.ep.post_recv(Some(last)).unwrap();
    drop(dropped);
    assert!(
        is_mapped(parked_at),
        "the region of a dropped Posted whose receive is queued was unmapped"
    );
    assert_eq!(client.ep.parked_regions(), 1);

    let messages: Vec<Vec<u8>> = (0..earlier.len() + 2)
        .map(|i| pattern(100 + i, i as u8))
        .collect();
    for m in &messages {
        send(&mut server, m);
    }
    for (posted, expected) in earlier.into_iter().zip(&messages) {
        assert_eq!(&received(&mut client, posted).0, expected);
    }
    // The next message landed in the parked region; polling its completion
    // on the way to the last receive's frees it.
    let (bytes, _) = received(&mut client, last);
    assert_eq!(
        &bytes,
        messages.last().unwrap(),
        "the parked receive took the message before it"
    );
    assert_eq!(client.ep.parked_regions(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_receive_refused_by_a_full_queue_gives_its_region_back() {
    let (mut client, _server) = pair(Method::Cm);
    let seed = pattern(64, 9);
    let mut posted = Vec::new();
    let refused = loop {
        assert!(posted.len() < 4096, "the receive queue never filled");
        let mut region = client
            .ep
            .register(64, PageSize::Base, Access::LOCAL_WRITE)
            .unwrap();
        region.as_mut_slice().copy_from_slice(&seed);
        match client.ep.post_recv(Some(region)) {
            Ok(p) => posted.push(p),
            Err(refused) => break refused,
        }
    };
    assert!(
        matches!(refused.error, Error::PostRecv { posted: 0, .. }),
        "{:?}",
        refused.error
    );
    let region = refused.region.expect("the refused receive's region");
    assert_eq!(region.as_slice(), &seed[..], "given back untouched");
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_send_refused_before_it_is_posted_gives_its_region_back() {
    let (mut client, _server) = pair(Method::Cm);
    let data = pattern(100, 5);
    let region = client.buffer(&data);
    let refused = client
        .ep
        .post(region, 101, RegionOp::Send)
        .expect_err("101 bytes of a 100-byte region");
    assert!(
        matches!(refused.error, Error::OutOfRegion { .. }),
        "{}",
        refused.error
    );
    assert_eq!(refused.region.as_slice(), &data[..]);
}

/// A SEND refused because the send queue is merely full gives its region
/// back untouched, and says so as ordinary back-pressure: kind `Full`,
/// retryable (nothing of the call went).
#[test]
#[ignore = "needs an RDMA device"]
fn a_send_refused_by_a_full_queue_gives_its_region_back() {
    let (mut client, _server) = pair(Method::Cm);
    let seed = pattern(64, 3);
    // Past the peer's posted receives the SENDs wait in receiver-not-ready
    // retries, and hold the queue.
    let mut posted = Vec::new();
    let refused = loop {
        assert!(posted.len() < 4096, "the send queue never filled");
        match client
            .ep
            .post(client.buffer(&seed), seed.len(), RegionOp::Send)
        {
            Ok(p) => posted.push(p),
            Err(refused) => break refused,
        }
    };
    assert!(
        matches!(refused.error, Error::PostSend { posted: 0, .. }),
        "{:?}",
        refused.error
    );
    assert_eq!(
        refused.error.kind(),
        pinpoll::ErrorKind::Full,
        "{}",
        refused.error
    );
    assert!(refused.error.is_retryable());
    assert_eq!(refused.region.as_slice(), &seed[..], "given back untouched");
}
