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

/// `filexfer serve` into `dst` for `count` transfers.
fn serve(dst: &Scratch, count: &str) -> Server {
    Server::start(
        FILEXFER,
        &[
            "serve",
            "--dir",
            dst.str(),
            "--count",
            count,
            "--timeout",
            "20",
        ],
    )
}

/// `filexfer send --classic FILE` to a server on `port`.
fn send_classic(port: u16, file: &std::path::Path) -> common::Finished {
    let (port, host, path) = (port.to_string(), addr4(), file.display().to_string());
    common::run_within(
        FILEXFER,
        &[
            "send",
            &host,
            &path,
            "--port",
            &port,
            "--classic",
            "--timeout",
            "20",
        ],
        Duration::from_secs(300),
    )
}

/// A classic client, step by step.
struct RawClassic {
    ep: Endpoint,
    recv: Option<pinpoll::Posted>,
    src: Option<pinpoll::MemoryRegion>,
    remote: RemoteSlice,
}

impl RawClassic {
    /// Connects (no private data) and reads the server's MSG_MR.
    fn connect(port: u16) -> RawClassic {
        let addr = pinpoll::connect::parse_socket_addr(&addr4(), port).unwrap();
        let cfg = {
            let mut built = QpConfig::default();
            built.connect_timeout = T;
            built
        };
        let mut c = Connector::resolve(addr, &cfg).expect("resolve");
        let ep = c.endpoint();
        let recv = ep
            .register(MSG_LEN, PageSize::Base, Access::LOCAL_WRITE)
            .unwrap();
        let src = ep
            .register(BUFFER, PageSize::Base, Access::LOCAL_READ)
            .unwrap();
        let recv = ep.post_recv(Some(recv)).unwrap();
        let ep = c.connect(&[]).expect("connect");
        let mut raw = RawClassic {
            ep,
            recv: Some(recv),
            src: Some(src),
            remote: RemoteSlice {
                addr: 0,
                len: 0,
                rkey: 0,
            },
        };
        let (id, addr, rkey) = raw.next_msg().expect("the server's MR");
        assert_eq!(id, MSG_MR);
        raw.remote = RemoteSlice {
            addr,
            len: BUFFER as u64,
            rkey,
        };
        raw
    }

    /// The server's next message, or the error that ended the connection.
    fn next_msg(&mut self) -> pinpoll::Result<(i32, u64, u32)> {
        let posted = self.recv.take().expect("a receive is posted");
        let c = self.ep.complete(posted, T)?;
        assert_eq!(c.done.opcode, WcOpcode::RECV);
        let buffer = c.region.expect("the receive buffer back");
        let m = decode(&buffer.as_slice()[..c.done.byte_len as usize]).unwrap();
        self.recv = Some(self.ep.post_recv(Some(buffer)).unwrap());
        Ok(m)
    }

    /// Writes `bytes` with the immediate `imm` (the classic client's is
    /// the length).
    fn write_announcing(&mut self, bytes: &[u8], imm: u32) {
        let mut buffer = self.src.take().expect("the send buffer is ours");
        buffer.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        let op = RegionOp::Write {
            remote: self.remote,
            imm: Some(imm),
        };
        let posted = self.ep.post(buffer, bytes.len(), op).unwrap();
        let c = self.ep.complete(posted, T).expect("the write completes");
        assert_eq!(c.done.opcode, WcOpcode::RDMA_WRITE);
        self.src = c.region;
    }

    /// Writes `bytes` and returns the server's answer (its id).
    fn write(&mut self, bytes: &[u8]) -> i32 {
        self.write_announcing(bytes, bytes.len() as u32);
        self.next_msg().expect("the server's answer").0
    }

    fn name(&mut self, name: &str) -> i32 {
        let mut bytes = name.as_bytes().to_vec();
        bytes.push(0);
        self.write(&bytes)
    }
}

/// The classic client: sends `data` under `name`; returns the ids of the
/// server's messages after the MR (READY per write, then DONE).
fn classic_send(port: u16, name: &str, data: &[u8]) -> Vec<i32> {
    let mut raw = RawClassic::connect(port);
    let mut ids = vec![raw.name(name)];
    for chunk in data.chunks(BUFFER) {
        ids.push(raw.write(chunk));
    }
    ids.push(raw.write(&[]));
    raw.ep.disconnect().unwrap();
    ids
}

/// A write whose immediate announces more bytes than it carries: the
/// rest of the buffer holds stale bytes, never the client's data. The
/// server refuses it and keeps nothing.
#[test]
#[ignore = "needs an RDMA device"]
fn a_write_shorter_than_its_immediate_is_refused_and_nothing_kept() {
    let _g = serial();
    let dst = Scratch::new("dst");
    let server = serve(&dst, "1");
    let mut raw = RawClassic::connect(server.port);
    assert_eq!(raw.name("short.bin"), MSG_READY);
    raw.write_announcing(&[7u8; 1000], 5000);
    assert!(
        raw.next_msg().is_err(),
        "the server answered a write that carried 1000 of its 5000 bytes"
    );
    drop(raw);
    let done = server.finish();
    let line = done.assert_one_error_line("server");
    assert!(
        line.contains("the classic client announced 5000 bytes but wrote 1000"),
        "{line}"
    );
    assert!(dst.names().is_empty(), "{:?}", dst.names());
}

/// A classic transfer holds its name while it is received: a second
/// client sending the same name is refused at once, and the first one's
/// file is what arrives.
#[test]
#[ignore = "needs an RDMA device"]
fn a_classic_transfer_reserves_its_name() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = serve(&dst, "2");
    let mut first = RawClassic::connect(server.port);
    assert_eq!(first.name("same.bin"), MSG_READY);
    let path = src.join("same.bin");
    random_file(&path, 3000, 9);
    let second = send_classic(server.port, &path);
    assert!(!second.status.success(), "{second:#?}");
    let data = vec![5u8; 2000];
    assert_eq!(first.write(&data), MSG_READY);
    assert_eq!(first.write(&[]), MSG_DONE);
    first.ep.disconnect().unwrap();
    let done = server.finish();
    let line = done.assert_one_error_line("server");
    assert!(
        line.contains("same.bin already exists on the server (another client is sending it now)"),
        "{line}"
    );
    assert_eq!(std::fs::read(dst.join("same.bin")).unwrap(), data);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_classic_client_is_served_unchanged() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = serve(&dst, "2");
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
        let cfg = {
            let mut built = QpConfig::default();
            built.connect_timeout = T;
            built
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
    let out = send_classic(port, &path);
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
