//! filexfer on a real RDMA device (SoftRoCE in the test guest): the
//! `filexfer` binary as separate processes, files checked by SHA-256, and
//! a raw native client (this file) that sends what the real client never
//! would. No assertion depends on timing.

mod common;

use std::time::Duration;

use common::{
    addr4, random_file, run_within, run_within_env, serial, sha256, Finished, Running, Scratch,
    Server, FILEXFER,
};
use pinpoll::{Access, Connection, EngineConfig};
use pinpoll_apps::filexfer::digest::{ChainingValue, ChunkGeometry};
use pinpoll_apps::filexfer::protocol::{join_hello, FailCode, Msg, HELLO};
use pinpoll_apps::filexfer::server::settle;
use pinpoll_apps::filexfer::{engine_config, CHUNK, SLOT_SIZE};

/// Large transfers of an unoptimized build take minutes in the TCG guest.
const BOUND: Duration = Duration::from_secs(900);
const BIG: usize = 64 << 20;

fn start_server(dir: &Scratch, extra: &[&str]) -> Server {
    start_server_in(dir.str(), "20", extra)
}

fn start_server_in(dir: &str, timeout: &str, extra: &[&str]) -> Server {
    start_server_env(dir, timeout, extra, &[])
}

fn start_server_env(dir: &str, timeout: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut args = vec!["serve", "--dir", dir, "--timeout", timeout];
    args.extend_from_slice(extra);
    Server::start_env(FILEXFER, &args, env)
}

/// The server's `error: client ...` lines: one per failed client.
fn client_errors(done: &Finished) -> Vec<&str> {
    assert!(!done.stderr.contains("panicked"), "{done:#?}");
    done.stderr
        .lines()
        .filter(|l| l.starts_with("error: client"))
        .collect()
}

fn send(server: &Server, file: &std::path::Path, extra: &[&str]) -> Finished {
    send_to(server.port, file, extra)
}

fn send_to(port: u16, file: &std::path::Path, extra: &[&str]) -> Finished {
    send_within(port, file, "20", extra, BOUND)
}

/// `filexfer send FILE` to the server on `port` of this guest with
/// `--timeout timeout` and `extra`, bounded by `bound`.
fn send_within(
    port: u16,
    file: &std::path::Path,
    timeout: &str,
    extra: &[&str],
    bound: Duration,
) -> Finished {
    let port = port.to_string();
    let path = file.display().to_string();
    let host = addr4();
    let mut args = vec![
        "send",
        host.as_str(),
        path.as_str(),
        "--port",
        port.as_str(),
        "--timeout",
        timeout,
    ];
    args.extend_from_slice(extra);
    run_within(FILEXFER, &args, bound)
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

/// What a person at a terminal sees. `script` gives the sender a
/// pseudo-terminal and keeps every frame it drew: a bar with the name,
/// bytes, rate and ETA, then the summary. `--quiet` on a terminal, or
/// output to a pipe, draws no bar.
#[test]
#[ignore = "needs an RDMA device"]
fn a_terminal_gets_a_progress_bar_and_quiet_or_a_pipe_gets_none() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = start_server(&dst, &["--count", "3"]);
    let (port, host) = (server.port_arg(), addr4());
    let size = 8usize << 20;
    let on_terminal = |name: &str, extra: &str| -> String {
        let path = src.join(name);
        random_file(&path, size, name.len() as u64);
        let typescript = src.join(&format!("{name}.typescript"));
        let cmd = format!(
            "{FILEXFER} send {host} {} --port {port} --timeout 20 {extra}",
            path.display()
        );
        let out = run_within(
            "script",
            &["-q", "-e", "-c", &cmd, typescript.to_str().unwrap()],
            BOUND,
        );
        out.assert_ok(name);
        assert_eq!(sha256(&dst.join(name)), sha256(&path), "{name} differs");
        String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned()
    };

    let seen = on_terminal("bar.bin", "");
    for frame_part in ["bar.bin [", "/8.00 MiB", "MiB/s", "ETA"] {
        assert!(seen.contains(frame_part), "no {frame_part:?} in {seen:?}");
    }
    assert!(
        seen.contains(&format!("sent bar.bin: {size} bytes in ")),
        "{seen:?}"
    );

    let seen = on_terminal("quiet.bin", "--quiet");
    assert!(!seen.contains("ETA"), "--quiet drew a bar: {seen:?}");

    let path = src.join("piped.bin");
    random_file(&path, size, 3);
    let out = send(&server, &path, &[]);
    out.assert_ok("piped.bin");
    assert!(!out.stderr.contains("ETA"), "a pipe got a bar: {out:#?}");
    server.finish().assert_ok("server");
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
    let line = out.assert_one_error_line("client");
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
        .assert_one_error_line("symlink")
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
    let out = run_within(
        FILEXFER,
        &["send", &host, &path, "--port", "9", "--timeout", "5"],
        Duration::from_secs(120),
    );
    let line = out.assert_one_error_line("client");
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
    let out = run_within(FILEXFER, &args, BOUND);
    let line = out.assert_one_error_line("client");
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
    // --count is reached: a newcomer is refused at once, not left to time
    // out. The server may still be counting the first handshake (it ends on
    // the server's thread after the client saw ESTABLISHED) or already be
    // finishing; either way the refusal says why and when to come back.
    let out = send(&server, &src.join("late.bin"), &[]);
    let line = out.assert_one_error_line("newcomer");
    assert!(
        line.contains("server busy: finishing its last transfers")
            || line.contains("server busy: its last transfer (--count) is starting"),
        "{line}"
    );
    assert!(line.contains("try again later"), "{line}");
    random_file(&src.join("held.tmp"), 5000, 32);
    std::fs::rename(src.join("held.tmp"), src.join("held.bin")).unwrap();
    first.finish().assert_ok("first client");
    let done = server.finish();
    done.assert_ok("server");
    assert!(
        done.stdout.contains("refused, server finishing")
            || done.stdout.contains("refused, server busy"),
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
    let line = out.assert_one_error_line("second client");
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
    raw_connect_with(port, &engine_config(Duration::from_secs(20), false))
}

fn raw_connect_with(port: u16, cfg: &EngineConfig) -> Connection {
    let addr = pinpoll::connect::parse_socket_addr(&addr4(), port).unwrap();
    Connection::builder(cfg)
        .remote_access(Access::LOCAL_READ)
        .private_data(&HELLO)
        .connect(addr)
        .expect("connect")
}

/// Connects, sends `bytes` as one message, and returns the server's answer.
fn raw_exchange(port: u16, bytes: &[u8]) -> Msg {
    let mut conn = raw_connect(port);
    conn.send(bytes).unwrap();
    next_msg(&mut conn)
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
                streams: 1,
                name: name.to_vec(),
            }
            .encode(),
        )
        .unwrap();
        match next_msg(&mut conn) {
            Msg::Ready {
                slots, slot_size, ..
            } => {
                assert_eq!(slot_size, SLOT_SIZE);
                Raw { conn, slots }
            }
            other => panic!("expected Ready, got {other:?}"),
        }
    }

    /// Writes `data` and the chaining value `cv` after it into `slot`.
    fn write(&mut self, slot: u32, data: &[u8], cv: &ChainingValue) {
        let mut buf = data.to_vec();
        buf.extend_from_slice(cv);
        let off = u64::from(slot % self.slots) * u64::from(SLOT_SIZE);
        self.conn.write(&buf, off, Some(slot)).unwrap();
    }

    /// Sends `data` as the real client would (one chunk in flight at a
    /// time), then `Finish`; returns the server's last answer.
    fn send_all(&mut self, data: &[u8]) -> Msg {
        let geometry = ChunkGeometry::v3(data.len() as u64);
        for (i, chunk) in data.chunks(CHUNK as usize).enumerate() {
            let cv = geometry.chunk_cv(i as u64, chunk).unwrap();
            self.write(i as u32 % self.slots, chunk, &cv);
            assert_eq!(next_msg(&mut self.conn), Msg::Credit { count: 1 });
        }
        self.finish(data.len() as u64, *blake3::hash(data).as_bytes())
    }

    fn finish(&mut self, size: u64, digest: [u8; 32]) -> Msg {
        self.conn
            .send(&Msg::Finish { size, digest }.encode())
            .unwrap();
        next_msg(&mut self.conn)
    }
}

/// A fake filexfer server of one client, on a thread: `serve` gets the
/// accepted connection and the size the client's `Start` announced.
fn fake_server(
    serve: impl FnOnce(&mut Connection, u64) + Send + 'static,
) -> (u16, std::thread::JoinHandle<()>) {
    use pinpoll::connect::cm::Listener;
    let addr = pinpoll::connect::parse_socket_addr("::", 0).unwrap();
    let listener = Listener::bind(addr).expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    let handle = std::thread::spawn(move || {
        let cfg = engine_config(Duration::from_secs(20), false);
        let req = listener
            .next_request(&cfg.qp, Duration::from_secs(120))
            .expect("a client");
        let mut conn = Connection::builder(&cfg)
            .remote_access(Access::REMOTE_WRITE)
            .accept(req)
            .expect("accept");
        let Msg::Start { size, .. } = next_msg(&mut conn) else {
            panic!("expected Start")
        };
        serve(&mut conn, size);
    });
    (port, handle)
}

/// A filexfer server of one transfer of one chunk, on a thread, that
/// returns `credits` credits for that chunk and then says `Complete`.
fn server_crediting(credits: u32) -> (u16, std::thread::JoinHandle<()>) {
    fake_server(move |conn, size| {
        assert!(size <= CHUNK, "one chunk");
        let ready = Msg::Ready {
            slots: 16,
            slot_size: SLOT_SIZE,
            token: 0,
        };
        conn.send(&ready.encode()).unwrap();
        let chunk = conn.recv().expect("the chunk");
        assert_eq!(chunk.imm, Some(0), "the chunk, into slot 0");
        conn.send(&Msg::Credit { count: credits }.encode()).unwrap();
        // The client reads the credits only after its Finish.
        let finish = next_msg(conn);
        assert!(matches!(finish, Msg::Finish { .. }), "{finish:?}");
        // A client that refused the credits may be gone already.
        let _ = conn.send(&Msg::Complete { size }.encode());
        // Until the client leaves.
        while conn.recv().is_ok() {}
    })
}

/// Sends `Credit{1}` every `every`, at most `most` times, until the
/// client's side no longer takes one; returns how many it took (their
/// sends completed: a post alone says nothing of the peer).
fn credit_until_gone(conn: &mut Connection, most: u64, every: Duration) -> u64 {
    let mut taken = 0;
    while taken < most
        && conn.send(&Msg::Credit { count: 1 }.encode()).is_ok()
        && settle(conn, Duration::from_secs(20), "client").is_ok()
    {
        taken += 1;
        std::thread::sleep(every);
    }
    taken
}

/// After its digest (`Finish`) the client waits for the server's
/// `Complete` at most twice its --timeout in all, however the server
/// spaces out the credits of the chunks still in its ring: here 15 chunks
/// are left in a ring of 16, returned one a second (each well within the
/// --timeout of 3 s), and no `Complete` ever comes.
#[test]
#[ignore = "needs an RDMA device"]
fn credits_returned_one_by_one_after_the_digest_do_not_stretch_the_wait_for_complete() {
    const CHUNKS: u64 = 15;
    let src = Scratch::new("src");
    let file = src.join("fifteen-chunks.bin");
    random_file(&file, (CHUNKS * CHUNK) as usize, 26);
    let (port, server) = fake_server(|conn, _| {
        let ready = Msg::Ready {
            slots: 16,
            slot_size: SLOT_SIZE,
            token: 0,
        };
        conn.send(&ready.encode()).unwrap();
        for i in 0..CHUNKS {
            let chunk = conn.recv().expect("a chunk");
            assert_eq!(chunk.imm, Some(i as u32), "chunk {i}, into its slot");
        }
        let finish = next_msg(conn);
        assert!(matches!(finish, Msg::Finish { .. }), "{finish:?}");
        // The fault happened: the client's side took (acknowledged)
        // credits after its digest.
        let taken = credit_until_gone(conn, CHUNKS, Duration::from_secs(1));
        assert!(taken >= 2, "only {taken} credits were taken after Finish");
    });
    let done = send_within(port, &file, "3", &[], Duration::from_secs(300));
    let line = done.assert_one_error_line("send to a server that never completes");
    assert!(line.contains("did not confirm"), "{line}");
    server.join().unwrap();
}

/// A client that failed the transfer waits for the server's verdict at
/// most its --timeout, however many credits the server keeps sending:
/// here, after a credit too many (the client's failure), one more every
/// 200 ms until the client leaves.
#[test]
#[ignore = "needs an RDMA device"]
fn credits_sent_forever_do_not_keep_a_failed_client_waiting_for_the_verdict() {
    let src = Scratch::new("src");
    let file = src.join("two-chunks.bin");
    random_file(&file, CHUNK as usize + 1000, 25);
    let (port, server) = fake_server(|conn, _| {
        let ready = Msg::Ready {
            slots: 1,
            slot_size: SLOT_SIZE,
            token: 0,
        };
        conn.send(&ready.encode()).unwrap();
        assert_eq!(conn.recv().expect("chunk 0").imm, Some(0));
        conn.send(&Msg::Credit { count: 2 }.encode()).unwrap();
        // The fault happened: the client's side still took credits after
        // its verdict wait began (its --timeout is 3 s).
        let taken = credit_until_gone(conn, u64::MAX, Duration::from_millis(200));
        assert!(
            taken > 5,
            "only {taken} credits were taken before the client left"
        );
    });
    let done = send_within(port, &file, "3", &[], Duration::from_secs(120));
    let line = done.assert_one_error_line("send to a server that credits forever");
    assert!(line.contains("more credits than it holds chunks"), "{line}");
    server.join().unwrap();
}

/// A server that returns two credits for the one chunk in its ring is
/// refused by the sender, which reports the transfer failed; one credit
/// for one chunk is the honest case, and succeeds.
#[test]
#[ignore = "needs an RDMA device"]
fn more_credits_than_chunks_in_flight_fail_the_sender() {
    let src = Scratch::new("src");
    let file = src.join("one-chunk.bin");
    random_file(&file, 1000, 24);
    let (port, server) = server_crediting(1);
    send_to(port, &file, &[]).assert_ok("send to an honest server");
    server.join().unwrap();

    let (port, server) = server_crediting(2);
    let done = send_to(port, &file, &[]);
    let line = done.assert_one_error_line("send to a server returning 2 credits for 1 chunk");
    assert!(
        line.contains(
            "the server returned more credits than it holds chunks: 2 with 1 of this side's chunks in its ring of 16 slots"
        ),
        "{line}"
    );
    server.join().unwrap();
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
                streams: 1,
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
            streams: 1,
            name: b"x".to_vec(),
        }
        .encode();
        bytes.truncate(18);
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
    let good = ChunkGeometry::v3(100).chunk_cv(0, &data).unwrap();
    let mut bad_cv = good;
    bad_cv[31] ^= 1;

    // A chunk that does not match its value: its credit comes back as
    // soon as it is copied; the verdict by the next message at the latest.
    let mut raw = Raw::start(server.port, b"cv.bin", 100);
    raw.write(0, &data, &bad_cv);
    assert_eq!(next_msg(&mut raw.conn), Msg::Credit { count: 1 });
    let (code, message) = fail_of(raw.finish(100, *blake3::hash(&data).as_bytes()));
    assert_eq!(code, FailCode::Integrity, "{message}");
    assert!(
        message.contains("chunk 0 (bytes 0..) does not match its BLAKE3 chaining value"),
        "{message}"
    );

    drop(raw);

    // A chunk for the wrong slot.
    let mut raw = Raw::start(server.port, b"slot.bin", 100);
    raw.write(1, &data, &good);
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Protocol, "{message}");
    assert!(message.contains("slot 1, expected slot 0"), "{message}");

    drop(raw);

    // More bytes than declared.
    let mut raw = Raw::start(server.port, b"long.bin", 50);
    raw.write(0, &data, &good);
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Protocol, "{message}");

    drop(raw);

    // Every chunk right, but the whole-file hash wrong.
    let mut raw = Raw::start(server.port, b"hash.bin", 100);
    raw.write(0, &data, &good);
    assert_eq!(next_msg(&mut raw.conn), Msg::Credit { count: 1 });
    raw.conn
        .send(
            &Msg::Finish {
                size: 100,
                digest: [0; 32],
            }
            .encode(),
        )
        .unwrap();
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Integrity, "{message}");
    assert!(message.contains("BLAKE3 digest"), "{message}");

    drop(raw);

    // Every byte there and the hash right, but Finish names another size.
    let mut raw = Raw::start(server.port, b"size.bin", 100);
    raw.write(0, &data, &good);
    assert_eq!(next_msg(&mut raw.conn), Msg::Credit { count: 1 });
    let (code, message) = fail_of(raw.finish(99, *blake3::hash(&data).as_bytes()));
    assert_eq!(code, FailCode::Integrity, "{message}");
    assert!(
        message.contains("declared 100 bytes, finished with 99, and 100 arrived"),
        "{message}"
    );
    drop(raw);

    // Finish before all the bytes.
    let mut raw = Raw::start(server.port, b"short.bin", 100);
    raw.conn
        .send(
            &Msg::Finish {
                size: 100,
                digest: [0; 32],
            }
            .encode(),
        )
        .unwrap();
    let (code, message) = fail_of(next_msg(&mut raw.conn));
    assert_eq!(code, FailCode::Integrity, "{message}");
    drop(raw);
    assert!(dst.names().is_empty(), "nothing kept: {:?}", dst.names());

    // A failed transfer gives its name back: the same name then goes
    // through.
    let mut raw = Raw::start(server.port, b"cv.bin", 100);
    assert_eq!(raw.send_all(&data), Msg::Complete { size: 100 });
    drop(raw);

    server.proc.signal("TERM");
    let done = server.finish();
    assert_eq!(
        done.stderr
            .lines()
            .filter(|l| l.starts_with("error: client"))
            .count(),
        6,
        "{done:#?}"
    );
    assert_eq!(dst.names(), ["cv.bin"]);
    assert_eq!(std::fs::read(dst.join("cv.bin")).unwrap(), data);
}

// ---- malformed messages, symlinks, races, space, memlock ----

/// Every malformed or out-of-order control message gets a
/// `Fail` (Protocol) naming the problem, or a disconnect; a silent client
/// is dropped after the server's `--timeout`; nothing is kept; and good
/// transfers succeed beside and after the bad clients.
#[test]
#[ignore = "needs an RDMA device"]
fn malformed_control_messages_are_refused_and_the_server_goes_on() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    random_file(&src.join("good-1.bin"), 3 * CHUNK as usize + 99, 31);
    random_file(&src.join("good-2.bin"), 2 * CHUNK as usize + 7, 32);
    // A short --timeout, which the silent clients below outlast.
    let server = start_server_in(dst.str(), "5", &["--max-clients", "32"]);
    let mut bad = 0;

    // Two silent clients: one says nothing at all, one stops after Start.
    let mut silent = raw_connect(server.port);
    let mut stalled = Raw::start(server.port, b"stalled.bin", 1000);
    bad += 2;
    // A good transfer while they hold their connections.
    send(&server, &src.join("good-1.bin"), &[]).assert_ok("a good client beside silent ones");
    assert_eq!(
        sha256(&dst.join("good-1.bin")),
        sha256(&src.join("good-1.bin"))
    );
    // The server gives up on each after its --timeout and disconnects.
    for (who, conn) in [("silent", &mut silent), ("stalled", &mut stalled.conn)] {
        if let Ok(m) = conn.recv() {
            panic!(
                "{who}: expected the server to disconnect, got a {}-byte message",
                m.len
            );
        }
    }
    drop((silent, stalled));

    let start = Msg::Start {
        size: 10,
        streams: 1,
        name: b"m.bin".to_vec(),
    }
    .encode();
    let kind = |k: u8| {
        let mut b = start.clone();
        b[5] = k;
        b
    };
    let mut longer = start.clone();
    longer.extend_from_slice(b"xyz");
    let mut v2 = start.clone();
    v2[4] = 2;
    let mut big_credit = Msg::Credit { count: 1 }.encode();
    big_credit.resize(60_000, 0);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated header",
            start[..5].to_vec(),
            "5 bytes, shorter than the 8-byte header",
        ),
        (
            "truncated Start",
            start[..12].to_vec(),
            "Start with a 4-byte body, expected at least 12",
        ),
        (
            "Start with bytes after its name",
            longer,
            "Start with a 20-byte body, expected 17",
        ),
        (
            "oversized Credit",
            big_credit,
            "Credit with a 59992-byte body, expected 4",
        ),
        ("unknown kind", kind(42), "unknown message kind 42"),
        ("unknown version", v2, "version 2 (this side speaks 3)"),
        (
            "Finish first",
            Msg::Finish {
                size: 0,
                digest: [0; 32],
            }
            .encode(),
            "Finish before Start",
        ),
        (
            "Ready from a client",
            Msg::Ready {
                slots: 16,
                slot_size: SLOT_SIZE,
                token: 0,
            }
            .encode(),
            "Ready before Start",
        ),
        (
            "Complete from a client",
            Msg::Complete { size: 0 }.encode(),
            "Complete before Start",
        ),
    ];
    for (what, bytes, expected) in cases {
        let (code, message) = fail_of(raw_exchange(server.port, &bytes));
        assert_eq!(code, FailCode::Protocol, "{what}: {message}");
        assert!(message.contains(expected), "{what}: {message}");
        bad += 1;
    }

    // Out of order during a transfer: a second Start, a Ready, a Credit.
    let during = [
        (
            Msg::Start {
                size: 10,
                streams: 1,
                name: b"dup.bin".to_vec(),
            },
            "Start during the transfer",
        ),
        (
            Msg::Ready {
                slots: 16,
                slot_size: SLOT_SIZE,
                token: 0,
            },
            "Ready during the transfer",
        ),
        (Msg::Credit { count: 1 }, "Credit during the transfer"),
    ];
    for (msg, expected) in during {
        let mut raw = Raw::start(server.port, b"dup.bin", 10);
        raw.conn.send(&msg.encode()).unwrap();
        let (code, message) = fail_of(next_msg(&mut raw.conn));
        assert_eq!(code, FailCode::Protocol, "{message}");
        assert!(message.contains(expected), "{message}");
        bad += 1;
    }

    // A message bigger than the server's receive slot: its receive fails
    // (the NIC cannot place it), and the server drops the connection.
    let mut cfg = engine_config(Duration::from_secs(20), false);
    cfg.slot_size = 2 * SLOT_SIZE;
    let mut conn = raw_connect_with(server.port, &cfg);
    let mut huge = start.clone();
    huge.resize(SLOT_SIZE as usize + 1, 0);
    conn.send(&huge).unwrap();
    if let Ok(m) = conn.recv() {
        panic!(
            "oversized: expected a disconnect, got a {}-byte message",
            m.len
        );
    }
    drop(conn);
    bad += 1;

    send(&server, &src.join("good-2.bin"), &[]).assert_ok("a good client after bad ones");
    assert_eq!(
        sha256(&dst.join("good-2.bin")),
        sha256(&src.join("good-2.bin"))
    );
    server.proc.signal("TERM");
    let done = server.finish();
    let errors = client_errors(&done);
    assert_eq!(errors.len(), bad, "{done:#?}");
    assert_eq!(
        errors.iter().filter(|l| l.contains("--timeout")).count(),
        2,
        "the silent clients: {done:#?}"
    );
    assert_eq!(dst.names(), ["good-1.bin", "good-2.bin"]);
}

/// A symlink in the target directory pointing outside it
/// is never followed: sending its name is refused ("exists"), with or
/// without --overwrite, also when the link appears during the transfer;
/// the outside file stays as it was, byte for byte.
#[test]
#[ignore = "needs an RDMA device"]
fn a_symlink_in_the_target_directory_is_never_followed() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let outside = Scratch::new("outside");
    let secret = outside.join("secret");
    std::fs::write(&secret, b"outside the server's directory\n").unwrap();
    let before = std::fs::read(&secret).unwrap();
    std::os::unix::fs::symlink(&secret, dst.join("evil")).unwrap();
    random_file(&src.join("evil"), 3000, 41);
    let untouched = |link: &str| {
        assert_eq!(std::fs::read(&secret).unwrap(), before, "outside file");
        assert_eq!(std::fs::read_link(dst.join(link)).unwrap(), secret);
        assert_eq!(outside.names(), ["secret"]);
    };
    for overwrite in [false, true] {
        let mut extra = vec!["--count", "2", "--max-clients", "4"];
        if overwrite {
            extra.push("--overwrite");
        }
        let server = start_server(&dst, &extra);
        let out = send(&server, &src.join("evil"), &[]);
        let line = out.assert_one_error_line("client").to_owned();
        assert!(
            line.contains("evil exists on the server as a symbolic link"),
            "--overwrite {overwrite}: {line}"
        );
        untouched("evil");

        // The link appears after the server checked the name, while the
        // data is on its way: putting the file in place still refuses it.
        let data = vec![5u8; 100];
        let mut raw = Raw::start(server.port, b"late", 100);
        std::os::unix::fs::symlink(&secret, dst.join("late")).unwrap();
        let (code, message) = fail_of(raw.send_all(&data));
        assert_eq!(code, FailCode::Exists, "{message}");
        assert!(message.contains("late"), "{message}");
        assert!(message.contains("exists"), "{message}");
        drop(raw);
        let done = server.finish();
        assert_eq!(client_errors(&done).len(), 2, "{done:#?}");
        untouched("evil");
        untouched("late");
        assert_eq!(dst.names(), ["evil", "late"], "no temp file left");
        std::fs::remove_file(dst.join("late")).unwrap();
    }
}

/// Two clients send the same name at once; exactly one
/// wins, the other is told the name exists (at its Start when the first is
/// under way), no temp file is left.
#[test]
#[ignore = "needs an RDMA device"]
fn two_clients_sending_the_same_name_at_once_one_wins() {
    let _g = serial();
    let a = Scratch::new("a");
    let b = Scratch::new("b");
    let dst = Scratch::new("dst");
    random_file(&a.join("same.bin"), 1 << 20, 51);
    random_file(&b.join("same.bin"), 1 << 20, 52);
    assert_ne!(sha256(&a.join("same.bin")), sha256(&b.join("same.bin")));
    let server = start_server(&dst, &["--max-clients", "4", "--count", "4"]);

    // Two real clients, started together.
    let pa = send_proc(&server, &a.join("same.bin"));
    let pb = send_proc(&server, &b.join("same.bin"));
    let (oa, ob) = (pa.finish(), pb.finish());
    let (winner, winner_out, loser_out) = match (oa.status.success(), ob.status.success()) {
        (true, false) => (&a, oa, ob),
        (false, true) => (&b, ob, oa),
        _ => panic!("exactly one client must win: {oa:#?} {ob:#?}"),
    };
    winner_out.assert_ok("the winner");
    let line = loser_out.assert_one_error_line("the loser");
    assert!(
        line.contains("same.bin already exists on the server"),
        "{line}"
    );
    assert_eq!(
        sha256(&dst.join("same.bin")),
        sha256(&winner.join("same.bin"))
    );

    // The race made certain: the first transfer is under way when the
    // second starts. The name is reserved at Start: the second client is
    // told before it sends any data.
    let first = vec![1u8; 100];
    let mut r1 = Raw::start(server.port, b"race.bin", 100);
    let second = Msg::Start {
        size: 100,
        streams: 1,
        name: b"race.bin".to_vec(),
    };
    let (code, message) = fail_of(raw_exchange(server.port, &second.encode()));
    assert_eq!(code, FailCode::Exists, "{message}");
    assert!(
        message
            .contains("race.bin already exists on the server (another client is sending it now)"),
        "{message}"
    );
    assert_eq!(r1.send_all(&first), Msg::Complete { size: 100 });
    drop(r1);

    let done = server.finish();
    assert_eq!(client_errors(&done).len(), 2, "{done:#?}");
    assert_eq!(std::fs::read(dst.join("race.bin")).unwrap(), first);
    assert_eq!(dst.names(), ["race.bin", "same.bin"], "no temp file left");
}

/// A size larger than the free space of --dir is
/// refused before any data moves.
#[test]
#[ignore = "needs an RDMA device"]
fn a_size_beyond_the_free_space_is_refused_before_any_data() {
    let _g = serial();
    let dst = Scratch::new("dst");
    // Beyond the default --max-size (64 GiB) the size is too large before
    // any space is looked at; with no --max-size bound, the space decides.
    let max = u64::MAX.to_string();
    let server = start_server(&dst, &["--max-clients", "4", "--max-size", &max]);
    for size in [1u64 << 50, u64::MAX] {
        let start = Msg::Start {
            size,
            streams: 1,
            name: b"huge.bin".to_vec(),
        };
        let (code, message) = fail_of(raw_exchange(server.port, &start.encode()));
        assert_eq!(code, FailCode::Io, "{message}");
        assert!(
            message.contains("no space left on the server for huge.bin (ENOSPC)")
                && message.contains(&format!("it is {size} bytes")),
            "{message}"
        );
    }
    server.proc.signal("TERM");
    let done = server.finish();
    assert_eq!(client_errors(&done).len(), 2, "{done:#?}");
    assert!(dst.names().is_empty(), "{:?}", dst.names());
}

/// A tmpfs mounted for one test, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount(8) syntax) on `at`; the tests run
    /// as root in the guest, and a mount that fails fails the test.
    fn mount(at: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "pinpoll-test"])
            .arg(at)
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs on {} failed (the device tests run as root in scripts/softroce-vm): {out:?}",
            at.display()
        );
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A directory too small for the file: the real client
/// is told there is no space (ENOSPC) before any data moves, and nothing
/// is left; the space of a transfer under way is reserved, so a second
/// file that would fit the free space of the moment is refused too, and
/// the first one arrives whole.
#[test]
#[ignore = "needs an RDMA device"]
fn a_tmpfs_too_small_gets_enospc_and_keeps_nothing() {
    let _g = serial();
    let src = Scratch::new("src");
    let base = Scratch::new("small");
    let mnt = base.join("mnt");
    let _tmpfs = Tmpfs::mount(&mnt, "1m");
    let dir = mnt.to_str().unwrap();
    let listing = || {
        let mut v: Vec<String> = std::fs::read_dir(&mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    random_file(&src.join("big.bin"), 4 << 20, 61);
    random_file(&src.join("fits.bin"), 500 << 10, 62);
    let server = start_server_in(dir, "20", &["--max-clients", "4"]);

    let out = send(&server, &src.join("big.bin"), &[]);
    let line = out.assert_one_error_line("client");
    assert!(
        line.contains("no space left on the server for big.bin (ENOSPC)"),
        "{line}"
    );
    assert!(listing().is_empty(), "{:?}", listing());

    let reserved: Vec<u8> = (0..700u32 << 10).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut raw = Raw::start(server.port, b"reserved.bin", reserved.len() as u64);
    // 500 KiB would fit the free space, were it not reserved for the
    // transfer under way.
    let out = send(&server, &src.join("fits.bin"), &[]);
    let line = out.assert_one_error_line("second client");
    assert!(
        line.contains("no space left on the server for fits.bin (ENOSPC)"),
        "{line}"
    );
    assert_eq!(
        raw.send_all(&reserved),
        Msg::Complete {
            size: reserved.len() as u64
        }
    );
    drop(raw);

    server.proc.signal("TERM");
    let done = server.finish();
    assert_eq!(client_errors(&done).len(), 2, "{done:#?}");
    assert_eq!(listing(), ["reserved.bin"], "no temp file left");
    assert_eq!(std::fs::read(mnt.join("reserved.bin")).unwrap(), reserved);
}

/// Fails the test unless the test-only hook `env` exists: debug builds only.
fn needs_debug_build(env: &str) {
    if !cfg!(debug_assertions) {
        panic!("{env} exists only in debug builds: run the debug test build");
    }
}

/// One bit flipped in one chunk (the client's test-only
/// hook, after the chunk's chaining value was computed) fails the transfer; no
/// file is put in place; the same file then goes through intact.
#[test]
#[ignore = "needs an RDMA device"]
fn a_flipped_bit_in_one_chunk_fails_the_transfer_and_keeps_nothing() {
    use pinpoll_apps::filexfer::client::FLIP_BIT_ENV;
    let _g = serial();
    let line = a_fault_fails_once_then_the_file_goes_through(
        (FLIP_BIT_ENV, "2"),
        ("flip.bin", 5 * CHUNK as usize + 10),
        &[],
    );
    assert!(
        line.contains("flip.bin")
            && line.contains("chunk 2 (bytes 524288..) does not match its BLAKE3 chaining value"),
        "{line}"
    );
}

/// Sends a random file `name` of `len` bytes (with `extra` flags) with the
/// client's test-only fault hook `hook` set, which must fail the transfer
/// with one error line (returned) and keep nothing; then the same file
/// without the fault, which must arrive intact; the server reports the one
/// failure.
fn a_fault_fails_once_then_the_file_goes_through(
    hook: (&str, &str),
    file: (&str, usize),
    extra: &[&str],
) -> String {
    a_fault_fails_once_then_the_file_goes_through_to(&[], hook, file, extra)
}

/// [`a_fault_fails_once_then_the_file_goes_through`] to a server started
/// with `server_args` too.
fn a_fault_fails_once_then_the_file_goes_through_to(
    server_args: &[&str],
    hook: (&str, &str),
    (name, len): (&str, usize),
    extra: &[&str],
) -> String {
    needs_debug_build(hook.0);
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let file = src.join(name);
    random_file(&file, len, len as u64);
    let mut args = vec!["--count", "2"];
    args.extend_from_slice(server_args);
    let server = start_server(&dst, &args);
    let (host, port, path) = (addr4(), server.port_arg(), file.display().to_string());
    let mut args = vec!["send", &host, &path, "--port", &port, "--timeout", "20"];
    args.extend_from_slice(extra);
    let out = run_within_env(FILEXFER, &args, &[hook], BOUND);
    let line = out.assert_one_error_line("client").to_owned();
    assert!(dst.names().is_empty(), "{:?}", dst.names());
    send(&server, &file, extra).assert_ok("the same file without the fault");
    assert_eq!(sha256(&dst.join(name)), sha256(&file));
    let done = server.finish();
    assert_eq!(client_errors(&done).len(), 1, "{done:#?}");
    assert_eq!(dst.names(), [name]);
    line
}

/// `--min-rate`: a client that trickles its chunks (one per 400 ms, 640
/// KiB/s, against 1 MiB/s) is ended once a whole window has passed, with
/// an error that names the bound; nothing is kept, and the same file then
/// goes through (it ends long before a window, so it is never measured).
#[test]
#[ignore = "needs an RDMA device"]
fn a_client_below_min_rate_is_cut_off_and_nothing_is_kept() {
    use pinpoll_apps::filexfer::client::TRICKLE_ENV;
    let _g = serial();
    let line = a_fault_fails_once_then_the_file_goes_through_to(
        &["--min-rate", "1048576"],
        (TRICKLE_ENV, "400"),
        ("slow.bin", 40 * CHUNK as usize + 5),
        &[],
    );
    assert!(
        line.contains("slow.bin")
            && line.contains("fell below --min-rate")
            && line.contains("at least 1048576 required"),
        "{line}"
    );
}

/// `--deadline`: a transfer that takes longer is ended with an error that
/// names the bound, its temporary file removed, and the server reports it.
#[test]
#[ignore = "needs an RDMA device"]
fn a_transfer_past_its_deadline_is_ended_and_nothing_is_kept() {
    use pinpoll_apps::filexfer::client::TRICKLE_ENV;
    let _g = serial();
    needs_debug_build(TRICKLE_ENV);
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let file = src.join("late.bin");
    random_file(&file, 20 * CHUNK as usize, 5);
    let server = start_server(
        &dst,
        &["--count", "1", "--deadline", "2", "--min-rate", "0"],
    );
    let (host, port, path) = (addr4(), server.port_arg(), file.display().to_string());
    let args = ["send", &host, &path, "--port", &port, "--timeout", "20"];
    let out = run_within_env(FILEXFER, &args, &[(TRICKLE_ENV, "500")], BOUND);
    let line = out.assert_one_error_line("client");
    assert!(
        line.contains("late.bin") && line.contains("took longer than --deadline 2 s"),
        "{line}"
    );
    let done = server.finish();
    assert_eq!(client_errors(&done).len(), 1, "{done:#?}");
    assert!(dst.names().is_empty(), "{:?}", dst.names());
}

/// `--max-size`: a native client declaring more is refused at its Start,
/// before the server reserves anything (no Ready, no temp file); a
/// classic client, which declares no size, is cut off once it sends more;
/// a file of exactly the limit goes through either way.
#[test]
#[ignore = "needs an RDMA device"]
fn max_size_refuses_larger_files_native_at_start_and_classic_while_receiving() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = start_server(&dst, &["--max-size", "1000", "--count", "5"]);

    let (code, message) = fail_of(raw_exchange(
        server.port,
        &Msg::Start {
            size: 1001,
            streams: 1,
            name: b"raw.bin".to_vec(),
        }
        .encode(),
    ));
    assert_eq!(code, FailCode::TooLarge, "{message}");
    assert!(
        message.contains("raw.bin is 1001 bytes, more than the server takes (--max-size 1000)"),
        "{message}"
    );

    random_file(&src.join("big.bin"), 1001, 61);
    let out = send(&server, &src.join("big.bin"), &[]);
    let line = out.assert_one_error_line("native client");
    assert!(line.contains("--max-size 1000"), "{line}");

    random_file(&src.join("classic.bin"), 5000, 62);
    let out = send(&server, &src.join("classic.bin"), &["--classic"]);
    assert!(!out.status.success(), "{out:#?}");
    assert!(dst.names().is_empty(), "{:?}", dst.names());

    random_file(&src.join("limit.bin"), 1000, 63);
    send(&server, &src.join("limit.bin"), &[]).assert_ok("a file of the limit");
    assert_eq!(
        sha256(&dst.join("limit.bin")),
        sha256(&src.join("limit.bin"))
    );
    random_file(&src.join("limit-classic.bin"), 1000, 64);
    send(&server, &src.join("limit-classic.bin"), &["--classic"]).assert_ok("classic at the limit");
    assert_eq!(
        sha256(&dst.join("limit-classic.bin")),
        sha256(&src.join("limit-classic.bin"))
    );

    let done = server.finish();
    let errors = client_errors(&done);
    assert_eq!(errors.len(), 3, "{done:#?}");
    assert!(
        errors.iter().any(|l| l.contains(
            "classic.bin is more than 1000 bytes (--max-size of the server); the transfer was cut off and nothing kept"
        )),
        "{done:#?}"
    );
    assert_eq!(dst.names(), ["limit-classic.bin", "limit.bin"]);
}

/// The `BLAKE3 <hex>` a summary line ends with.
fn printed_digest(output: &str, line_start: &str) -> String {
    let line = output
        .lines()
        .find(|l| l.contains(line_start))
        .unwrap_or_else(|| panic!("no line with {line_start:?} in {output:?}"));
    let (_, hex) = line
        .rsplit_once(", BLAKE3 ")
        .unwrap_or_else(|| panic!("no digest in {line:?}"));
    hex.to_owned()
}

/// Protocol 3's digest, merged from per-chunk chaining values on several
/// verifier threads, is `blake3::hash(file)` (what `b3sum` prints), on
/// both sides' summary lines, at every edge of BLAKE3's and the
/// protocol's chunks, and with many chunks wrapping the 16-slot ring
/// around with a short tail; the stored file is the sent one.
#[test]
#[ignore = "needs an RDMA device"]
fn the_printed_digest_is_blake3_of_the_file_at_every_edge_size() {
    let _g = serial();
    let c = CHUNK as usize;
    let sizes = [0, 1, 1023, 1024, 1025, c - 1, c, c + 1, 40 * c + 12345];
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let count = sizes.len().to_string();
    let server = start_server(&dst, &["--count", &count, "--verify-threads", "3"]);
    let mut expected = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let name = format!("digest-{len}.bin");
        let path = src.join(&name);
        random_file(&path, len, 100 + i as u64);
        let hex = blake3::hash(&std::fs::read(&path).unwrap())
            .to_hex()
            .to_string();
        let out = send(&server, &path, &["--verify-threads", "2"]);
        out.assert_ok(&name);
        assert_eq!(printed_digest(&out.stdout, &format!("sent {name}: ")), hex);
        assert_eq!(sha256(&dst.join(&name)), sha256(&path), "{name} differs");
        expected.push((name, hex));
    }
    let done = server.finish();
    done.assert_ok("server");
    for (name, hex) in expected {
        let line_start = format!(" received {name}: ");
        assert_eq!(printed_digest(&done.stdout, &line_start), hex, "{name}");
    }
}

/// A client that writes a chunk's slot again after the chunk and its
/// value arrived (its test-only hook) never gets the rewritten bytes
/// stored. When the server copies the slot after the rewrite (its own
/// test-only hook waits for it), the copy does not match the value: the
/// transfer fails and nothing is kept. When the server copied first, the
/// rewrite is too late to matter: the file is stored as sent, byte for
/// byte, or refused — never with the rewritten bytes.
#[test]
#[ignore = "needs an RDMA device"]
fn a_slot_rewritten_after_its_chunk_is_never_stored() {
    use pinpoll_apps::filexfer::client::REWRITE_ENV;
    use pinpoll_apps::filexfer::server::AWAIT_REWRITE_ENV;
    let _g = serial();
    needs_debug_build(REWRITE_ENV);
    let src = Scratch::new("src");
    let file = src.join("rewrite.bin");
    random_file(&file, 5 * CHUNK as usize + 10, 91);
    let path = file.display().to_string();
    let host = addr4();
    let rewrite = [(REWRITE_ENV, "2")];

    let dst = Scratch::new("dst");
    let server = start_server_env(
        dst.str(),
        "20",
        &["--count", "1"],
        &[(AWAIT_REWRITE_ENV, "2")],
    );
    let port = server.port_arg();
    let args = ["send", &host, &path, "--port", &port, "--timeout", "20"];
    let out = run_within_env(FILEXFER, &args, &rewrite, BOUND);
    let line = out.assert_one_error_line("client");
    assert!(
        line.contains("chunk 2 (bytes 524288..) does not match its BLAKE3 chaining value"),
        "{line}"
    );
    let done = server.finish();
    assert!(
        done.stderr
            .contains(&format!("{AWAIT_REWRITE_ENV}: the client rewrote the slot")),
        "{done:#?}"
    );
    assert_eq!(client_errors(&done).len(), 1, "{done:#?}");
    assert!(dst.names().is_empty(), "{:?}", dst.names());

    // Without the server waiting: whichever comes first, the rewrite never
    // reaches the file.
    let dst = Scratch::new("dst-race");
    let server = start_server(&dst, &["--count", "1"]);
    let port = server.port_arg();
    let args = ["send", &host, &path, "--port", &port, "--timeout", "20"];
    let out = run_within_env(FILEXFER, &args, &rewrite, BOUND);
    if out.status.success() {
        assert_eq!(sha256(&dst.join("rewrite.bin")), sha256(&file));
    } else {
        let line = out.assert_one_error_line("client");
        assert!(line.contains("BLAKE3 chaining value"), "{line}");
        assert!(dst.names().is_empty(), "{:?}", dst.names());
    }
    server.finish();
}

/// `--streams N`: one file striped across N queue pairs, each on its own
/// pinned thread on both sides, reassembled and verified as one file —
/// many chunks wrapping every stream's ring, and a file of fewer chunks
/// than streams. Further streams are not counted as transfers
/// (`--count`), and a stream naming no transfer is refused.
#[test]
#[ignore = "needs an RDMA device"]
fn a_file_striped_across_2_and_4_streams_arrives_verified_as_one() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = start_server(
        &dst,
        &["--count", "3", "--core", "0,1", "--verify-threads", "2"],
    );
    let cfg = engine_config(Duration::from_secs(20), false);
    let addr = pinpoll::connect::parse_socket_addr(&addr4(), server.port).unwrap();
    let stray = Connection::builder(&cfg)
        .remote_access(Access::LOCAL_READ)
        .private_data(&join_hello(0x5eed, 1))
        .connect(addr);
    assert!(stray.is_err(), "a stream of no transfer was accepted");
    let c = CHUNK as usize;
    for (name, len, streams) in [
        ("two.bin", 40 * c + 12345, "2"),
        ("four.bin", 70 * c + 1, "4"),
        ("small.bin", c + 1, "4"),
    ] {
        let path = src.join(name);
        random_file(&path, len, len as u64);
        let out = send(&server, &path, &["--streams", streams, "--core", "1,0"]);
        out.assert_ok(name);
        let hex = blake3::hash(&std::fs::read(&path).unwrap())
            .to_hex()
            .to_string();
        assert_eq!(printed_digest(&out.stdout, &format!("sent {name}: ")), hex);
        assert_eq!(sha256(&dst.join(name)), sha256(&path), "{name} differs");
    }
    let done = server.finish();
    assert!(done.status.success(), "{done:#?}");
    assert!(client_errors(&done).is_empty(), "{done:#?}");
    // The stray stream is the one thing the server had to say.
    assert!(
        done.stderr
            .contains("no transfer of this server is waiting for that stream"),
        "{done:#?}"
    );
    assert_eq!(done.stdout.matches(": received ").count(), 3, "{done:#?}");
    assert_eq!(dst.names(), ["four.bin", "small.bin", "two.bin"]);
}

/// `--count` counts transfers: a client whose handshake fails (a hello
/// of another protocol version, refused on the transfer's own thread) is
/// reported but not counted, so the one transfer `--count 1` waits for
/// still comes, and only then does the server exit.
#[test]
#[ignore = "needs an RDMA device"]
fn a_failed_handshake_does_not_count_towards_count() {
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let server = start_server(&dst, &["--count", "1"]);
    let cfg = engine_config(Duration::from_secs(20), false);
    let addr = pinpoll::connect::parse_socket_addr(&addr4(), server.port).unwrap();
    let mut other_version = HELLO;
    other_version[4] = HELLO[4] + 1;
    let refused = Connection::builder(&cfg)
        .remote_access(Access::LOCAL_READ)
        .private_data(&other_version)
        .connect(addr);
    let err = refused.expect_err("a hello of another version was accepted");
    assert!(err.to_string().contains("version"), "{err}");
    let path = src.join("counted.bin");
    random_file(&path, 3 * CHUNK as usize + 7, 11);
    send(&server, &path, &[]).assert_ok("the transfer --count waits for");
    assert_eq!(sha256(&dst.join("counted.bin")), sha256(&path));
    let done = server.finish();
    let errors = client_errors(&done);
    assert_eq!(errors.len(), 1, "{done:#?}");
    assert!(errors[0].contains("version"), "{done:#?}");
    assert_eq!(done.stdout.matches(": received ").count(), 1, "{done:#?}");
}

/// A stream that dies mid-transfer (the client's test-only hook drops
/// its connection) fails the whole transfer cleanly: the client fails
/// with one error line, the server reports it, nothing is kept, and the
/// server goes on to take the same file over the same number of streams.
#[test]
#[ignore = "needs an RDMA device"]
fn a_stream_dying_mid_transfer_fails_the_whole_transfer_cleanly() {
    use pinpoll_apps::filexfer::client::DROP_STREAM_ENV;
    let _g = serial();
    let line = a_fault_fails_once_then_the_file_goes_through(
        (DROP_STREAM_ENV, "1"),
        ("dying.bin", 60 * CHUNK as usize + 7),
        &["--streams", "2"],
    );
    assert!(
        line.contains("dying.bin") || line.contains("stream 1"),
        "{line}"
    );
}

/// Whether this process has CAP_IPC_LOCK (bit 14 of CapEff).
fn has_ipc_lock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff in /proc/self/status")
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << 14) != 0
}

/// A locked-memory limit too small for the registered
/// rings. As root with CAP_IPC_LOCK (the guest's test runner) the kernel
/// does not apply the limit to registrations and neither does pinpoll:
/// the transfer works. Without CAP_IPC_LOCK (dropped with setpriv) every
/// program stops with one error line that names the limit and the fix.
#[test]
#[ignore = "needs an RDMA device"]
fn a_memlock_limit_too_small_is_one_clear_error() {
    let _g = serial();
    assert!(
        has_ipc_lock(),
        "the device tests run as root with CAP_IPC_LOCK in scripts/softroce-vm"
    );
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let file = src.join("locked.bin");
    random_file(&file, 2 * CHUNK as usize + 5, 81);
    let path = file.display().to_string();
    let host = addr4();
    let limit = "--memlock=65536:65536";

    // Exempt: a 64 KiB limit, ~20 MiB registered on each side.
    let server = Server::start(
        "prlimit",
        &[
            limit,
            "--",
            FILEXFER,
            "serve",
            "--dir",
            dst.str(),
            "--count",
            "1",
            "--timeout",
            "20",
        ],
    );
    let port = server.port_arg();
    let out = run_within(
        "prlimit",
        &[
            limit,
            "--",
            FILEXFER,
            "send",
            &host,
            &path,
            "--port",
            &port,
            "--timeout",
            "20",
        ],
        BOUND,
    );
    out.assert_ok("send with CAP_IPC_LOCK under a 64 KiB limit");
    server
        .finish()
        .assert_ok("serve with CAP_IPC_LOCK under a 64 KiB limit");
    assert_eq!(sha256(&dst.join("locked.bin")), sha256(&file));

    // Not exempt: root without CAP_IPC_LOCK.
    let no_cap = [
        "--inh-caps=-ipc_lock",
        "--bounding-set=-ipc_lock",
        "--",
        "prlimit",
    ];
    let good = start_server(&dst, &[]);
    let gport = good.port_arg();
    let basic = common::BASIC;
    let registered = engine_config(Duration::from_secs(20), false).registered_bytes();
    let serve_expected =
        format!("registering the chunk ring of a client: {registered} more bytes must be locked");
    let send_expected =
        format!("registering the send ring: {registered} more bytes must be locked");
    let runs: [(&str, Vec<&str>, &str); 4] = [
        (
            "filexfer serve",
            vec![limit, "--", FILEXFER, "serve", "--dir", dst.str(), "--port", "0"],
            &serve_expected,
        ),
        (
            "filexfer send",
            vec![limit, "--", FILEXFER, "send", &host, &path, "--port", &gport, "--timeout", "20"],
            &send_expected,
        ),
        (
            "basic server",
            vec!["--memlock=4096:4096", "--", basic, "server", "--port", "0"],
            "registering a client's buffers: 8192 more bytes must be locked",
        ),
        (
            "basic client",
            vec!["--memlock=4096:4096", "--", basic, "client", &host, "--port", "9", "--timeout", "10"],
            "registering the message: 4096 more bytes must be locked for registration (4096 already locked by this process)",
        ),
    ];
    for (who, args, expected) in runs {
        let mut all = no_cap.to_vec();
        all.extend(args);
        let out = run_within("setpriv", &all, Duration::from_secs(120));
        let line = out.assert_one_error_line(who);
        assert!(line.contains(expected), "{who}: {line}");
        assert!(
            line.contains("locked-memory limit (ulimit -l, RLIMIT_MEMLOCK) is")
                && line.contains("raise it with `ulimit -l unlimited`"),
            "{who}: {line}"
        );
    }
    good.proc.signal("TERM");
    let done = good.finish();
    assert!(done.stderr.is_empty(), "no client reached it: {done:#?}");
    assert_eq!(dst.names(), ["locked.bin"]);
}

/// A directory whose fsync fails after the file was linked into place
/// (here: the server, root without CAP_DAC_OVERRIDE and
/// CAP_DAC_READ_SEARCH, may create and link files in a directory of mode
/// 0300 but not open it to fsync it): the client is told exactly that —
/// the file is in place, verified and durable, only its name may not
/// survive a power loss — and the file is there, intact.
#[test]
#[ignore = "needs an RDMA device"]
fn a_failed_directory_fsync_says_the_file_is_in_place() {
    use std::os::unix::fs::PermissionsExt as _;
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    std::fs::set_permissions(dst.str(), std::fs::Permissions::from_mode(0o300)).unwrap();
    let file = src.join("placed.bin");
    random_file(&file, 3 * CHUNK as usize + 11, 91);
    let no_dac = "-dac_override,-dac_read_search";
    let server = Server::start(
        "setpriv",
        &[
            &format!("--inh-caps={no_dac}"),
            &format!("--bounding-set={no_dac}"),
            "--",
            FILEXFER,
            "serve",
            "--dir",
            dst.str(),
            "--count",
            "1",
            "--timeout",
            "20",
        ],
    );
    let out = send(&server, &file, &[]);
    let line = out.assert_one_error_line("client");
    assert!(
        line.contains("placed.bin is in place on the server with its data verified and durable, but the fsync of the server's directory failed (Permission denied")
            && line.contains("after a power loss the file may be missing"),
        "{line}"
    );
    let done = server.finish();
    assert_eq!(client_errors(&done).len(), 1, "{done:#?}");
    std::fs::set_permissions(dst.str(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(sha256(&dst.join("placed.bin")), sha256(&file));
    assert_eq!(dst.names(), ["placed.bin"], "no temp file left");
}

/// Whoever read the server's stdout went away (a closed pipe): progress
/// lines are best effort, so the server goes on serving and says so once.
#[test]
#[ignore = "needs an RDMA device"]
fn a_closed_stdout_does_not_stop_the_server() {
    use std::io::BufRead as _;
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let mut child = common::command(
        FILEXFER,
        &[
            "serve",
            "--dir",
            dst.str(),
            "--timeout",
            "20",
            "--count",
            "2",
            "--port",
            "0",
        ],
    )
    .spawn()
    .unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = lines.next().expect("a line").unwrap();
    let port: u16 = listening.rsplit(':').next().unwrap().parse().unwrap();
    // The reader goes away: every later line meets a closed pipe.
    drop(lines);
    for (i, name) in ["one.bin", "two.bin"].into_iter().enumerate() {
        random_file(&src.join(name), 300_000, 95 + i as u64);
        send_to(port, &src.join(name), &[]).assert_ok(name);
        assert_eq!(sha256(&dst.join(name)), sha256(&src.join(name)));
    }
    let status = child.wait().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(
        stderr.matches("writing to stdout").count(),
        1,
        "said once: {stderr}"
    );
}

/// A file written to while it is sent would arrive torn (old and new
/// bytes, with a digest of what was read): the client sees its size or
/// times move, sends no Finish but tells the server, which keeps nothing.
#[test]
#[ignore = "needs an RDMA device"]
fn a_file_that_changes_while_it_is_sent_is_not_kept() {
    use std::os::unix::fs::FileExt as _;
    needs_debug_build(pinpoll_apps::filexfer::client::TRICKLE_ENV);
    let _g = serial();
    let src = Scratch::new("src");
    let dst = Scratch::new("dst");
    let file = src.join("torn.bin");
    random_file(&file, 16 * CHUNK as usize, 97);
    let server = start_server(&dst, &["--count", "1"]);
    let (port, host, path) = (server.port_arg(), addr4(), file.display().to_string());
    let mut cmd = common::command(
        FILEXFER,
        &["send", &host, &path, "--port", &port, "--timeout", "20"],
    );
    cmd.env(pinpoll_apps::filexfer::client::TRICKLE_ENV, "300");
    let client = Running::spawn(cmd);
    server
        .proc
        .wait_for_line(|l| l.contains("receiving torn.bin"))
        .expect("the server started receiving");
    // Rewritten in place, its size unchanged, while 16 chunks trickle.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .write_all_at(b"changed", 0)
        .unwrap();
    let out = client.finish_within(BOUND);
    let line = out.assert_one_error_line("client");
    assert!(
        line.contains("torn.bin changed while it was sent"),
        "{line}"
    );
    let done = server.finish();
    let errors = client_errors(&done);
    assert_eq!(errors.len(), 1, "{done:#?}");
    assert!(
        errors[0].contains("the client stopped sending torn.bin")
            && errors[0].contains("nothing was kept"),
        "{}",
        errors[0]
    );
    assert!(dst.names().is_empty(), "{:?}", dst.names());
}
