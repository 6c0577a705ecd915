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
    let dev = device();
    let mut args = vec![test, "-p", port, "-d", &dev, "--timeout", "60"];
    if oob {
        args.push("--oob");
    }
    let server = Running::spawn(command(PERF, &args));
    let listening = server.wait_for_line(|l| l.contains("Waiting for a client"));
    assert!(listening.is_some(), "the {test} server never listened");
    server
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
