//! A hostile client against a real `filexfer serve` on the device: every
//! bound SECURITY.md promises, attacked the way an attacker would, with
//! the server's own resources (threads, mappings, descriptors) read from
//! /proc before and after. No assertion depends on timing: what must be
//! quick is bounded by the honest client's own --timeout.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{
    addr4, random_file, run_within, serial, sha256, Finished, Running, Scratch, Server, FILEXFER,
};
use pinpoll::connect::cm::{Connector, HalfOpen};
use pinpoll::connect::{parse_socket_addr, RegionDescriptor};
use pinpoll::{Access, Connection, RemoteSlice};
use pinpoll_apps::filexfer::protocol::{join_hello, FailCode, Msg, HELLO};
use pinpoll_apps::filexfer::{engine_config, space};

const BOUND: Duration = Duration::from_secs(600);

fn start_server(dir: &str, extra: &[&str]) -> Server {
    let mut args = vec!["serve", "--dir", dir];
    args.extend_from_slice(extra);
    Server::start(FILEXFER, &args)
}

fn server_addr(server: &Server) -> SocketAddr {
    parse_socket_addr(&addr4(), server.port).unwrap()
}

/// `filexfer send FILE` with `--timeout SECS`.
fn send(server: &Server, file: &std::path::Path, timeout: &str, extra: &[&str]) -> Finished {
    let (port, host, path) = (server.port_arg(), addr4(), file.display().to_string());
    let mut args = vec!["send", &host, &path, "--port", &port, "--timeout", timeout];
    args.extend_from_slice(extra);
    run_within(FILEXFER, &args, BOUND)
}

/// What a process holds, from /proc.
#[derive(Debug, Clone, Copy)]
struct Held {
    threads: usize,
    maps: usize,
    fds: usize,
}

fn held(pid: u32) -> Held {
    let count = |what: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{what}"))
            .unwrap()
            .count()
    };
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    Held {
        threads: count("task"),
        maps: maps.lines().count(),
        fds: count("fd"),
    }
}

/// A connect request whose private data is no hello at all; the server
/// must reject it.
fn bad_hello(addr: SocketAddr) {
    let qp = engine_config(Duration::from_secs(20), false).qp;
    let connector = Connector::resolve(addr, &qp).expect("resolve");
    match connector.connect(&[b'X'; 56]) {
        Err(pinpoll::Error::Rejected { reason }) => {
            let reason = reason.unwrap_or_default();
            assert!(reason.contains("unknown private data"), "{reason}");
        }
        other => panic!("a bad hello was not rejected: {other:?}"),
    }
}

/// Bad hellos by the thousand, while the only slot is taken and then
/// while honest clients come and go: none gets a thread (the busy check
/// applies to them too), finished transfers' threads are joined, and the
/// server's threads, mappings and descriptors stay flat; every honest
/// client is served.
#[test]
#[ignore = "needs an RDMA device"]
fn bad_hellos_by_the_thousand_leave_threads_and_mappings_flat() {
    let _g = serial();
    let count: usize = std::env::var("PINPOLL_BAD_HELLOS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(BAD_HELLOS);
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = start_server(dst.str(), &["--max-clients", "1", "--timeout", "300"]);
    let addr = server_addr(&server);
    random_file(&src.join("warm.bin"), 1000, 1);
    send(&server, &src.join("warm.bin"), "20", &[]).assert_ok("the first honest client");
    let before = held(server.pid());

    // The only slot held by a client waiting for its file: every bad hello
    // now meets a busy server.
    let held_file = src.join("held.bin");
    let (port, host, path) = (server.port_arg(), addr4(), held_file.display().to_string());
    let holder = Running::spawn(common::command(
        FILEXFER,
        &[
            "send",
            &host,
            &path,
            "--port",
            &port,
            "--timeout",
            "280",
            "--wait-for-file",
            "270",
        ],
    ));
    holder
        .wait_for_line(|l| l.starts_with("waiting up to"))
        .expect("the holder connected");
    let began = std::time::Instant::now();
    flood(addr, count / 2);
    random_file(&held_file, 5000, 2);
    holder
        .finish_within(BOUND)
        .assert_ok("the client that held the slot");

    // Then honest clients between further bad hellos.
    for round in 0..4 {
        flood(addr, count / 8);
        let name = format!("honest-{round}.bin");
        random_file(&src.join(&name), 300_000 + round, 3 + round as u64);
        send(&server, &src.join(&name), "20", &[]).assert_ok(&name);
        assert_eq!(sha256(&dst.join(&name)), sha256(&src.join(&name)));
    }
    eprintln!("{count} bad hellos in {:?}", began.elapsed());
    let after = held(server.pid());
    eprintln!("server before {before:?}, after {after:?}");
    // A leaked thread keeps its stack mapped: at least two mappings per
    // bad hello (the stack and its guard page) before the fix.
    assert!(
        after.threads <= before.threads,
        "threads grew: {before:?} -> {after:?}"
    );
    assert!(
        after.maps <= before.maps + 16,
        "mappings grew: {before:?} -> {after:?}"
    );
    assert!(
        after.fds <= before.fds + 4,
        "descriptors grew: {before:?} -> {after:?}"
    );
    server.proc.signal("TERM");
    let done = server.finish();
    let refused = done
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: client ") && l.contains("unknown private data"))
        .count();
    assert_eq!(
        refused,
        count / 2 + 4 * (count / 8),
        "{}",
        done.stderr.lines().take(5).collect::<Vec<_>>().join("\n")
    );
    assert!(!done.stderr.contains("panicked"));
}

/// The bad hellos of the test above: enough that a leak of a thread's
/// stack per hello is thousands of mappings.
const BAD_HELLOS: usize = 2000;

/// `n` bad hellos, from two threads at once.
fn flood(addr: SocketAddr, n: usize) {
    std::thread::scope(|s| {
        for part in [n / 2, n - n / 2] {
            s.spawn(move || (0..part).for_each(|_| bad_hello(addr)));
        }
    });
}

/// A raw native client's first stream: `Start` with `streams`, and the
/// token of its `Ready`.
fn start_streams(addr: SocketAddr, name: &[u8], size: u64, streams: u16) -> (Connection, u64) {
    let (conn, answer) = start(addr, name, size, streams);
    match answer {
        Msg::Ready { token, .. } => (conn, token),
        other => panic!("expected Ready, got {other:?}"),
    }
}

/// A raw native client's `Start`, and the server's answer.
fn start(addr: SocketAddr, name: &[u8], size: u64, streams: u16) -> (Connection, Msg) {
    let mut conn = Connection::builder(&engine_config(Duration::from_secs(60), false))
        .remote_access(Access::LOCAL_READ)
        .private_data(&HELLO)
        .connect(addr)
        .expect("connect");
    let start = Msg::Start {
        size,
        streams,
        name: name.to_vec(),
    };
    conn.send(&start.encode()).unwrap();
    let m = conn.recv().expect("an answer to Start");
    let answer = Msg::decode(m.data).unwrap();
    (conn, answer)
}

/// Stream 1's join of the transfer whose `Ready` gave `token`, sent as a
/// connect request whose handshake this side never completes.
fn stalled_join(addr: SocketAddr, token: u64) -> HalfOpen {
    let descriptor = RegionDescriptor(RemoteSlice {
        addr: 0x10_0000,
        len: 1 << 20,
        rkey: 1,
    })
    .encode();
    let mut private = descriptor.to_vec();
    private.extend_from_slice(&join_hello(token, 1));
    let qp = engine_config(Duration::from_secs(20), false).qp;
    Connector::resolve(addr, &qp)
        .expect("resolve")
        .connect_half_open(&private)
        .expect("the join's request")
}

/// `told` is the server's `Fail` of a transfer whose stream 1 never
/// joined.
fn assert_join_failed(told: &[u8]) {
    match Msg::decode(told).unwrap() {
        Msg::Fail { code, message } => {
            assert_eq!(code, FailCode::Protocol, "{message}");
            assert!(
                message.contains("stream 1 could not join")
                    || message.contains("streams joined within --timeout"),
                "{message}"
            );
        }
        other => panic!("expected Fail, got {other:?}"),
    }
}

/// A join with a valid token that never completes its handshake (its
/// rdma_cm events are never read): it holds its own transfer, never the
/// accept loop — an honest client with a 5 s budget connects and sends
/// its file meanwhile, with the server's --timeout at 30 s.
#[test]
#[ignore = "needs an RDMA device"]
fn a_stalled_join_never_holds_the_accept_loop() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = start_server(dst.str(), &["--timeout", "30"]);
    let addr = server_addr(&server);
    let (mut first, token) = start_streams(addr, b"striped.bin", 10 << 20, 2);
    let stalled = stalled_join(addr, token);
    // Its REP reached us before the honest client comes, or at least the
    // request is on the server's listener.
    std::thread::sleep(Duration::from_millis(500));
    random_file(&src.join("honest.bin"), 200_000, 5);
    let out = send(&server, &src.join("honest.bin"), "5", &[]);
    out.assert_ok("an honest client while a join stalls");
    assert_eq!(
        sha256(&dst.join("honest.bin")),
        sha256(&src.join("honest.bin"))
    );
    // The stalled transfer fails on its own (the server tells its first
    // stream why) once its join's handshake fails or the wait runs out.
    let told = first.recv().expect("the server's verdict");
    assert_join_failed(told.data);
    drop(stalled);
    server.proc.signal("TERM");
    let done = server.finish();
    assert!(!done.stderr.contains("panicked"), "{done:#?}");
    assert_eq!(dst.names(), ["honest.bin"]);
}

/// A join with a valid token that comes just before the joins' deadline
/// and never completes its handshake: the handshake is given only what is
/// left of the deadline, not a whole --timeout more, so the transfer ends
/// (its first stream told why) by the deadline. The bound is the raw
/// client's own wait for that verdict: 8 s, after the join came 9 s into
/// a --timeout of 12 s (a whole --timeout for the handshake would take 12).
#[test]
#[ignore = "needs an RDMA device"]
fn a_join_just_before_the_deadline_is_given_only_what_is_left_of_it() {
    let _g = serial();
    let dst = Scratch::new("dst");
    let server = start_server(dst.str(), &["--timeout", "12"]);
    let addr = server_addr(&server);
    let (mut first, token) = start_streams(addr, b"striped.bin", 10 << 20, 2);
    std::thread::sleep(Duration::from_secs(9));
    let stalled = stalled_join(addr, token);
    first.set_completion_timeout(Duration::from_secs(8));
    let told = first
        .recv()
        .expect("the server's verdict within 8 s of a join 3 s before its deadline");
    assert_join_failed(told.data);
    drop(stalled);
    server.proc.signal("TERM");
    let done = server.finish();
    assert!(!done.stderr.contains("panicked"), "{done:#?}");
    assert!(dst.names().is_empty(), "{:?}", dst.names());
}

/// Temp files of a server that died: one under the new server's very PID
/// and serial 0 (a PID that came back), one of a live process that holds
/// no lock. The lock alone decides: both are removed, and the first
/// transfer gets a name no earlier server could have left.
#[test]
#[ignore = "needs an RDMA device"]
fn orphans_of_a_reused_pid_or_a_live_pid_are_removed_and_the_first_transfer_works() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let foreign = dst.join(&format!(".filexfer-{}-0.tmp", std::process::id()));
    std::fs::write(&foreign, b"partial, of a live process holding no lock").unwrap();
    // exec keeps the shell's PID: the server finds a file of its own PID.
    let script = format!(
        "printf partial > '{dir}/.filexfer-'$$'-0.tmp' && exec '{FILEXFER}' serve --dir '{dir}' --timeout 20 --count 1 \"$@\"",
        dir = dst.str()
    );
    let server = Server::start("sh", &["-c", &script, "sh"]);
    random_file(&src.join("first.bin"), 3000, 7);
    send(&server, &src.join("first.bin"), "20", &[]).assert_ok("the first transfer");
    let done = server.finish();
    done.assert_ok("server");
    let pid = done
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("removed 2 temporary file(s) left by a server that died: "))
        .unwrap_or_else(|| panic!("no removal of both files reported: {done:#?}"));
    assert!(
        pid.contains(&format!(".filexfer-{}-0.tmp", std::process::id())),
        "{pid}"
    );
    assert_eq!(dst.names(), ["first.bin"]);
    assert_eq!(
        sha256(&dst.join("first.bin")),
        sha256(&src.join("first.bin"))
    );
}

/// A client announcing exactly the free space of --dir, then sending
/// nothing, would hold all of it: it is refused before anything is
/// reserved (the margin of --min-free), and a size beyond the default
/// --max-size is refused as too large.
#[test]
#[ignore = "needs an RDMA device"]
fn a_size_of_all_the_free_space_or_beyond_the_default_max_is_refused() {
    let _g = serial();
    let dst = Scratch::new("dst");
    let server = start_server(dst.str(), &["--timeout", "20"]);
    let addr = server_addr(&server);
    let free = space::usage(std::path::Path::new(dst.str()))
        .expect("statvfs")
        .free;
    for (size, code, says) in [
        (free, FailCode::Io, "(--min-free)"),
        (
            space::DEFAULT_MAX_SIZE + 1,
            FailCode::TooLarge,
            "(--max-size 68719476736)",
        ),
    ] {
        match start(addr, b"all.bin", size, 1).1 {
            Msg::Fail { code: got, message } => {
                assert_eq!(got, code, "{message}");
                assert!(message.contains(says), "{message}");
            }
            other => panic!("{size} bytes: expected Fail, got {other:?}"),
        }
    }
    assert!(dst.names().is_empty(), "{:?}", dst.names());
    server.proc.signal("TERM");
    let done = server.finish();
    assert!(!done.stderr.contains("panicked"), "{done:#?}");
}

/// A message the server cannot decode in the middle of a transfer fails
/// it: the client is told why, nothing is kept, and the server's own
/// error line says which transfer it was and how far it had come (that
/// context was lost when the protocol moved into its state machine).
#[test]
#[ignore = "needs an RDMA device"]
fn an_undecodable_message_mid_transfer_is_told_and_logged_with_its_transfer() {
    let _g = serial();
    let dst = Scratch::new("dst");
    let server = start_server(dst.str(), &["--timeout", "20"]);
    let (mut conn, _token) = start_streams(server_addr(&server), b"odd.bin", 1 << 20, 1);
    conn.send(&[0xee; 9]).unwrap();
    let told = conn.recv().expect("the server's Fail");
    match Msg::decode(told.data).unwrap() {
        Msg::Fail { code, message } => assert_eq!(code, FailCode::Protocol, "{message}"),
        other => panic!("expected Fail, got {other:?}"),
    }
    drop(conn);
    server.proc.signal("TERM");
    let done = server.finish();
    assert!(!done.stderr.contains("panicked"), "{done:#?}");
    let line = done
        .stderr
        .lines()
        .find(|l| l.starts_with("error: client "))
        .unwrap_or_else(|| panic!("no error line: {done:#?}"));
    assert!(
        line.contains("receiving odd.bin (0 bytes so far)"),
        "{line}"
    );
    assert!(dst.names().is_empty(), "{:?}", dst.names());
}
