//! `basic` end to end on a real RDMA device: a server and its clients as
//! separate processes, over IPv4 and IPv6 link-local addresses, and the
//! ways a client or server fails. Run inside the SoftRoCE guest:
//! `scripts/softroce-vm -- cargo test -p pinpoll-apps -- --include-ignored`.

mod common;

use common::*;

fn timeout() -> String {
    TIMEOUT_SECS.to_string()
}

/// Runs a client against `host`:`port` and checks it got the server's
/// message and nothing else went wrong; returns the client's pid.
fn client_swaps_messages(server: &Server, host: &str, extra: &[&str]) -> (u32, Finished) {
    let port = server.port_arg();
    let mut args = vec!["client", host, "--port", &port];
    let t = timeout();
    args.extend(["--timeout", &t]);
    args.extend(extra);
    let proc = Running::spawn(command(BASIC, &args));
    let pid = proc.id();
    let out = proc.finish();
    out.assert_ok(&format!("basic {args:?}"));
    let expected = format!("message from server pid {}", server.pid());
    assert!(
        out.stdout_lines().contains(&expected.as_str()),
        "client should print {expected:?}: {out:#?}"
    );
    (pid, out)
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_serves_ipv4_and_ipv6_clients_in_turn_then_exits() {
    let _serial = serial();
    let (dev, a4, a6) = (device(), addr4(), addr6());
    let t = timeout();
    // Listens on `::` (the default): IPv4 clients reach it too.
    let server = Server::start(
        BASIC,
        &["server", "--count", "3", "-d", &dev, "--timeout", &t],
    );

    let (pid4, out4) = client_swaps_messages(&server, &a4, &["-d", &dev]);
    assert!(
        out4.stdout_lines()[0].starts_with(&format!("connected to {a4}:{} on {dev}", server.port)),
        "{out4:#?}"
    );
    let (pid6, _) = client_swaps_messages(&server, &a6, &[]);
    // Quiet: the peer's message is the only line.
    let (pid_q, quiet) = client_swaps_messages(&server, &a4, &["-q"]);
    assert_eq!(
        quiet.stdout,
        format!("message from server pid {}\n", server.pid()),
        "{quiet:#?}"
    );

    let out = server.finish();
    out.assert_ok("basic server --count 3");
    let received: Vec<&str> = out
        .stdout_lines()
        .into_iter()
        .filter(|l| l.starts_with("message from"))
        .collect();
    assert_eq!(
        received,
        [pid4, pid6, pid_q].map(|p| format!("message from client pid {p}")),
        "{out:#?}"
    );
    assert!(
        out.stdout.contains(&format!("client {a4}:")),
        "an IPv4 client shows as IPv4, not ::ffff:...: {out:#?}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_server_bound_to_the_device_address_serves_that_family() {
    let _serial = serial();
    let a4 = addr4();
    let t = timeout();
    let server = Server::start(
        BASIC,
        &["server", "--bind", &a4, "--count", "1", "--timeout", &t],
    );
    client_swaps_messages(&server, &a4, &[]);
    server.finish().assert_ok("basic server --bind ADDR4");
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_client_without_a_server_fails_with_one_line() {
    let _serial = serial();
    let (a4, a6) = (addr4(), addr6());
    // Nothing listens on port 1: rdma_cm only hands out ephemeral ports.
    for host in [&a4, &a6] {
        let out = run(BASIC, &["client", host, "--port", "1", "--timeout", "5"]);
        let line = out.assert_one_error_line("basic client (no server)");
        assert!(line.starts_with("error: connecting to "), "{line}");
        assert!(line.contains(":1: "), "names the port: {line}");
        assert!(line.contains("rejected"), "{line}");
        assert!(out.stdout.is_empty(), "{out:#?}");
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_loopback_address_is_explained() {
    let _serial = serial();
    device();
    let out = run(
        BASIC,
        &["client", "127.0.0.1", "--port", "1", "--timeout", "5"],
    );
    let line = out.assert_one_error_line("basic client 127.0.0.1");
    assert!(line.contains("loopback address is not reachable"), "{line}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn device_flag_must_name_the_connections_device() {
    let _serial = serial();
    let (dev, a4) = (device(), addr4());

    // A device that does not exist: refused up front, naming the real ones.
    let out = run(BASIC, &["client", &a4, "-d", "nosuchdev0", "--port", "1"]);
    let line = out.assert_one_error_line("basic client -d nosuchdev0");
    assert!(line.contains("\"nosuchdev0\" not found"), "{line}");
    assert!(line.contains(&dev), "{line}");

    let out = run(BASIC, &["server", "-d", "nosuchdev0", "--port", "0"]);
    let line = out.assert_one_error_line("basic server -d nosuchdev0");
    assert!(line.contains("\"nosuchdev0\" not found"), "{line}");
    assert!(out.stdout.is_empty(), "fails before listening: {out:#?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn sigterm_and_sigint_stop_an_idle_server_cleanly() {
    let _serial = serial();
    device();
    for signal in ["TERM", "INT"] {
        let server = Server::start(BASIC, &["server"]);
        server.proc.signal(signal);
        let out = server.finish();
        out.assert_ok(&format!("basic server after SIG{signal}"));
        assert!(
            out.stdout.contains("interrupted: served 0 client(s)"),
            "{out:#?}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_server_that_cannot_listen_fails_with_one_line() {
    let _serial = serial();
    device();
    let first = Server::start(BASIC, &["server", "--count", "1"]);
    let port = first.port_arg();
    let out = run(BASIC, &["server", "--port", &port]);
    let line = out.assert_one_error_line("a second basic server on the same port");
    assert!(
        line.starts_with(&format!(
            "error: listening on [::]:{port}: rdma_cm: rdma_bind_addr failed"
        )),
        "{line}"
    );
    // `first` is killed on drop.
}
