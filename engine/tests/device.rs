//! Every opcode moving real data, and remote access errors, on a real RDMA
//! device — over both connection methods.

use pinpoll::{CompleteError, Error, RegionOp, WcOpcode, WcStatus};
use pinpoll_testkit::pair::*;
use pinpoll_testkit::{cm_addr, device, pattern};

fn send_recv_moves_bytes(method: Method) {
    let (mut client, mut server) = pair(method);
    for len in [8usize, 64, 3000] {
        let data = pattern(len, len as u8);
        let posted = client
            .ep
            .post(client.buffer(&data), len, RegionOp::Send)
            .unwrap();
        let sent = client.ep.complete(posted, WAIT).unwrap();
        assert_eq!(sent.done.opcode, WcOpcode::SEND);
        assert_eq!(
            sent.region.unwrap().as_slice(),
            &data[..],
            "the sender's buffer came back"
        );
        let (got, bytes) = server.next_receive();
        assert_eq!(got.opcode, WcOpcode::RECV);
        assert_eq!(bytes, data, "{len} B");
    }
}

/// The raw, `unsafe` posting experts get: a SEND named by LocalSlice,
/// its completion from wait_send.
fn raw_posting_moves_bytes(method: Method) {
    let (mut client, mut server) = pair(method);
    let data = pattern(777, 3);
    let buffer = client.buffer(&data);
    let local = buffer.local_slice(0..data.len()).unwrap();
    // SAFETY: `buffer` stays registered and untouched until wait_send
    // returns the SEND's completion.
    unsafe { client.ep.raw().post_send(42, RegionOp::Send, local, true) }.unwrap();
    let sent = client.ep.wait_send(WAIT).unwrap();
    assert_eq!((sent.wr_id, sent.opcode), (42, WcOpcode::SEND));
    drop(buffer);
    let (_, bytes) = server.next_receive();
    assert_eq!(bytes, data);
}

fn write_moves_bytes(method: Method) {
    let (mut client, server) = pair(method);
    let data = pattern(REGION / 2, 3);
    let target = client.remote.sub(100, data.len() as u64).unwrap();
    let op = RegionOp::Write {
        remote: target,
        imm: None,
    };
    let posted = client
        .ep
        .post(client.buffer(&data), data.len(), op)
        .unwrap();
    let done = client.ep.complete(posted, WAIT).unwrap();
    assert_eq!(done.done.opcode, WcOpcode::RDMA_WRITE);
    // An RC write is acknowledged only once placed in the responder's memory.
    let exposed = server.exposed_bytes();
    assert_eq!(&exposed[100..100 + data.len()], &data[..]);
    assert!(
        exposed[..100].iter().all(|b| *b == 0),
        "bytes before the target untouched"
    );
}

fn write_with_imm_delivers_data_and_immediate(method: Method) {
    let (mut client, mut server) = pair(method);
    let data = pattern(4096, 5);
    let op = RegionOp::Write {
        remote: client.remote.sub(8192, 4096).unwrap(),
        imm: Some(0xdead_beef),
    };
    let posted = client.ep.post(client.buffer(&data), 4096, op).unwrap();
    client.ep.complete(posted, WAIT).unwrap();
    let (got, _) = server.next_receive();
    assert_eq!(got.opcode, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(got.imm, Some(0xdead_beef));
    assert_eq!(got.byte_len, 4096);
    assert_eq!(&server.exposed_bytes()[8192..8192 + 4096], &data[..]);
}

fn read_moves_bytes(method: Method) {
    let (mut client, mut server) = pair(method);
    let data = pattern(REGION, 11);
    server.exposed.copy_from(0, &data).unwrap();
    let len = 20_000;
    let op = RegionOp::Read {
        remote: client.remote.sub(1000, len as u64).unwrap(),
    };
    let posted = client
        .ep
        .post(client.buffer(&vec![0; len]), len, op)
        .unwrap();
    let done = client.ep.complete(posted, WAIT).unwrap();
    assert_eq!(
        (done.done.opcode, done.done.byte_len as usize),
        (WcOpcode::RDMA_READ, len)
    );
    assert_eq!(done.region.unwrap().as_slice(), &data[1000..1000 + len]);
}

/// A write the peer's NIC must refuse: REM_ACCESS_ERR, nothing changed there.
fn assert_refused(method: Method, corrupt: fn(pinpoll::RemoteSlice) -> pinpoll::RemoteSlice) {
    let (mut client, mut server) = pair(method);
    let before = pattern(REGION, 17);
    server.exposed.copy_from(0, &before).unwrap();
    let op = RegionOp::Write {
        remote: corrupt(client.remote),
        imm: None,
    };
    let posted = client
        .ep
        .post(client.buffer(&[0xAA; 256]), 256, op)
        .unwrap();
    let err = client.ep.complete(posted, WAIT).unwrap_err();
    let wc = match err.error() {
        Error::Completion(wc) => wc,
        other => panic!("expected an error completion, got {other}"),
    };
    assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR, "{err}");
    assert!(err.to_string().contains("REM_ACCESS_ERR"), "{err}");
    match err {
        CompleteError::Failed {
            region: Some(region),
            ..
        } => assert_eq!(region.as_slice(), &[0xAA; 256], "the region came back"),
        other => panic!("expected the region back with the error, got {other:?}"),
    }
    assert_eq!(
        server.exposed_bytes(),
        before,
        "the peer's memory must be unchanged"
    );
}

fn wrong_rkey_is_refused(method: Method) {
    assert_refused(method, |r| pinpoll::RemoteSlice {
        rkey: r.rkey ^ 0x5a5a_0000,
        ..r
    });
}

fn address_past_the_region_is_refused(method: Method) {
    assert_refused(method, |r| pinpoll::RemoteSlice {
        addr: r.addr + r.len - 64,
        ..r
    });
}

/// Requests on one queue complete in order: completing a later one first
/// is an error naming both that gives the request back, not a region
/// handed back early; the earlier one's completion is kept for it.
fn completions_must_be_taken_in_posting_order(method: Method) {
    let (mut client, mut server) = pair(method);
    let first = client
        .ep
        .post(client.buffer(b"one"), 3, RegionOp::Send)
        .unwrap();
    let second = client
        .ep
        .post(client.buffer(b"two"), 3, RegionOp::Send)
        .unwrap();
    let (first_id, second_id) = (first.wr_id(), second.wr_id());
    let (err, second) = match client.ep.complete(second, WAIT) {
        Err(CompleteError::Pending { error, posted }) => (error.to_string(), posted),
        other => panic!("expected the second request back, got {other:?}"),
    };
    assert!(
        err.contains(&format!("work request {first_id}, not {second_id}")),
        "{err}"
    );
    let done = client.ep.complete(first, WAIT).unwrap();
    assert_eq!(done.region.unwrap().as_slice(), b"one");
    let done = client.ep.complete(second, WAIT).unwrap();
    assert_eq!(done.region.unwrap().as_slice(), b"two");
    assert_eq!(server.next_receive().1, b"one");
    assert_eq!(server.next_receive().1, b"two");
}

macro_rules! both_methods {
    ($($name:ident),* $(,)?) => {
        mod over_rdma_cm {
            $(
                #[test]
                #[ignore = "needs an RDMA device"]
                fn $name() {
                    super::$name(super::Method::Cm);
                }
            )*
        }
        mod over_tcp_exchange {
            $(
                #[test]
                #[ignore = "needs an RDMA device"]
                fn $name() {
                    super::$name(super::Method::Oob);
                }
            )*
        }
    };
}

both_methods!(
    send_recv_moves_bytes,
    raw_posting_moves_bytes,
    completions_must_be_taken_in_posting_order,
    write_moves_bytes,
    write_with_imm_delivers_data_and_immediate,
    read_moves_bytes,
    wrong_rkey_is_refused,
    address_past_the_region_is_refused,
);

/// The rkey of a connection that ended is dead. A
/// (one listener, three connections in turn) ends and deregisters its
/// regions; a write through B to A's old address and rkey is refused by
/// the NIC and leaves B's region as it was; C, after that, moves data as
/// usual: the serving side is unaffected.
#[test]
#[ignore = "needs an RDMA device"]
fn a_stale_rkey_from_an_earlier_connection_is_refused_and_the_server_goes_on() {
    let listener = pinpoll::connect::cm::Listener::bind(cm_addr()).expect("listen");
    let addr = listener.local_addr().expect("bound address");
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        for _ in 0..3 {
            tx.send(cm_server_side(&listener)).expect("test alive");
        }
    });

    let client_a = cm_client_side(addr);
    let server_a = rx.recv().expect("server side of A");
    let stale = client_a.remote;
    assert_eq!(stale, server_a.exposed.remote(0..REGION).unwrap());
    // A ends on both sides: its queue pairs and regions are gone.
    drop(client_a);
    drop(server_a);

    let mut client_b = cm_client_side(addr);
    let mut server_b = rx.recv().expect("server side of B");
    assert_ne!(
        client_b.remote.rkey, stale.rkey,
        "the device handed B the rkey of A's deregistered region again; the test could not tell a stale rkey from a live one"
    );
    let before = pattern(REGION, 23);
    server_b.exposed.copy_from(0, &before).unwrap();
    let op = RegionOp::Write {
        remote: stale.sub(0, 256).unwrap(),
        imm: None,
    };
    let posted = client_b
        .ep
        .post(client_b.buffer(&[0xAA; 256]), 256, op)
        .unwrap();
    let err = client_b.ep.complete(posted, WAIT).unwrap_err();
    match err.error() {
        Error::Completion(wc) => assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR, "{err}"),
        other => panic!("expected an error completion, got {other}"),
    }
    assert!(err.to_string().contains("REM_ACCESS_ERR"), "{err}");
    assert_eq!(
        server_b.exposed_bytes(),
        before,
        "B's region must be unchanged byte for byte"
    );
    drop(client_b);
    drop(server_b);

    let mut client_c = cm_client_side(addr);
    let server_c = rx.recv().expect("server side of C");
    let data = pattern(REGION, 29);
    let op = RegionOp::Write {
        remote: client_c.remote.sub(0, REGION as u64).unwrap(),
        imm: None,
    };
    let posted = client_c
        .ep
        .post(client_c.buffer(&data), REGION, op)
        .unwrap();
    let done = client_c.ep.complete(posted, WAIT).unwrap();
    assert_eq!(done.done.opcode, WcOpcode::RDMA_WRITE);
    assert_eq!(server_c.exposed_bytes(), data, "C's data, byte for byte");
    server.join().expect("server thread");
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_named_device_opens_with_an_active_port_and_a_roce_v2_gid() {
    let name = device();
    let devices = pinpoll::device::list_devices().unwrap();
    assert!(
        devices.iter().any(|d| d.name == name),
        "{name} not in {devices:?}"
    );
    let ctx = pinpoll::device::Device::open(Some(&name)).unwrap();
    let attr = ctx.query_device().unwrap();
    assert!(attr.max_qp_wr > 0 && attr.phys_port_cnt >= 1, "{attr:?}");
    let port = ctx.query_port(1).unwrap();
    assert!(port.is_active(), "{port:?}");
    assert!(
        pinpoll::device::mtu_bytes(port.active_mtu) >= 256,
        "{port:?}"
    );
    let table = pinpoll::gid::gid_table(
        &ctx,
        1,
        port.gid_tbl_len,
        std::path::Path::new(pinpoll::gid::SYSFS_INFINIBAND),
    )
    .unwrap();
    if port.is_ethernet() {
        let chosen = pinpoll::gid::select(&table, None, 1).unwrap();
        assert!(chosen.is_roce_v2(), "{table:?}");
    }
    let inline = pinpoll::device::max_inline_data(&ctx, 4096).unwrap();
    assert!(inline >= 64, "rxe grants inline data: {inline}");
    let missing = pinpoll::device::Device::open(Some("no-such-device0"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("no-such-device0") && missing.contains(&name),
        "{missing}"
    );
}
