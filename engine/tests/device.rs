//! Every opcode moving real data, and remote access errors, on a real RDMA
//! device — over both connection methods.

mod common;

use common::*;
use pinpoll::{Error, SendFlags, WcOpcode, WcStatus};

fn send_recv_moves_bytes(method: Method) {
    let (mut client, mut server) = pair(method);
    for (len, inline) in [(8usize, true), (64, true), (3000, false)] {
        let data = pattern(len, len as u8);
        if inline {
            client.ep.qp().post_send_inline(7, &data, true).unwrap();
        } else {
            client.local.as_mut_slice()[..len].copy_from_slice(&data);
            client
                .ep
                .qp()
                .post_send(7, client.local.slice(0..len).unwrap(), SendFlags::SIGNALED)
                .unwrap();
        }
        let sent = client.ep.wait_send(WAIT).unwrap();
        assert_eq!((sent.wr_id, sent.opcode), (7, WcOpcode::SEND));
        let got = server.ep.wait_recv(WAIT).unwrap();
        assert_eq!(got.opcode, WcOpcode::RECV);
        assert_eq!(got.byte_len as usize, len);
        let slot = RECV_BASE + (got.wr_id - RECV_WR_BASE) as usize * RECV_SLOT;
        assert_eq!(
            &server.local.as_slice()[slot..slot + len],
            &data[..],
            "{len} B (inline {inline})"
        );
    }
}

fn write_moves_bytes(method: Method) {
    let (mut client, server) = pair(method);
    let data = pattern(REGION / 2, 3);
    client.local.as_mut_slice()[..data.len()].copy_from_slice(&data);
    let target = client.remote.sub(100, data.len() as u64).unwrap();
    client
        .ep
        .qp()
        .post_write(
            1,
            client.local.slice(0..data.len()).unwrap(),
            target,
            None,
            SendFlags::SIGNALED,
        )
        .unwrap();
    assert_eq!(
        client.ep.wait_send(WAIT).unwrap().opcode,
        WcOpcode::RDMA_WRITE
    );
    // An RC write is acknowledged only once placed in the responder's memory.
    assert_eq!(&server.exposed.as_slice()[100..100 + data.len()], &data[..]);
    assert!(
        server.exposed.as_slice()[..100].iter().all(|b| *b == 0),
        "bytes before the target untouched"
    );
    // Inline write of a small payload.
    let small = pattern(48, 9);
    client
        .ep
        .qp()
        .post_write_inline(2, &small, client.remote.sub(0, 48).unwrap(), None, true)
        .unwrap();
    client.ep.wait_send(WAIT).unwrap();
    assert_eq!(&server.exposed.as_slice()[..48], &small[..]);
}

fn write_with_imm_delivers_data_and_immediate(method: Method) {
    let (mut client, mut server) = pair(method);
    let data = pattern(4096, 5);
    client.local.as_mut_slice()[..4096].copy_from_slice(&data);
    let target = client.remote.sub(8192, 4096).unwrap();
    client
        .ep
        .qp()
        .post_write(
            3,
            client.local.slice(0..4096).unwrap(),
            target,
            Some(0xdead_beef),
            SendFlags::SIGNALED,
        )
        .unwrap();
    client.ep.wait_send(WAIT).unwrap();
    let got = server.ep.wait_recv(WAIT).unwrap();
    assert_eq!(got.opcode, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(got.imm, Some(0xdead_beef));
    assert_eq!(got.byte_len, 4096);
    assert_eq!(&server.exposed.as_slice()[8192..8192 + 4096], &data[..]);
}

fn read_moves_bytes(method: Method) {
    let (mut client, mut server) = pair(method);
    let data = pattern(REGION, 11);
    server.exposed.as_mut_slice().copy_from_slice(&data);
    let len = 20_000;
    let source = client.remote.sub(1000, len as u64).unwrap();
    client
        .ep
        .qp()
        .post_read(4, client.local.slice(0..len).unwrap(), source, true)
        .unwrap();
    let done = client.ep.wait_send(WAIT).unwrap();
    assert_eq!(
        (done.wr_id, done.opcode, done.byte_len as usize),
        (4, WcOpcode::RDMA_READ, len)
    );
    assert_eq!(&client.local.as_slice()[..len], &data[1000..1000 + len]);
}

/// A write the peer's NIC must refuse: REM_ACCESS_ERR, nothing changed there.
fn assert_refused(method: Method, corrupt: fn(pinpoll::RemoteSlice) -> pinpoll::RemoteSlice) {
    let (mut client, mut server) = pair(method);
    let before = pattern(REGION, 17);
    server.exposed.as_mut_slice().copy_from_slice(&before);
    client.local.as_mut_slice()[..256].fill(0xAA);
    let target = corrupt(client.remote);
    client
        .ep
        .qp()
        .post_write(
            9,
            client.local.slice(0..256).unwrap(),
            target,
            None,
            SendFlags::SIGNALED,
        )
        .unwrap();
    let err = client.ep.wait_send(WAIT).unwrap_err();
    let wc = match &err {
        Error::Completion(wc) => wc,
        other => panic!("expected an error completion, got {other}"),
    };
    assert_eq!(wc.wr_id, 9);
    assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR, "{err}");
    assert!(err.to_string().contains("REM_ACCESS_ERR"), "{err}");
    assert_eq!(
        server.exposed.as_slice(),
        &before[..],
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
    write_moves_bytes,
    write_with_imm_delivers_data_and_immediate,
    read_moves_bytes,
    wrong_rkey_is_refused,
    address_past_the_region_is_refused,
);

/// Issue 7, case 7: the rkey of a connection that ended is dead. A
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
    server_b.exposed.as_mut_slice().copy_from_slice(&before);
    client_b.local.as_mut_slice()[..256].fill(0xAA);
    client_b
        .ep
        .qp()
        .post_write(
            11,
            client_b.local.slice(0..256).unwrap(),
            stale.sub(0, 256).unwrap(),
            None,
            SendFlags::SIGNALED,
        )
        .unwrap();
    let err = client_b.ep.wait_send(WAIT).unwrap_err();
    match &err {
        Error::Completion(wc) => {
            assert_eq!(wc.wr_id, 11);
            assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR, "{err}");
        }
        other => panic!("expected an error completion, got {other}"),
    }
    assert!(err.to_string().contains("REM_ACCESS_ERR"), "{err}");
    assert_eq!(
        server_b.exposed.as_slice(),
        &before[..],
        "B's region must be unchanged byte for byte"
    );
    drop(client_b);
    drop(server_b);

    let mut client_c = cm_client_side(addr);
    let server_c = rx.recv().expect("server side of C");
    let data = pattern(REGION, 29);
    client_c.local.as_mut_slice().copy_from_slice(&data);
    client_c
        .ep
        .qp()
        .post_write(
            12,
            client_c.local.slice(0..REGION).unwrap(),
            client_c.remote.sub(0, REGION as u64).unwrap(),
            None,
            SendFlags::SIGNALED,
        )
        .unwrap();
    let done = client_c.ep.wait_send(WAIT).unwrap();
    assert_eq!((done.wr_id, done.opcode), (12, WcOpcode::RDMA_WRITE));
    assert_eq!(
        server_c.exposed.as_slice(),
        &data[..],
        "C's data, byte for byte"
    );
    server.join().expect("server thread");
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_named_device_opens_with_an_active_port_and_a_roce_v2_gid() {
    let name = device();
    let devices = pinpoll::sys::device::list_devices().unwrap();
    assert!(
        devices.iter().any(|d| d.name == name),
        "{name} not in {devices:?}"
    );
    let ctx = pinpoll::sys::device::Context::open(Some(&name)).unwrap();
    let attr = ctx.query_device().unwrap();
    assert!(attr.max_qp_wr > 0 && attr.phys_port_cnt >= 1, "{attr:?}");
    let port = ctx.query_port(1).unwrap();
    assert!(port.is_active(), "{port:?}");
    assert!(
        pinpoll::sys::device::mtu_bytes(port.active_mtu) >= 256,
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
    let missing = pinpoll::sys::device::Context::open(Some("no-such-device0"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("no-such-device0") && missing.contains(&name),
        "{missing}"
    );
}
