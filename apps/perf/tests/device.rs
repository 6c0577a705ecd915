//! Device tests: the binary end to end on a real device, as a subprocess,
//! checking that the JSON figures are present and sane (counts, ordering)
//! — never their values, which depend on the machine.
//!
//! Run inside the SoftRoCE guest: `scripts/test.sh --device-only`.

use std::time::Duration;

use pinpoll_testkit::{addr4, command, device, run_within, Running};
use serde_json::Value;

const PERF: &str = env!("CARGO_BIN_EXE_pinpoll-perf");

/// The bound of one run: far beyond its `--timeout 60`, so only a hang
/// trips it.
const BOUND: Duration = Duration::from_secs(300);

/// Runs pinpoll-perf with `args` on the device; returns its JSON report.
fn run(args: &[&str]) -> Value {
    let dev = device();
    let mut all = args.to_vec();
    all.extend(["-d", &dev, "--json", "--timeout", "60"]);
    let out = run_within(PERF, &all, BOUND);
    assert!(
        out.status.success(),
        "pinpoll-perf {args:?} failed: {}\n{}",
        out.stderr,
        out.stdout
    );
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", out.stdout))
}

/// A pinpoll-perf server for `test` on `port`, once it says it listens.
fn server(test: &str, port: &str, oob: bool) -> Running {
    let oob: &[&str] = if oob { &["--oob"] } else { &[] };
    server_with(test, port, &[&["--timeout", "60"], oob].concat())
}

/// A pinpoll-perf server for `test` on `port` on the device with `more`
/// arguments, once it says it listens.
fn server_with(test: &str, port: &str, more: &[&str]) -> Running {
    server_env(test, port, more, &[])
}

/// [`server_with`] with `env` set for the server.
fn server_env(test: &str, port: &str, more: &[&str], env: &[(&str, &str)]) -> Running {
    let dev = device();
    let mut args = vec![test, "-p", port, "-d", &dev];
    args.extend(more);
    let mut cmd = command(PERF, &args);
    cmd.envs(env.iter().copied());
    let server = Running::spawn(cmd);
    let listening = server.wait_for_line(|l| l.contains("Waiting for a client"));
    assert!(listening.is_some(), "the {test} server never listened");
    server
}

/// The arguments of a `test` client of the server on `port` of this
/// guest, on the device, with `more`.
fn client_args(test: &str, port: &str, more: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [test, &addr4(), "-p", port, "-d", &device()]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(more.iter().map(|a| a.to_string()));
    args
}

/// [`run_within`] [`BOUND`] of `pinpoll-perf args`.
fn run_perf(args: &[String]) -> pinpoll_testkit::Finished {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_within(PERF, &args, BOUND)
}

fn check_latency(v: &Value, iters: u64, measure: &str) {
    let p = &v["results"][0];
    assert_eq!(p["iterations"].as_u64(), Some(iters));
    let lat = &p["latency"];
    assert_eq!(lat["samples"].as_u64(), Some(iters), "{v}");
    assert_eq!(lat["measure"], measure);
    let f = |k: &str| {
        lat[k]
            .as_f64()
            .unwrap_or_else(|| panic!("latency.{k} missing: {v}"))
    };
    assert!(f("min") > 0.0, "{v}");
    assert!(
        f("min") <= f("p50") && f("p50") <= f("p99") && f("p99") <= f("max"),
        "{v}"
    );
    assert!(f("p99") <= f("p99_9") && f("p99_9") <= f("p99_99") && f("p99_99") <= f("max"));
    assert!(f("min") <= f("mean") && f("mean") <= f("max"), "{v}");
    let wr = &p["work_requests"];
    assert!(wr["posted"].as_u64().unwrap() >= iters, "{v}");
    assert!(wr["doorbells"].as_u64().unwrap() >= 1);
}

fn check_bandwidth(v: &Value, iters: u64) {
    let p = &v["results"][0];
    assert_eq!(p["iterations"].as_u64(), Some(iters));
    let bw = &p["bandwidth"];
    for k in ["seconds", "gbps", "mib_per_sec", "mpps"] {
        assert!(bw[k].as_f64().unwrap_or(0.0) > 0.0, "bandwidth.{k}: {v}");
    }
    let wr = &p["work_requests"];
    let (posted, bells) = (
        wr["posted"].as_u64().unwrap(),
        wr["doorbells"].as_u64().unwrap(),
    );
    assert!(posted >= iters && bells >= 1 && bells <= posted, "{v}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn write_lat_loopback_reports_sane_percentiles() {
    let v = run(&["write-lat", "--loopback", "-n", "1000", "-s", "8"]);
    assert_eq!(v["config"]["test"], "write-lat");
    assert_eq!(v["config"]["role"], "loopback");
    check_latency(&v, 1000, "half_round_trip");
    assert_eq!(v["results"][0]["inline"], true, "8 B go inline");
}

#[test]
#[ignore = "needs an RDMA device"]
fn every_latency_test_in_both_modes() {
    for (test, measure) in [("send-lat", "half_round_trip"), ("read-lat", "round_trip")] {
        let v = run(&[test, "--loopback", "-n", "300", "-s", "64"]);
        check_latency(&v, 300, measure);
    }
    for test in ["write-lat", "send-lat", "read-lat"] {
        let v = run(&[
            test,
            "--loopback",
            "-n",
            "200",
            "-s",
            "8",
            "--mode",
            "engine",
        ]);
        assert_eq!(v["config"]["mode"], "engine");
        check_latency(
            &v,
            200,
            if test == "read-lat" {
                "round_trip"
            } else {
                "half_round_trip"
            },
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn every_bandwidth_test_in_both_modes() {
    for test in ["write-bw", "send-bw", "read-bw"] {
        let v = run(&[test, "--loopback", "-n", "2000", "-s", "4096"]);
        check_bandwidth(&v, 2000);
        let per_op = v["results"][0]["work_requests"]["per_op"].as_f64().unwrap();
        assert!(per_op < 1.0, "batching shares doorbells: {per_op} per op");
        let v = run(&[
            test,
            "--loopback",
            "-n",
            "1000",
            "-s",
            "64",
            "--mode",
            "engine",
        ]);
        check_bandwidth(&v, 1000);
    }
    let v = run(&["write-bw", "--loopback", "-n", "20", "-s", "1048576"]);
    check_bandwidth(&v, 20);
}

/// Server and client as two processes, over rdma_cm and over the TCP
/// exchange; the client drives two sizes, the server follows.
#[test]
#[ignore = "needs an RDMA device"]
fn client_and_server_processes_agree_on_the_parameters() {
    let addr4 = addr4();
    for (host, port, oob) in [
        (addr4.as_str(), "18611", false),
        ("127.0.0.1", "18612", true),
    ] {
        for test in ["send-lat", "write-bw"] {
            let server = server(test, port, oob);
            let mut args = vec![test, host, "-p", port, "-n", "200"];
            if oob {
                args.push("--oob");
            }
            let v = run(&args);
            let out = server.finish_within(BOUND);
            assert!(
                out.status.success(),
                "server of {test} ({}): {}",
                if oob { "oob" } else { "rdma_cm" },
                out.stderr
            );
            assert_eq!(v["config"]["role"], "client");
            if test == "send-lat" {
                check_latency(&v, 200, "half_round_trip");
            } else {
                check_bandwidth(&v, 200);
            }
        }
    }
}

/// The raw samples of a latency report: one per measured round trip,
/// and the percentiles of the report are theirs (the histogram keeps 3
/// significant digits).
fn check_raw_samples(v: &Value, iters: usize, half: bool) {
    let p = &v["results"][0];
    let raw = &p["raw_samples"];
    assert_eq!(raw["unit"], "ticks", "{v}");
    let scale = raw["ns_per_tick"].as_f64().expect("ns_per_tick");
    assert!(scale > 0.0, "{v}");
    let mut us: Vec<f64> = raw["round_trip_ticks"]
        .as_array()
        .expect("round_trip_ticks")
        .iter()
        .map(|t| t.as_u64().expect("a tick count") as f64 * scale / 1000.0)
        .map(|rtt| if half { rtt / 2.0 } else { rtt })
        .collect();
    assert_eq!(us.len(), iters, "one sample per measured round trip");
    us.sort_by(f64::total_cmp);
    let (min, max) = (us[0], us[iters - 1]);
    let lat = &p["latency"];
    let near = |a: f64, b: f64| (a - b).abs() <= 0.002 * b.max(a) + 0.002;
    assert!(near(lat["min"].as_f64().unwrap(), min), "min {min}: {lat}");
    assert!(near(lat["max"].as_f64().unwrap(), max), "max {max}: {lat}");
}

/// perftest's way: no inline, every send signaled and its completion
/// awaited on both sides, the same GID index, raw samples out. In one
/// process and as client and server (the server follows the client's
/// --await-sends).
#[test]
#[ignore = "needs an RDMA device"]
fn await_sends_without_inline_reports_raw_samples() {
    let gid = std::env::var("PINPOLL_GID_INDEX").unwrap_or_else(|_| "0".into());
    for (test, half) in [("write-lat", true), ("send-lat", true), ("read-lat", false)] {
        let v = run(&[
            test,
            "--loopback",
            "-n",
            "300",
            "-s",
            "8",
            "-I",
            "0",
            "--await-sends",
            "--warmup",
            "0",
            "-x",
            &gid,
            "--raw-samples",
        ]);
        check_latency(
            &v,
            300,
            if half {
                "half_round_trip"
            } else {
                "round_trip"
            },
        );
        assert_eq!(v["config"]["await_sends"], true, "{v}");
        assert_eq!(v["config"]["gid_index"].as_u64(), gid.parse().ok(), "{v}");
        let p = &v["results"][0];
        assert_eq!(p["inline"], false, "-I 0: nothing inline");
        assert_eq!(p["connection"]["signal_interval"], 1, "every send signaled");
        check_raw_samples(&v, 300, half);
    }
    let server = server("send-lat", "18614", false);
    let addr4 = addr4();
    let v = run(&[
        "send-lat",
        &addr4,
        "-p",
        "18614",
        "-n",
        "200",
        "--await-sends",
        "--raw-samples",
    ]);
    let out = server.finish_within(BOUND);
    assert!(out.status.success(), "server: {}", out.stderr);
    check_latency(&v, 200, "half_round_trip");
    check_raw_samples(&v, 200, true);
}

/// Two clients of one rdma_cm server at once: the second's connect never
/// becomes the first's data connection (the server takes only the one
/// carrying the nonce of its `Ready`); the second is told the server is
/// busy, and the first measures every size to the end.
#[test]
#[ignore = "needs an RDMA device"]
fn a_second_client_is_told_busy_and_the_first_finishes() {
    second_client_is_told_busy_while_the_first_finishes("18613", false);
}

/// With --oob the data connection is the exchange on the client's own
/// control stream, so nobody can take it; a second client that comes
/// while the first measures is told at once that the server is busy
/// (the listener used to be closed after the first: it was reset), and
/// the first measures every size to the end.
#[test]
#[ignore = "needs an RDMA device"]
fn a_second_oob_client_is_told_busy_and_the_first_finishes() {
    second_client_is_told_busy_while_the_first_finishes("18615", true);
}

fn second_client_is_told_busy_while_the_first_finishes(port: &str, oob: bool) {
    let server = server("send-lat", port, oob);
    let oob_arg: &[&str] = if oob { &["--oob"] } else { &[] };
    let args = client_args(
        "send-lat",
        port,
        // No warm-up: 10 round trips a size up to 8 MiB were most of
        // this test's 50 s, and the race needs none.
        &[
            &["--timeout", "60", "-a", "-n", "5", "--warmup", "0"],
            oob_arg,
        ]
        .concat(),
    );
    let first = Running::spawn(command(
        PERF,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    // The first client measures its first size: its data connection is
    // taken; the second comes while it has 22 more to go.
    first
        .wait_for_line(|l| l.split_whitespace().next() == Some("2"))
        .expect("the first client measured its first size");
    let second = run_perf(&args);
    let line = second.assert_one_error_line("the second client");
    assert!(line.contains("server busy"), "{line}");
    let done = first.finish_within(BOUND);
    assert!(
        done.status.success(),
        "the first client: {}\n{}",
        done.stderr,
        done.stdout
    );
    let measured = done
        .stdout
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
        })
        .count();
    assert_eq!(measured, 23, "every size of -a: {}", done.stdout);
    assert_ended_serving(server, 23);
}

/// A client that connects its data connection (--oob) and then neither
/// sends a message nor says `Done` is given up after the server's
/// `--timeout`, and the next client is served.
#[test]
#[ignore = "needs an RDMA device"]
fn a_client_silent_after_connecting_its_data_connection_is_given_up() {
    use std::io::{Read, Write};

    use pinpoll_perf::control::{decode, encode, Msg};
    use pinpoll_perf::plan::WireConfig;
    use pinpoll_perf::{data_config, Kind, Mode, Overrides, Params};

    let (port, host, dev) = ("18616", addr4(), device());
    let server = server_with("send-lat", port, &["--oob", "--timeout", "10"]);
    let mut base = pinpoll::EngineConfig::load("latency").unwrap();
    base.core = None;
    base.qp.connect_timeout = Duration::from_secs(60);
    base.completion_timeout = Duration::from_secs(60);
    let cfg = data_config(&base, Kind::SendLat, 8, &Overrides::default()).unwrap();
    let params = Msg::Params(Params {
        kind: Kind::SendLat,
        mode: Mode::Direct,
        size: 8,
        iters: 10,
        warmup: 1,
        await_sends: false,
        config: WireConfig::from_config(&cfg),
    });
    let mut ctl = std::net::TcpStream::connect((host.as_str(), port.parse::<u16>().unwrap()))
        .expect("connecting the control stream");
    let body = encode(&params).unwrap();
    ctl.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
    ctl.write_all(&body).unwrap();
    ctl.set_read_timeout(Some(BOUND)).unwrap();
    let mut len = [0u8; 4];
    ctl.read_exact(&mut len).unwrap();
    let mut reply = vec![0u8; u32::from_le_bytes(len) as usize];
    ctl.read_exact(&mut reply).unwrap();
    assert!(matches!(decode(&reply), Ok(Msg::Ready { .. })), "{reply:?}");
    let data =
        pinpoll::Connection::over_tcp(&mut ctl, Some(&dev), &cfg).expect("the data connection");
    let gave_up = server
        .wait_for_line(|l| l.contains("gave up on a silent client"))
        .expect("the server gives the silent client up");
    assert!(gave_up.contains("timed out"), "{gave_up}");
    drop((data, ctl));
    the_next_client_is_served(server, port, &["--oob"], "the client after the silent one");
}

/// A client that would measure for ever (`-n 2^40`) holds the server only
/// its `--max-session`: it is told "session limit reached" and given up.
#[test]
#[ignore = "needs an RDMA device"]
fn a_client_past_the_session_limit_is_told_and_given_up() {
    let port = "18619";
    let server = server_with(
        "send-lat",
        port,
        &["--oob", "--timeout", "10", "--max-session", "2"],
    );
    let client = run_perf(&client_args(
        "send-lat",
        port,
        &["--oob", "--timeout", "10", "-n", "1099511627776"],
    ));
    let line = client.assert_one_error_line("the client past its session");
    assert!(line.contains("session limit reached"), "{line}");
    // No client comes next: the server ends after its --timeout.
    let out = server.finish_within(BOUND);
    assert!(
        out.stdout.contains("gave up on a client") && out.stdout.contains("session limit reached"),
        "{}",
        out.stdout
    );
}

/// A stranger's rdma_cm connect to a server without --oob — private data
/// that is no ring descriptor (what `rping -c` sends), or a descriptor
/// and then a handshake it never finishes — is refused and given up; it
/// never ends the server, and the next client is served.
#[test]
#[ignore = "needs an RDMA device"]
fn a_bad_or_unfinished_rdma_cm_connect_does_not_end_the_server() {
    use pinpoll::connect::cm::Connector;
    use pinpoll::connect::RegionDescriptor;
    use pinpoll::RemoteSlice;

    let port = "18620";
    let server = server_with("send-lat", port, &["--timeout", "10"]);
    let addr = std::net::SocketAddr::new(addr4().parse().unwrap(), port.parse().unwrap());
    let qp = pinpoll::EngineConfig::load("latency").unwrap().qp;
    let rping_like = Connector::resolve(addr, &qp)
        .expect("resolve")
        .connect_half_open(b"not a ring descriptor")
        .expect("the stranger's request");
    let descriptor = RegionDescriptor(RemoteSlice {
        addr: 0x10_0000,
        len: 1 << 20,
        rkey: 1,
    })
    .encode();
    let unfinished = Connector::resolve(addr, &qp)
        .expect("resolve")
        .connect_half_open(&descriptor)
        .expect("the unfinished request");
    for _ in 0..2 {
        let gave_up = server
            .wait_for_line(|l| l.contains("gave up on a client"))
            .expect("the server gives each stranger up and goes on");
        assert!(gave_up.contains("control connection"), "{gave_up}");
    }
    drop((rping_like, unfinished));
    the_next_client_is_served(server, port, &[], "the client after the strangers");
}

/// An `--oob` client whose connect lands as the server ends, after its
/// last client's session (the doorman that answers newcomers gone), is
/// told the server is busy, not reset by the listener's close. The debug
/// hook holds that window open for 10 s (a slow guest starts the
/// latecomer well within it) and says when it opens, so the latecomer
/// lands in it.
#[test]
#[ignore = "needs an RDMA device"]
fn an_oob_latecomer_as_the_server_ends_is_told_busy_not_reset() {
    let linger = pinpoll_perf::session::LINGER_ENV;
    if !cfg!(debug_assertions) {
        panic!("{linger} exists only in debug builds: run the debug test build");
    }
    let port = "18621";
    let server = server_env(
        "send-lat",
        port,
        &["--oob", "--timeout", "60"],
        &[(linger, "10000")],
    );
    let args = client_args("send-lat", port, &["--oob", "--timeout", "60", "-n", "5"]);
    let first = run_perf(&args);
    assert!(first.status.success(), "the client: {}", first.stderr);
    server
        .wait_for_line(|l| l.contains("lingering"))
        .expect("the server lingers once its client is done");
    let late = run_perf(&args);
    let line = late.assert_one_error_line("the latecomer");
    assert!(line.contains("server busy"), "{line}");
    assert_ended_serving(server, 1);
}

/// A client (`who`, with `more` arguments) of `server` on `port` measures
/// one size, and the server ends having served it alone.
fn the_next_client_is_served(server: Running, port: &str, more: &[&str], who: &str) {
    let args = [&["--timeout", "60", "-n", "5"], more].concat();
    let honest = run_perf(&client_args("send-lat", port, &args));
    assert!(
        honest.status.success(),
        "{who}: {}\n{}",
        honest.stderr,
        honest.stdout
    );
    assert_ended_serving(server, 1);
}

/// `server` ends well, having served `sizes` sizes.
fn assert_ended_serving(server: Running, sizes: u32) {
    let out = server.finish_within(BOUND);
    assert!(out.status.success(), "server: {}", out.stderr);
    assert!(
        out.stdout.contains(&format!(" done: {sizes} sizes served")),
        "{}",
        out.stdout
    );
}
