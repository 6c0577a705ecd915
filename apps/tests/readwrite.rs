//! `readwrite` end to end on a real RDMA device: the server and client as
//! separate processes in write and read mode, messages checked byte for
//! byte on both sides; and, with a hand-made client in this process, that
//! the server refuses what it does not speak and that its region allows
//! exactly its mode's access. Run inside the SoftRoCE guest:
//! `scripts/softroce-vm -- cargo test -p pinpoll-apps -- --include-ignored`.

mod common;

use std::time::Duration;

use common::*;
use pinpoll::connect::cm::Connector;
use pinpoll::connect::{parse_socket_addr, RegionDescriptor};
use pinpoll::{Access, Endpoint, Error, PageSize, Posted, RegionOp, WcStatus};
use pinpoll_apps::protocol::{Hello, Mode};
use pinpoll_apps::session::qp_config;

const WAIT: Duration = Duration::from_secs(TIMEOUT_SECS);

fn t() -> String {
    TIMEOUT_SECS.to_string()
}

#[test]
#[ignore = "needs an RDMA device"]
fn write_mode_lands_the_message_in_the_servers_region() {
    let _serial = serial();
    let (dev, a4, a6) = (device(), addr4(), addr6());
    let t = t();
    let server = Server::start(READWRITE, &["server", "--count", "2", "--timeout", &t]);
    let port = server.port_arg();

    let message = "héllo, région — RDMA WRITE ✓ 42";
    let longest = (0..4096)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect::<String>();
    for (host, text) in [(&a4, message), (&a6, longest.as_str())] {
        let args = [
            "client",
            "write",
            host,
            "--port",
            &port,
            "--message",
            text,
            "-d",
            &dev,
            "--timeout",
            &t,
        ];
        let out = run(READWRITE, &args);
        out.assert_ok("readwrite client write");
        let lines = out.stdout_lines();
        assert!(lines[0].starts_with("connected to "), "{out:#?}");
        assert!(
            lines[1].starts_with("server region: 4096 bytes at 0x"),
            "{out:#?}"
        );
        assert_eq!(
            lines[2],
            format!("wrote {} bytes into the server's region", text.len()),
            "{out:#?}"
        );
        assert_eq!(lines.len(), 3, "{out:#?}");
    }

    let out = server.finish();
    out.assert_ok("readwrite server (write mode)");
    let lines = out.stdout_lines();
    let exposed = "mode write: exposing 4096 bytes with access LOCAL_WRITE|REMOTE_WRITE";
    assert_eq!(
        lines.iter().filter(|l| **l == exposed).count(),
        2,
        "{out:#?}"
    );
    // What landed, byte for byte, each on its own line.
    assert!(lines.contains(&message), "{out:#?}");
    assert!(lines.contains(&longest.as_str()), "{out:#?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn read_mode_fetches_the_servers_message() {
    let _serial = serial();
    let (a4, a6) = (addr4(), addr6());
    let t = t();
    let message = "the server's bytes: ünïcode, tabs\tescaped, 0123456789";
    let server = Server::start(
        READWRITE,
        &[
            "server",
            "--count",
            "2",
            "--message",
            message,
            "--timeout",
            &t,
        ],
    );
    let port = server.port_arg();
    let printed = message.replace('\t', "\\t");

    let out = run(
        READWRITE,
        &["client", "read", &a6, "--port", &port, "--timeout", &t],
    );
    out.assert_ok("readwrite client read");
    let lines = out.stdout_lines();
    assert_eq!(
        lines[1],
        format!(
            "server region: {} bytes at {}",
            message.len(),
            lines[1].split(" at ").nth(1).unwrap()
        ),
        "{out:#?}"
    );
    assert_eq!(lines[2], printed, "{out:#?}");

    let quiet = run(READWRITE, &["client", "read", &a4, "--port", &port, "-q"]);
    quiet.assert_ok("readwrite client read -q");
    assert_eq!(quiet.stdout, format!("{printed}\n"), "{quiet:#?}");

    let out = server.finish();
    out.assert_ok("readwrite server (read mode)");
    let lines = out.stdout_lines();
    let exposed = format!(
        "mode read: exposing {} bytes with access REMOTE_READ",
        message.len()
    );
    assert_eq!(
        lines.iter().filter(|l| **l == exposed).count(),
        2,
        "{out:#?}"
    );
    let read = format!("client read {} bytes", message.len());
    assert_eq!(lines.iter().filter(|l| **l == read).count(), 2, "{out:#?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_default_messages_name_the_peers_pid() {
    let _serial = serial();
    let a4 = addr4();
    let t = t();
    let server = Server::start(READWRITE, &["server", "--count", "2", "--timeout", &t]);
    let port = server.port_arg();
    let writer = Running::spawn(command(
        READWRITE,
        &["client", "write", &a4, "--port", &port],
    ));
    let writer_pid = writer.id();
    writer.finish().assert_ok("readwrite client write");
    let reader = run(READWRITE, &["client", "read", &a4, "--port", &port, "-q"]);
    reader.assert_ok("readwrite client read");
    assert_eq!(
        reader.stdout,
        format!("message from server pid {}\n", server.pid())
    );
    let out = server.finish();
    out.assert_ok("readwrite server");
    let expected = format!("message from client pid {writer_pid}");
    assert!(out.stdout_lines().contains(&expected.as_str()), "{out:#?}");
}

/// Connects to the server on `port` with `private_data`, a receive posted
/// for its descriptor.
fn hand_made_client(port: u16, private_data: &[u8]) -> pinpoll::Result<(Endpoint, Posted)> {
    let addr = parse_socket_addr(&addr4(), port).expect("PINPOLL_ADDR4 parses");
    let mut conn = Connector::resolve(addr, &qp_config(WAIT))?;
    let recv = conn
        .endpoint()
        .register(64, PageSize::Base, Access::LOCAL_WRITE)?;
    let recv = conn.endpoint().post_recv(Some(recv))?;
    let ep = conn.connect(private_data)?;
    Ok((ep, recv))
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_server_refuses_unknown_modes_and_foreign_clients_with_a_reason() {
    let _serial = serial();
    let a4 = addr4();
    let t = t();

    // A readwrite header with mode 9.
    let server = Server::start(READWRITE, &["server", "--count", "1", "--timeout", &t]);
    let mut hello = Hello { mode: Mode::Read }.encode();
    hello[5] = 9;
    let err = hand_made_client(server.port, &hello).unwrap_err();
    let reason = "readwrite client: mode 9 is out of range: allowed 1 (write) or 2 (read)";
    assert!(matches!(err, Error::Rejected { .. }), "{err}");
    assert!(err.to_string().contains(reason), "{err}");
    let out = server.finish();
    let line = out.assert_one_error_line("readwrite server (mode 9)");
    assert!(
        line.starts_with("error: client 169.254.") || line.starts_with("error: client "),
        "{line}"
    );
    assert!(line.ends_with(&format!("refused: {reason}")), "{line}");
    assert_eq!(out.status.code(), Some(1), "{out:#?}");

    // A `basic` client (no header at all).
    let server = Server::start(READWRITE, &["server", "--count", "1", "--timeout", &t]);
    let client = run(BASIC, &["client", &a4, "--port", &server.port_arg()]);
    let line = client.assert_one_error_line("basic client against a readwrite server");
    assert!(
        line.contains("rejected by the peer: not a readwrite client"),
        "{line}"
    );
    let out = server.finish();
    let line = out.assert_one_error_line("readwrite server (basic client)");
    assert!(line.contains("not a readwrite client"), "{line}");
}

/// A client that announces `announced` and then does the other operation:
/// the server's NIC refuses it, because the region was registered for the
/// announced mode only.
fn the_other_access_is_refused(announced: Mode) {
    let _serial = serial();
    device();
    // The server gives up waiting for "done" after 3 s (or at once, when
    // its QP is flushed).
    let server = Server::start(READWRITE, &["server", "--count", "1", "--timeout", "3"]);
    let (mut ep, recv) =
        hand_made_client(server.port, &Hello { mode: announced }.encode()).expect("connect");
    let got = ep.complete(recv, WAIT).expect("the region descriptor");
    let recv = got.region.expect("the receive buffer back");
    let remote = RegionDescriptor::decode(&recv.as_slice()[..got.done.byte_len as usize])
        .expect("a region descriptor")
        .0;
    let len = remote.len as usize;
    let mut local = ep
        .register(len, PageSize::Base, Access::LOCAL_WRITE)
        .expect("register");
    local.as_mut_slice().fill(b'!');
    let op = match announced {
        Mode::Read => RegionOp::Write { remote, imm: None },
        Mode::Write => RegionOp::Read { remote },
    };
    let posted = ep.post(local, len, op).expect("post");
    let wr_id = posted.wr_id();
    let err = ep.complete(posted, WAIT).unwrap_err();
    assert_eq!(
        err.error().completion().map(|wc| (wc.wr_id, wc.status)),
        Some((wr_id, WcStatus::REM_ACCESS_ERR)),
        "{err}"
    );
    drop(ep);
    let out = server.finish();
    let line = out.assert_one_error_line("readwrite server after a refused access");
    eprintln!("client: {err}\nserver: {line}");
    assert!(
        line.contains("waiting for the client's done message"),
        "{line}"
    );
    assert!(
        !out.stdout.contains('!'),
        "nothing was written into the region: {out:#?}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_read_mode_region_refuses_rdma_write() {
    the_other_access_is_refused(Mode::Read);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_mode_region_refuses_rdma_read() {
    the_other_access_is_refused(Mode::Write);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_client_that_disconnects_early_ends_the_servers_wait_at_once() {
    let _serial = serial();
    device();
    // A timeout far longer than the test: only noticing the disconnect
    // produces the error checked below.
    let server = Server::start(READWRITE, &["server", "--count", "1", "--timeout", "300"]);
    let (mut ep, recv) =
        hand_made_client(server.port, &Hello { mode: Mode::Write }.encode()).expect("connect");
    ep.complete(recv, WAIT).expect("the region descriptor");
    ep.disconnect().expect("disconnect");
    let out = server.finish();
    let line = out.assert_one_error_line("readwrite server after an early disconnect");
    assert!(
        line.ends_with("waiting for the client's done message: the peer disconnected"),
        "{line}"
    );
}
