//! `filexfer serve` with a client of the classic "rdma-file-transfer"
//! example, implemented here from the protocol description: no private
//! data, 24-byte host-order control messages, the file name and then each
//! chunk written into the server's 10 MiB buffer with WRITE_WITH_IMM of
//! its length, a zero-length write to end.

mod common;

use std::time::Duration;

use common::{addr4, random_file, serial, sha256, Scratch, Server, FILEXFER};
use pinpoll::connect::cm::Connector;
use pinpoll::{Access, Endpoint, PageSize, QpConfig, RegionOp, RemoteSlice, WcOpcode};
use pinpoll_apps::filexfer::classic::{decode, BUFFER, MSG_DONE, MSG_LEN, MSG_MR, MSG_READY};

const T: Duration = Duration::from_secs(20);

/// The classic client: sends `data` under `name`; returns the ids of the
/// server's messages after the MR (READY per write, then DONE).
fn classic_send(port: u16, name: &str, data: &[u8]) -> Vec<i32> {
    let addr = pinpoll::connect::parse_socket_addr(&addr4(), port).unwrap();
    let cfg = QpConfig {
        connect_timeout: T,
        ..QpConfig::default()
    };
    let mut c = Connector::resolve(addr, &cfg).expect("resolve");
    let ep = c.endpoint();
    let recv = ep
        .register(MSG_LEN, PageSize::Base, Access::LOCAL_WRITE)
        .unwrap();
    let mut src = Some(
        ep.register(BUFFER, PageSize::Base, Access::LOCAL_READ)
            .unwrap(),
    );
    let mut recv = Some(ep.post_recv(Some(recv)).unwrap());
    let mut ep = c.connect(&[]).expect("connect");

    let mut next_msg = |ep: &mut Endpoint| {
        let posted = recv.take().expect("a receive is posted");
        let c = ep.complete(posted, T).expect("a message from the server");
        assert_eq!(c.done.opcode, WcOpcode::RECV);
        let buffer = c.region.expect("the receive buffer back");
        let m = decode(&buffer.as_slice()[..c.done.byte_len as usize]).unwrap();
        recv = Some(ep.post_recv(Some(buffer)).unwrap());
        m
    };
    let (id, raddr, rkey) = next_msg(&mut ep);
    assert_eq!(id, MSG_MR);
    let remote = RemoteSlice {
        addr: raddr,
        len: BUFFER as u64,
        rkey,
    };
    let mut write = |ep: &mut Endpoint, bytes: &[u8]| {
        let mut buffer = src.take().expect("the send buffer is ours");
        buffer.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        let op = RegionOp::Write {
            remote,
            imm: Some(bytes.len() as u32),
        };
        let posted = ep.post(buffer, bytes.len(), op).unwrap();
        let c = ep.complete(posted, T).expect("the write completes");
        assert_eq!(c.done.opcode, WcOpcode::RDMA_WRITE);
        src = c.region;
    };
    let mut ids = Vec::new();
    let mut name_bytes = name.as_bytes().to_vec();
    name_bytes.push(0);
    write(&mut ep, &name_bytes);
    ids.push(next_msg(&mut ep).0);
    for chunk in data.chunks(BUFFER) {
        write(&mut ep, chunk);
        ids.push(next_msg(&mut ep).0);
    }
    write(&mut ep, &[]);
    ids.push(next_msg(&mut ep).0);
    ep.disconnect().unwrap();
    ids
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_classic_client_is_served_unchanged() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = Server::start(
        FILEXFER,
        &[
            "serve",
            "--dir",
            dst.str(),
            "--count",
            "2",
            "--timeout",
            "20",
        ],
    );
    for (name, len) in [
        ("small.txt", 1000usize),
        ("three-chunks.bin", 2 * BUFFER + 1),
    ] {
        let path = src.join(name);
        random_file(&path, len, len as u64);
        let data = std::fs::read(&path).unwrap();
        let ids = classic_send(server.port, name, &data);
        let chunks = len.div_ceil(BUFFER);
        let mut want = vec![MSG_READY; 1 + chunks];
        want.push(MSG_DONE);
        assert_eq!(ids, want, "{name}");
        assert_eq!(sha256(&dst.join(name)), sha256(&path), "{name} differs");
    }
    let done = server.finish();
    done.assert_ok("server");
    assert_eq!(dst.names(), ["small.txt", "three-chunks.bin"]);
}

/// A classic server for one client, on a thread: returns the name and the
/// bytes it received.
/// What the classic server received: the file name and the data.
type Received = (Vec<u8>, Vec<u8>);

fn classic_server() -> (u16, std::thread::JoinHandle<Received>) {
    use pinpoll::connect::cm::Listener;
    let addr = pinpoll::connect::parse_socket_addr("::", 0).unwrap();
    let listener = Listener::bind(addr).expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    let handle = std::thread::spawn(move || {
        let cfg = QpConfig {
            connect_timeout: T,
            ..QpConfig::default()
        };
        let mut req = listener
            .next_request(&cfg, Duration::from_secs(120))
            .expect("a client");
        assert!(
            req.private_data().iter().all(|b| *b == 0),
            "a classic client sends no private data"
        );
        let ep = req.endpoint();
        let buf = ep.register_shared(BUFFER, PageSize::Base, false).unwrap();
        let ring = buf.remote(0..BUFFER).unwrap();
        let mut msg = Some(
            ep.register(MSG_LEN, PageSize::Base, Access::LOCAL_READ)
                .unwrap(),
        );
        let mut recv = ep.post_recv(None).unwrap();
        let mut ep = req.accept(&[]).expect("accept");
        let mut say = |ep: &mut Endpoint, id: i32| {
            let mut m = msg.take().expect("the message buffer is ours");
            m.as_mut_slice()
                .copy_from_slice(&pinpoll_apps::filexfer::classic::encode(
                    id, ring.addr, ring.rkey,
                ));
            let posted = ep.post(m, MSG_LEN, RegionOp::Send).unwrap();
            msg = ep.complete(posted, T).expect("a send completes").region;
        };
        say(&mut ep, MSG_MR);
        let (mut name, mut data) = (None, Vec::new());
        loop {
            let c = ep.complete(recv, T).expect("a write with immediate");
            assert_eq!(c.done.opcode, WcOpcode::RECV_RDMA_WITH_IMM);
            recv = ep.post_recv(None).unwrap();
            let len = c.done.imm.unwrap() as usize;
            assert!(len <= BUFFER);
            let mut bytes = vec![0; len];
            buf.copy_to(0, &mut bytes).unwrap();
            if name.is_none() {
                assert_eq!(bytes.last(), Some(&0), "the name ends with NUL");
                name = Some(bytes[..len - 1].to_vec());
                say(&mut ep, MSG_READY);
            } else if len == 0 {
                say(&mut ep, MSG_DONE);
                break;
            } else {
                data.extend_from_slice(&bytes);
                say(&mut ep, MSG_READY);
            }
        }
        // The client disconnects.
        let _ = ep.complete(recv, T);
        (name.unwrap(), data)
    });
    (port, handle)
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_classic_talks_to_a_classic_server() {
    let _g = serial();
    let src = Scratch::new("src");
    let path = src.join("to-classic.bin");
    let len = BUFFER + 12345;
    random_file(&path, len, 42);
    let (port, server) = classic_server();
    let port = port.to_string();
    let host = addr4();
    let p = path.display().to_string();
    let out = common::run_within(
        FILEXFER,
        &[
            "send",
            &host,
            &p,
            "--port",
            &port,
            "--classic",
            "--timeout",
            "20",
        ],
        Duration::from_secs(300),
    );
    out.assert_ok("send --classic");
    assert!(
        out.stdout
            .contains(&format!("sent to-classic.bin (classic): {len} bytes")),
        "{out:#?}"
    );
    let (name, data) = server.join().expect("the classic server");
    assert_eq!(name, b"to-classic.bin");
    assert!(data == std::fs::read(&path).unwrap(), "the data differ");
}
