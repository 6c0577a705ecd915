//! filexfer on a real RDMA device (SoftRoCE in the test guest): the
//! `filexfer` binary as separate processes, files checked by SHA-256, and
//! a raw native client (this file) that sends what the real client never
//! would. No assertion depends on timing.

mod common;
#[path = "common/fxutil.rs"]
mod fxutil;

use std::time::Duration;

use common::{addr4, serial, Running, Server};
use fxutil::{random_file, run_bounded, sha256, Scratch, FILEXFER};
use pinpoll::connect::cm::Connector;
use pinpoll::connect::RegionDescriptor;
use pinpoll::datapath::Rings;
use pinpoll::{Access, Connection};
use pinpoll_apps::filexfer::protocol::{FailCode, Msg, HELLO};
use pinpoll_apps::filexfer::{engine_config, CHUNK, SLOT_SIZE};

/// Large transfers of an unoptimized build take minutes in the TCG guest.
const BOUND: Duration = Duration::from_secs(900);
const BIG: usize = 64 << 20;

fn start_server(dir: &Scratch, extra: &[&str]) -> Server {
    let mut args = vec!["serve", "--dir", dir.str(), "--timeout", "20"];
    args.extend_from_slice(extra);
    Server::start(FILEXFER, &args)
}

fn send(server: &Server, file: &std::path::Path, extra: &[&str]) -> fxutil::Out {
    let port = server.port_arg();
    let path = file.display().to_string();
    let host = addr4();
    let mut args = vec![
        "send",
        host.as_str(),
        path.as_str(),
        "--port",
        port.as_str(),
        "--timeout",
        "20",
    ];
    args.extend_from_slice(extra);
    run_bounded(FILEXFER, &args, BOUND)
}

fn send_proc(server: &Server, file: &std::path::Path) -> Running {
    let port = server.port_arg();
    let path = file.display().to_string();
    let host = addr4();
    Running::spawn(common::command(
        FILEXFER,
        &["send", &host, &path, "--port", &port, "--timeout", "20"],
    ))
}

fn transfers_arrive_intact(extra: &[&str], sizes: &[usize]) {
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let count = sizes.len().to_string();
    let mut sargs = vec!["--count", count.as_str()];
    sargs.extend_from_slice(extra);
    let server = start_server(&dst, &sargs);
    for (i, &len) in sizes.iter().enumerate() {
        let name = format!("file-{i}-{len}.bin");
        let path = src.join(&name);
        random_file(&path, len, i as u64 + 7);
        let out = send(&server, &path, extra);
        out.assert_ok(&name);
        assert!(
            out.stdout
                .contains(&format!("sent {name}: {len} bytes in ")),
            "{out:#?}"
        );
        assert_eq!(sha256(&dst.join(&name)), sha256(&path), "{name} differs");
    }
    let done = server.finish();
    done.assert_ok("server");
    assert_eq!(
        done.stdout.matches(" received file-").count(),
        sizes.len(),
        "{done:#?}"
    );
    // Only the files themselves: no temporary file is left behind.
    assert_eq!(dst.names().len(), sizes.len(), "{:?}", dst.names());
}

#[test]
#[ignore = "needs an RDMA device"]
fn files_of_every_edge_size_arrive_intact() {
    let _g = serial();
    let c = CHUNK as usize;
    transfers_arrive_intact(&[], &[0, 1, c, c + 1, BIG]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn files_arrive_intact_with_hugepages() {
    let _g = serial();
    let c = CHUNK as usize;
    transfers_arrive_intact(&["--hugepages"], &[0, 1, c, c + 1, 16 * c + 12345]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn an_existing_target_is_refused_unless_overwrite() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    std::fs::write(dst.join("taken.txt"), b"original").unwrap();
    random_file(&src.join("taken.txt"), 1000, 1);
    let server = start_server(&dst, &["--count", "1"]);
    let out = send(&server, &src.join("taken.txt"), &[]);
    let line = out.one_error_line("client");
    assert!(line.contains("already exists"), "{line}");
    let done = server.finish();
    assert!(done.stderr.contains("already exists"), "{done:#?}");
    assert_eq!(std::fs::read(dst.join("taken.txt")).unwrap(), b"original");
    assert_eq!(dst.names(), ["taken.txt"]);

    // A symbolic link is never replaced, even with --overwrite.
    std::os::unix::fs::symlink("/etc/hostname", dst.join("link")).unwrap();
    random_file(&src.join("link"), 10, 2);
    let server = start_server(&dst, &["--count", "2", "--overwrite"]);
    send(&server, &src.join("taken.txt"), &[]).assert_ok("overwrite");
    assert_eq!(
        sha256(&dst.join("taken.txt")),
        sha256(&src.join("taken.txt"))
    );
    let line = send(&server, &src.join("link"), &[])
        .one_error_line("symlink")
        .to_owned();
    assert!(line.contains("symbolic link"), "{line}");
    server.finish();
    assert_eq!(dst.names(), ["link", "taken.txt"]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn no_server_fails_within_the_timeout_with_one_line() {
    let _g = serial();
    let src = Scratch::new("src");
    random_file(&src.join("f"), 10, 3);
    let host = addr4();
    // Port 9 (discard): nothing listens there over rdma_cm in the guest.
    let path = src.join("f").display().to_string();
    let out = run_bounded(
        FILEXFER,
        &["send", &host, &path, "--port", "9", "--timeout", "5"],
        Duration::from_secs(120),
    );
    let line = out.one_error_line("client");
    assert!(line.contains("connecting to"), "{line}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn killing_the_server_mid_transfer_fails_the_client() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    random_file(&src.join("big.bin"), BIG, 4);
    let server = start_server(&dst, &[]);
    let client = send_proc(&server, &src.join("big.bin"));
    server
        .proc
        .wait_for_line(|l| l.contains("receiving big.bin"))
        .expect("the server started receiving");
    drop(server); // kills it through its Child handle
    let out = client.finish();
    let line = out.assert_one_error_line("client");
    assert!(line.contains("server"), "{line}");
    assert!(
        !dst.names().contains(&"big.bin".to_owned()),
        "{:?}",
        dst.names()
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn killing_the_client_mid_transfer_leaves_no_file_and_the_server_goes_on() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    random_file(&src.join("big.bin"), BIG, 5);
    random_file(&src.join("small.bin"), 5000, 6);
    let server = start_server(&dst, &[]);
    let client = send_proc(&server, &src.join("big.bin"));
    server
        .proc
        .wait_for_line(|l| l.contains("receiving big.bin"))
        .expect("the server started receiving");
    drop(client); // kills it through its Child handle
    send(&server, &src.join("small.bin"), &[]).assert_ok("second client");
    server.proc.signal("TERM");
    let done = server.finish();
    assert!(done.stderr.contains("error: client"), "{done:#?}");
    assert_eq!(dst.names(), ["small.bin"]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn wait_for_file_sends_a_file_that_appears_later_over_the_idle_connection() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = start_server(&dst, &["--count", "2"]);
    let port = server.port_arg();
    let host = addr4();
    let later = src.join("later.bin");
    let path = later.display().to_string();
    let args = [
        "send",
        host.as_str(),
        path.as_str(),
        "--port",
        port.as_str(),
        "--timeout",
        "20",
        "--wait-for-file",
        "15",
    ];
    let client = Running::spawn(common::command(FILEXFER, &args));
    client
        .wait_for_line(|l| l.starts_with("waiting up to 15 s for "))
        .expect("the client connected and waits");
    // Written under another name, renamed into place when complete.
    random_file(&src.join("writing.tmp"), 3 * SLOT_SIZE as usize + 17, 21);
    std::fs::rename(src.join("writing.tmp"), &later).unwrap();
    let out = client.finish();
    out.assert_ok("client");
    assert_eq!(sha256(&dst.join("later.bin")), sha256(&later));

    // A file that never appears: one clear error, nothing on the server.
    let never = src.join("never.bin").display().to_string();
    let mut args = args;
    args[2] = never.as_str();
    args[8] = "1";
    let out = run_bounded(FILEXFER, &args, BOUND);
    let line = out.one_error_line("client");
    assert!(
        line.contains("did not appear within --wait-for-file 1 s"),
        "{line}"
    );
    let done = server.finish();
    assert!(done.stderr.contains("error: client"), "{done:#?}");
    assert_eq!(dst.names(), ["later.bin"]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_server_finishing_its_count_refuses_newcomers_at_once() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    random_file(&src.join("late.bin"), 1000, 31);
    let server = start_server(&dst, &["--count", "1"]);
    // The one transfer this server serves holds its connection idle.
    let (port, host) = (server.port_arg(), addr4());
    let held = src.join("held.bin").display().to_string();
    let args = [
        "send",
        host.as_str(),
        held.as_str(),
        "--port",
        port.as_str(),
        "--timeout",
        "20",
        "--wait-for-file",
        "15",
    ];
    let first = Running::spawn(common::command(FILEXFER, &args));
    first
        .wait_for_line(|l| l.starts_with("waiting up to"))
        .expect("the first client connected");
    // --count is reached: a newcomer is refused at once, not left to time out.
    let out = send(&server, &src.join("late.bin"), &[]);
    let line = out.one_error_line("newcomer");
    assert!(line.contains("server busy: finishing"), "{line}");
    random_file(&src.join("held.tmp"), 5000, 32);
    std::fs::rename(src.join("held.tmp"), src.join("held.bin")).unwrap();
    first.finish().assert_ok("first client");
    let done = server.finish();
    done.assert_ok("server");
    assert!(
        done.stdout.contains("refused, server finishing"),
        "{done:#?}"
    );
    assert_eq!(dst.names(), ["held.bin"]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_busy_server_refuses_extra_clients() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    random_file(&src.join("big.bin"), BIG, 8);
    random_file(&src.join("small.bin"), 10, 9);
    let server = start_server(&dst, &["--max-clients", "1"]);
    let first = send_proc(&server, &src.join("big.bin"));
    server
        .proc
        .wait_for_line(|l| l.contains("receiving big.bin"))
        .expect("the server started receiving");
    let out = send(&server, &src.join("small.bin"), &[]);
    let line = out.one_error_line("second client");
    assert!(line.contains("server busy"), "{line}");
    drop(first);
    drop(server);
}

// ---- a raw native client: what the real client never sends ----

struct Raw {
    conn: Connection,
    slots: u32,
}

fn raw_connect(port: u16) -> Connection {
    let cfg = engine_config(Duration::from_secs(20), false);
    let addr = pinpoll::connect::parse_socket_addr(&addr4(), port).unwrap();
    let mut c = Connector::resolve(addr, &cfg.qp).expect("resolve");
    let rings = Rings::prepare(c.endpoint(), &cfg, Access::LOCAL_WRITE).expect("rings");
    let ep = c.connect(&HELLO).expect("connect");
    let peer = RegionDescriptor::decode(ep.peer_private_data())
        .expect("descriptor")
        .0;
    Connection::new(ep, rings, peer, &cfg).expect("connection")
}

fn next_msg(conn: &mut Connection) -> Msg {
    let m = conn.recv().expect("a message from the server");
    Msg::decode(m.data).expect("a valid message")
}

fn fail_of(msg: Msg) -> (FailCode, String) {
    match msg {
        Msg::Fail { code, message } => (code, message),
        other => panic!("expected Fail, got {other:?}"),
    }
}

impl Raw {
    /// Connects and starts a transfer of `size` bytes named `name`.
    fn start(port: u16, name: &[u8], size: u64) -> Raw {
        let mut conn = raw_connect(port);
        conn.send(
            &Msg::Start {
                size,
                name: name.to_vec(),
            }
            .encode(),
        )
        .unwrap();
        match next_msg(&mut conn) {
            Msg::Ready { slots, slot_size } => {
                assert_eq!(slot_size, SLOT_SIZE);
                Raw { conn, slots }
            }
            other => panic!("expected Ready, got {other:?}"),
        }
    }

    fn write(&mut self, slot: u32, data: &[u8], crc: u32) {
        let mut buf = data.to_vec();
        buf.extend_from_slice(&crc.to_be_bytes());
        let off = u64::from(slot % self.slots) * u64::from(SLOT_SIZE);
        self.conn.write(&buf, off, Some(slot)).unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_server_refuses_every_bad_name_and_writes_nothing() {
    let _g = serial();
    let dst = Scratch::new("dst");
    let server = start_server(&dst, &["--max-clients", "16"]);
    let long = vec![b'x'; 256];
    let names: [&[u8]; 8] = [
        b".",
        b"..",
        b"a/b",
        b"/etc/passwd",
        b"../escape",
        b"a\0b",
        b"\xff\xfe",
        b".filexfer-1-1.tmp",
    ];
    for name in names {
        let mut conn = raw_connect(server.port);
        conn.send(
            &Msg::Start {
                size: 1,
                name: name.to_vec(),
            }
            .encode(),
        )
        .unwrap();
        let (code, message) = fail_of(next_msg(&mut conn));
        assert_eq!(code, FailCode::BadRequest, "{name:?}: {message}");
        assert!(message.contains("file name"), "{name:?}: {message}");
    }
    // An empty and a 256-byte name cannot even be encoded: raw bytes.
    for name in [&b""[..], &long[..]] {
        let mut bytes = Msg::Start {
            size: 1,
            name: b"x".to_vec(),
        }
        .encode();
        bytes.truncate(16);
        bytes.extend_from_slice(&(name.len() as u16).to_be_bytes());
        bytes.extend_from_slice(name);
        let mut conn = raw_connect(server.port);
        conn.send(&bytes).unwrap();
        let (code, message) = fail_of(next_msg(&mut conn));
        assert_eq!(code, FailCode::Protocol, "{message}");
        assert!(message.contains("name"), "{message}");
    }
    server.proc.signal("TERM");
    let done = server.finish();
    assert_eq!(
        done.stderr
            .lines()
            .filter(|l| l.starts_with("error: client"))
            .count(),
        10,
        "{done:#?}"
    );
    assert!(dst.names().is_empty(), "{:?}", dst.names());
}

#[test]
#[ignore = "needs an RDMA device"]
fn chunks_that_break_the_rules_fail_the_transfer_and_leave_nothing() {
    let _g = serial();
    let dst = Scratch::new("dst");
    // Room for every connection, including those still tearing down.
    let server = start_server(&dst, &["--max-clients", "16"]);
    let data = vec![7u8; 100];
    let good_crc = crc32c::crc32c(&data);

    // A corrupted chunk (CRC mismatch).
    let mut raw = Raw::start(server.port, b"crc.bin", 100);
    raw.write(0, &data, good_crc ^ 1);
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Integrity, "{message}");
    assert!(message.contains("CRC32C"), "{message}");

    drop(raw);

    // A chunk for the wrong slot.
    let mut raw = Raw::start(server.port, b"slot.bin", 100);
    raw.write(1, &data, good_crc);
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Protocol, "{message}");
    assert!(message.contains("slot 1, expected slot 0"), "{message}");

    drop(raw);

    // More bytes than declared.
    let mut raw = Raw::start(server.port, b"long.bin", 50);
    raw.write(0, &data, good_crc);
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Protocol, "{message}");

    drop(raw);

    // Every chunk right, but the whole-file hash wrong.
    let mut raw = Raw::start(server.port, b"hash.bin", 100);
    raw.write(0, &data, good_crc);
    assert_eq!(next_msg(&mut raw.conn), Msg::Credit { count: 1 });
    raw.conn
        .send(
            &Msg::Finish {
                size: 100,
                sha256: [0; 32],
            }
            .encode(),
        )
        .unwrap();
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Integrity, "{message}");
    assert!(message.contains("SHA-256"), "{message}");

    drop(raw);

    // Finish before all the bytes.
    let mut raw = Raw::start(server.port, b"short.bin", 100);
    raw.conn
        .send(
            &Msg::Finish {
                size: 100,
                sha256: [0; 32],
            }
            .encode(),
        )
        .unwrap();
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Integrity, "{message}");
    drop(raw);

    server.proc.signal("TERM");
    let done = server.finish();
    assert_eq!(
        done.stderr
            .lines()
            .filter(|l| l.starts_with("error: client"))
            .count(),
        5,
        "{done:#?}"
    );
    assert!(dst.names().is_empty(), "nothing kept: {:?}", dst.names());
}
