//! Host tests (no device): the command line is parsed and checked before
//! anything touches a device, every failure is one `error: ...` line with a
//! non-zero exit, and the JSON report has the shape scripts rely on.

use std::time::Duration;

use clap::Parser as _;
use pinpoll_perf::plan::{data_config, Overrides, WireConfig};
use pinpoll_perf::report::{Bandwidth, Doorbells, Point, RawSamples, Report, RunInfo, Samples};
use pinpoll_perf::{Cli, Kind, Mode, Role, Settings, Transport};
use pinpoll_testkit::{run, Finished};

const PERF: &str = env!("CARGO_BIN_EXE_pinpoll-perf");

/// Runs pinpoll-perf with `args` to completion (a hang fails the test).
fn perf(args: &[&str]) -> Finished {
    run(PERF, args)
}

fn settings(args: &[&str]) -> Result<Settings, String> {
    let mut argv = vec!["pinpoll-perf"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    Settings::from_args(cli.command.kind(), cli.command.args(), 4)
}

#[test]
fn help_explains_every_flag_and_exits_zero() {
    let out = perf(&["--help"]);
    assert!(out.status.success());
    let text = out.stdout.as_str();
    for sub in [
        "write-lat",
        "send-lat",
        "read-lat",
        "write-bw",
        "send-bw",
        "read-bw",
    ] {
        assert!(text.contains(sub), "{sub} missing from --help:\n{text}");
    }
    let out = perf(&["write-lat", "--help"]);
    assert!(out.status.success());
    let text = out.stdout.as_str();
    for flag in [
        "-d, --ib-dev",
        "-p, --port",
        "-s, --size",
        "-n, --iters",
        "-a, --all",
        "-t, --tx-depth",
        "-l, --post_list",
        "-Q, --cq-mod",
        "-I, --inline_size",
        "--report_gbits",
        "--mode",
        "--core",
        "--profile",
        "--hugepages",
        "--json",
        "--loopback",
        "--oob",
        "--timeout",
        "--await-sends",
        "-x, --gid-index",
        "--raw-samples",
        "--max-session",
    ] {
        assert!(
            text.contains(flag),
            "{flag} missing from write-lat --help:\n{text}"
        );
    }
}

#[test]
fn bad_command_lines_fail_with_one_error_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["write-lat", "--loopback", "-s", "0"],
            "-s 0 is out of range",
        ),
        (
            &["write-lat", "--loopback", "-s", "8388609"],
            "out of range",
        ),
        (
            &["write-lat", "--loopback", "-n", "3"],
            "at least 5 iterations",
        ),
        (&["write-bw", "-s", "64"], "-s is chosen by the client"),
        (
            &["write-bw", "--mode", "engine", "-n", "9"],
            "-n, --mode are chosen by the client",
        ),
        (
            &["write-lat", "--loopback", "--core", "4096"],
            "--core 4096 does not exist",
        ),
        (
            &["write-lat", "--loopback", "-t", "0"],
            "-t 0 is out of range",
        ),
        (
            &["write-lat", "--loopback", "--timeout", "0"],
            "--timeout 0 is out of range",
        ),
        (
            &["write-lat", "--loopback", "--app-core", "0"],
            "--app-core is for --mode engine",
        ),
        (
            &["write-lat", "10.0.0.1", "--bind", "::"],
            "--bind is for the server",
        ),
        (
            &["write-lat", "--loopback", "-a", "-s", "8"],
            "cannot be used with",
        ),
        (&["write-lat", "--no-such-flag"], "unexpected argument"),
        (
            &["write-lat", "--mode", "turbo", "--loopback"],
            "invalid value",
        ),
        (&["no-such-test"], "unrecognized subcommand"),
        (
            &["write-lat", "--loopback", "--await-sends", "-Q", "4"],
            "a signal interval of 4 (-Q) cannot be awaited",
        ),
        (
            &["write-bw", "--loopback", "--await-sends"],
            "--await-sends is for latency tests",
        ),
        (
            &[
                "send-lat",
                "--loopback",
                "--await-sends",
                "--mode",
                "engine",
            ],
            "--await-sends is for --mode direct",
        ),
        (
            &["write-lat", "--await-sends"],
            "--await-sends is chosen by the client",
        ),
        (&["write-lat", "--loopback", "--raw-samples"], "--json"),
        (
            &["write-bw", "--loopback", "--raw-samples", "--json"],
            "--raw-samples is for latency tests",
        ),
        (
            &[
                "write-lat",
                "--loopback",
                "--raw-samples",
                "--json",
                "-n",
                "1000001",
            ],
            "give -n 1000000 or fewer",
        ),
        (&[], "requires a subcommand"),
        // Below a millisecond the Duration was zero: every wait failed
        // at once, with errors naming other things.
        (
            &["write-lat", "--loopback", "--timeout", "0.0000001"],
            "--timeout 0.0000001 is out of range: give 0.001 <= SECONDS <= 86400",
        ),
        (
            &["write-lat", "10.0.0.1", "--max-session", "60"],
            "--max-session is for the server",
        ),
        (
            &["write-lat", "--max-session", "0"],
            "--max-session 0 is out of range",
        ),
    ];
    for (args, expected) in cases {
        let out = perf(args);
        let stderr = out.stderr.as_str();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{args:?}: one line expected, got {stderr:?}"
        );
        assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
        assert!(
            lines[0].contains(expected),
            "{args:?}: {stderr:?} lacks {expected:?}"
        );
    }
}

#[test]
fn a_client_without_a_server_fails_within_its_timeout() {
    // Nothing listens on this port (and this host may have no device at
    // all): an `error:` line and exit 1, quickly — never a hang.
    let out = perf(&[
        "write-lat",
        "127.0.0.1",
        "--oob",
        "-p",
        "9",
        "--timeout",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = out.stderr.as_str();
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn settings_follow_perftest_defaults_and_the_role() {
    let s = settings(&["write-lat", "--loopback"]).unwrap();
    assert_eq!(
        (s.kind, s.role.clone(), s.transport),
        (Kind::WriteLat, Role::Loopback, Transport::Tcp)
    );
    assert_eq!((s.sizes.clone(), s.iters, s.warmup), (vec![2], 1000, 100));
    assert_eq!(
        (s.server_core, s.core, s.app_core),
        (Some(0), Some(1), None)
    );
    assert_eq!(s.profile, "latency");
    assert_eq!(s.port, 18515);
    let server = settings(&["write-lat"]).unwrap();
    assert_eq!(server.max_session, Duration::from_secs(3600));

    let s = settings(&[
        "read-bw",
        "169.254.0.1",
        "-s",
        "4096",
        "-n",
        "77",
        "-t",
        "256",
        "-l",
        "16",
        "-Q",
        "8",
        "-I",
        "0",
        "--report_gbits",
    ])
    .unwrap();
    assert_eq!(
        s.role,
        Role::Client {
            host: "169.254.0.1".into()
        }
    );
    assert_eq!(s.transport, Transport::RdmaCm);
    assert_eq!((s.sizes.clone(), s.iters, s.warmup), (vec![4096], 77, 0));
    assert_eq!(
        (
            s.overrides.tx_depth,
            s.overrides.post_list,
            s.overrides.cq_mod,
            s.overrides.inline_size
        ),
        (Some(256), Some(16), Some(8), Some(0))
    );
    assert!(s.report_gbits);
    assert_eq!(s.profile, "throughput");
    assert_eq!(
        (s.core, s.server_core),
        (None, None),
        "client/server: unpinned unless asked"
    );

    let s = settings(&["send-bw", "--oob"]).unwrap();
    assert_eq!(
        (s.role.clone(), s.transport),
        (Role::Server, Transport::Tcp)
    );

    let s = settings(&["write-lat", "--loopback", "-a"]).unwrap();
    assert_eq!(s.sizes.first(), Some(&2));
    assert_eq!(s.sizes.last(), Some(&(1 << 23)));

    // perftest's way: every send signaled and awaited, the same GID.
    let s = settings(&[
        "send-lat",
        "--loopback",
        "--await-sends",
        "-x",
        "3",
        "-I",
        "0",
    ])
    .unwrap();
    assert!(s.await_sends);
    assert_eq!(
        (
            s.overrides.cq_mod,
            s.overrides.gid_index,
            s.overrides.inline_size
        ),
        (Some(1), Some(3), Some(0))
    );
    let s = settings(&["write-lat", "--loopback"]).unwrap();
    assert!(!s.await_sends && !s.raw_samples);
    assert_eq!((s.overrides.cq_mod, s.overrides.gid_index), (None, None));
    // -x does not travel: a server takes its own.
    let s = settings(&["write-lat", "-x", "2"]).unwrap();
    assert_eq!(
        (s.role.clone(), s.overrides.gid_index),
        (Role::Server, Some(2))
    );

    let s = settings(&["write-lat", "--loopback", "--mode", "engine"]).unwrap();
    assert_eq!(
        (s.mode, s.core, s.app_core),
        (Mode::Engine, Some(1), Some(2))
    );
}

#[test]
fn the_json_report_has_every_figure_and_the_configuration() {
    let s = settings(&["write-lat", "--loopback", "-s", "8", "-n", "100"]).unwrap();
    let cfg = data_config(
        &pinpoll::EngineConfig::default(),
        Kind::WriteLat,
        8,
        &Overrides::default(),
    )
    .unwrap();
    let mut samples = Samples::new();
    for i in 1..=100u64 {
        samples.record(Duration::from_nanos(1000 + i * 10));
    }
    let mut stats = pinpoll::datapath::Stats::default();
    stats.posted = 200;
    stats.doorbells = 200;
    stats.wait_turns = 12345;
    let info = RunInfo {
        test: s.kind.name(),
        role: "loopback",
        mode: s.mode.name(),
        transport: "loopback (TCP exchange on 127.0.0.1)",
        device: Some("rxe0".into()),
        host: None,
        port: s.port,
        profile: s.profile.clone(),
        hugepages: false,
        iterations: s.iters,
        warmup: s.warmup,
        sizes: s.sizes.clone(),
        tx_depth: None,
        post_list: None,
        cq_mod: None,
        inline_size: None,
        gid_index: Some(3),
        await_sends: true,
        report_gbits: false,
        client_core: Some(1),
        worker_core: None,
        server_core: Some(0),
        timeout_secs: 30.0,
    };
    let mut report = Report::new(info);
    report.results.push(Point {
        bytes: 8,
        iterations: 100,
        warmup: 10,
        inline: true,
        latency: Some(samples.summary(0.5)),
        bandwidth: None,
        work_requests: Doorbells::new(&stats),
        wait_turns: stats.wait_turns,
        raw_samples: Some(RawSamples {
            unit: "ticks",
            ns_per_tick: 0.5,
            round_trip_ticks: (1..=100u64).map(|i| 2000 + i * 20).collect(),
        }),
        connection: WireConfig::from_config(&cfg),
    });
    report.results.push(Point {
        bytes: 65536,
        iterations: 1000,
        warmup: 0,
        inline: false,
        latency: None,
        bandwidth: Some(Bandwidth::new(65536, 1000, Duration::from_millis(500))),
        work_requests: Doorbells::new(&stats),
        wait_turns: stats.wait_turns,
        raw_samples: None,
        connection: WireConfig::from_config(&cfg),
    });
    let v: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(v["tool"], "pinpoll-perf");
    for key in [
        "test",
        "role",
        "mode",
        "transport",
        "device",
        "profile",
        "iterations",
        "warmup",
        "sizes",
        "client_core",
        "server_core",
        "timeout_secs",
        "gid_index",
        "await_sends",
    ] {
        assert!(v["config"].get(key).is_some(), "config.{key} missing: {v}");
    }
    let lat = &v["results"][0]["latency"];
    assert_eq!(lat["measure"], "half_round_trip");
    assert_eq!(lat["unit"], "usec");
    assert_eq!(lat["samples"], 100);
    let f = |k: &str| {
        lat[k]
            .as_f64()
            .unwrap_or_else(|| panic!("latency.{k} missing"))
    };
    assert!(f("min") <= f("p50") && f("p50") <= f("p99") && f("p99") <= f("p99_9"));
    assert!(f("p99_9") <= f("p99_99") && f("p99_99") <= f("max"));
    assert!(f("mean") > 0.0 && f("stdev") >= 0.0);
    assert!(v["results"][0].get("bandwidth").is_none());
    let bw = &v["results"][1]["bandwidth"];
    for key in ["seconds", "gbps", "mib_per_sec", "mpps"] {
        assert!(bw[key].as_f64().unwrap() > 0.0, "bandwidth.{key}");
    }
    assert_eq!(v["results"][0]["wait_turns"], 12345);
    let raw = &v["results"][0]["raw_samples"];
    assert_eq!(raw["unit"], "ticks");
    assert_eq!(raw["ns_per_tick"], 0.5);
    let ticks: Vec<u64> = raw["round_trip_ticks"]
        .as_array()
        .expect("round_trip_ticks is an array")
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(ticks.len(), 100);
    assert_eq!((ticks[0], ticks[99]), (2020, 4000), "in measuring order");
    assert!(v["results"][1].get("raw_samples").is_none());
    let wr = &v["results"][0]["work_requests"];
    assert_eq!(
        (wr["posted"].as_u64(), wr["doorbells"].as_u64()),
        (Some(200), Some(200))
    );
    for key in [
        "send_depth",
        "recv_depth",
        "batch_size",
        "signal_interval",
        "inline_threshold",
        "slot_size",
        "slot_count",
    ] {
        assert!(
            v["results"][0]["connection"].get(key).is_some(),
            "connection.{key}"
        );
    }
}
