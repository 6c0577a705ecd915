//! `pinpoll-tune doctor --json` on a real RDMA device: inside
//! `scripts/softroce-vm` (PINPOLL_DEVICE=rxe0, 256 reserved 2 MiB pages).
//! Run with `scripts/test.sh --device-only`.
//! Without a device these fail with the reason instead of passing silently.

mod common;

use std::time::Duration;

use pinpoll_testkit::{device, netdev, Running};
use serde_json::Value;

/// Runs the doctor; returns its JSON and exit code.
fn doctor(args: &[&str]) -> (Value, i32) {
    let out = common::tune(&[&["doctor", "--json"], args].concat());
    let code = out.status.code().expect("exit code");
    let json: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no valid JSON ({e}): stdout {:?}, stderr {:?}",
            out.stdout, out.stderr
        )
    });
    (json, code)
}

fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/meminfo"))
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap()
}

fn check<'a>(json: &'a Value, check: &str, subject: &str) -> &'a Value {
    json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == check && c["subject"] == subject)
        .unwrap_or_else(|| panic!("no {check} check for {subject}: {json:#}"))
}

#[test]
#[ignore = "needs an RDMA device"]
fn doctor_reports_the_softroce_guest() {
    let dev = device();
    let (json, code) = doctor(&[]);

    // Shape: status, summary, checks (each check/subject/status/finding/fix).
    let status = json["status"].as_str().expect("status is a string");
    assert!(["ok", "warn", "fail"].contains(&status), "{status}");
    assert_eq!(
        code,
        if status == "fail" { 1 } else { 0 },
        "exit status follows the worst check"
    );
    let checks = json["checks"].as_array().expect("checks is an array");
    assert!(!checks.is_empty());
    for c in checks {
        assert!(c["check"].is_string(), "{c}");
        assert!(c["subject"].is_string() || c["subject"].is_null(), "{c}");
        assert!(
            ["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap()),
            "{c}"
        );
        assert!(c["finding"].as_str().is_some_and(|f| !f.is_empty()), "{c}");
        match c["status"].as_str().unwrap() {
            "ok" => assert!(c["fix"].is_null(), "{c}"),
            _ => assert!(
                c["fix"].as_str().is_some_and(|f| !f.is_empty()),
                "a warning needs a fix: {c}"
            ),
        }
    }
    let counted: u64 = ["ok", "warn", "fail"]
        .iter()
        .map(|s| json["summary"][s].as_u64().unwrap())
        .sum();
    assert_eq!(counted as usize, checks.len());
    assert_eq!(json["context"]["source"], "verbs");

    // rxe0 is SoftRoCE, its port ACTIVE, facts from verbs.
    let d = json["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == dev.as_str())
        .unwrap_or_else(|| panic!("{dev} not among the devices: {json:#}"));
    assert_eq!(d["softroce"], true, "{d:#}");
    assert_eq!(d["kind"], "softroce");
    assert_eq!(d["netdev"], netdev());
    assert_eq!(
        d["limits"]["vendor_id"], 0x00ff_ffff,
        "rxe's vendor id, from ibv_query_device"
    );
    assert_eq!(d["ports"][0]["port"], 1);
    assert_eq!(d["ports"][0]["state"], "ACTIVE");
    assert_eq!(d["ports"][0]["link_layer"], "Ethernet");
    assert!(d["ports"][0]["active_mtu"].as_u64().unwrap() >= 256);
    assert!(d["ports"][0]["selected_gid"].is_u64(), "{d:#}");
    let kind = check(&json, "device.kind", &dev);
    assert_eq!(kind["status"], "warn");
    assert!(
        kind["finding"].as_str().unwrap().contains("SoftRoCE (rxe)"),
        "{kind}"
    );
    assert!(
        kind["finding"]
            .as_str()
            .unwrap()
            .contains("functional, not hardware"),
        "{kind}"
    );
    let port = format!("{dev}/1");
    assert_eq!(check(&json, "port.state", &port)["status"], "ok");
    assert_eq!(check(&json, "port.gid", &port)["status"], "ok");

    // The huge pages the guest reserved.
    let total = meminfo("HugePages_Total");
    if std::env::var_os("PINPOLL_VM_HUGEPAGES").is_none() {
        assert_eq!(total, 256, "scripts/softroce-vm reserves 256 2 MiB pages");
    }
    assert_eq!(json["hugepages"]["2M"]["total"], total);
    assert_eq!(json["hugepages"]["2M"]["free"], meminfo("HugePages_Free"));
    let rows = json["checks"].as_array().unwrap();
    let huge = rows.iter().find(|c| c["check"] == "hugepages.2M").unwrap();
    assert!(
        huge["finding"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{total} reserved")),
        "{huge}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_softroce_profile_fits_rxe() {
    let dev = device();
    let (json, _) = doctor(&["--profile", "softroce", "--device", &dev, "--cores", "1"]);
    let fit = check(&json, "profile.fit", &dev);
    assert_eq!(fit["status"], "ok", "{fit}");
    // The counts come from the device itself: rxe has shared receive
    // queues and holds many connections.
    let capacity = check(&json, "device.capacity", &dev);
    assert_eq!(capacity["status"], "ok", "{capacity}");
    let limits = &json["devices"][0]["limits"];
    for key in [
        "max_qp",
        "max_cq",
        "max_mr",
        "max_pd",
        "max_srq",
        "max_srq_wr",
    ] {
        assert!(limits[key].as_u64().unwrap_or(0) > 0, "{key}: {limits}");
    }
    let max_inline = json["devices"][0]["max_inline_data"]
        .as_u64()
        .expect("the inline probe ran");
    let cfg = pinpoll::EngineConfig::load("softroce").unwrap();
    assert!(
        u64::from(cfg.inline_threshold) <= max_inline,
        "softroce inline {} > rxe's {max_inline}",
        cfg.inline_threshold
    );
    assert_eq!(json["context"]["cores"], serde_json::json!([1]));
    assert_eq!(
        json["devices"].as_array().unwrap().len(),
        1,
        "--device filters"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn verbs_and_sysfs_facts_agree() {
    let dev = device();
    let root = pinpoll_tune::SystemRoot::host();
    let verbs = pinpoll_tune::facts::gather_verbs(&root, Some(&dev));
    let sysfs = pinpoll_tune::facts::gather_sysfs(&root, Some(&dev), "sysfs only");
    let (v, s) = (&verbs.devices[0], &sysfs.devices[0]);
    assert!(v.limits.is_ok(), "{:?}", v.limits);
    let (vp, sp) = (v.ports.as_ref().unwrap(), s.ports.as_ref().unwrap());
    assert_eq!(vp.len(), sp.len());
    for (a, b) in vp.iter().zip(sp) {
        assert_eq!(a.state, b.state);
        assert_eq!(a.link_layer, b.link_layer);
        assert_eq!(a.gids, b.gids);
    }
}

/// A tiny `pinpoll-tune sweep` on the device: two workloads, one size, a
/// 2 x 2 grid of which one value is beyond any device's inline limit
/// (skipped), two repeats. Checks the CSVs, the SVGs and that the
/// recommended profile loads back and validates.
#[test]
#[ignore = "needs an RDMA device"]
fn a_tiny_sweep_runs_end_to_end() {
    let dev = device();
    let fx = common::Fixture::empty("sweep-device");
    let out = fx.path().join("out");
    let o = common::tune_command(&[
        "sweep",
        "-d",
        &dev,
        "--workloads",
        "write-lat,write-bw",
        "--sizes",
        "64",
        "--grid",
        "signal_interval=1,16",
        "inline_threshold=64,8192",
        "--repeat",
        "2",
        "-n",
        "100",
        "--timeout",
        "120",
        "--out",
        out.to_str().unwrap(),
    ]);
    // Sixteen runs of `--timeout 120` at most; far beyond them is a hang.
    let o = Running::spawn(o).finish_within(Duration::from_secs(3600));
    let (stdout, stderr) = (o.stdout.as_str(), o.stderr.as_str());
    assert!(o.status.success(), "{stdout}\n{stderr}");
    // inline_threshold=8192 is beyond the probe's 4096 cap: skipped, reported.
    assert_eq!(stderr.matches("skipped:").count(), 4, "{stderr}");
    common::assert_contains(stderr, "max_inline_data");

    // runs.csv: header + 2 workloads x 2 valid points x 1 size x 2 repeats.
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let lines: Vec<&str> = runs.lines().collect();
    let head = common::csv_fields(lines[0]);
    let col = |n: &str| head.iter().position(|h| h == n).unwrap();
    assert_eq!(lines.len(), 1 + 8, "{runs}");
    for l in &lines[1..] {
        let f = common::csv_fields(l);
        assert_eq!(f[col("status")], "ok", "{l}");
        assert_eq!(f[col("inline_threshold")], "64");
        if f[col("workload")] == "write-lat" {
            let p50: f64 = f[col("p50_us")].parse().unwrap();
            let p99: f64 = f[col("p99_us")].parse().unwrap();
            assert!(p50 > 0.0 && p99 >= p50, "{l}");
            // -Q carries the point's signal_interval to the latency test.
            assert_eq!(
                f[col("conn_signal_interval")],
                f[col("signal_interval")],
                "{l}"
            );
        } else {
            assert!(f[col("mib_per_sec")].parse::<f64>().unwrap() > 0.0, "{l}");
        }
    }
    // medians.csv: every point of every workload, the skipped ones too.
    let medians = std::fs::read_to_string(out.join("medians.csv")).unwrap();
    assert_eq!(medians.lines().count(), 1 + 2 * 4, "{medians}");
    assert_eq!(medians.matches(",invalid,").count(), 4);
    assert_eq!(
        medians.matches(",yes,").count(),
        2,
        "one recommended point per workload"
    );

    for (w, series) in [("write-lat", "p50 64 B"), ("write-bw", "MiB/s 64 B")] {
        let svg = std::fs::read_to_string(out.join(format!("{w}.svg"))).unwrap();
        common::assert_well_formed(&svg);
        let labels = common::svg_labels(&svg);
        for label in [series, "signal_interval", "inline_threshold"] {
            assert!(labels.iter().any(|l| l == label), "{label} in {labels:?}");
        }
    }
    for f in [
        "recommended.toml",
        "recommended-write-lat.toml",
        "recommended-write-bw.toml",
    ] {
        let path = out.join(f);
        let text = std::fs::read_to_string(&path).unwrap();
        common::assert_contains(&text, &format!("device {dev}"));
        let cfg = pinpoll::EngineConfig::load(path.to_str().unwrap())
            .unwrap_or_else(|e| panic!("{f} does not load: {e}\n{text}"));
        cfg.validate().unwrap();
        assert_eq!(cfg.inline_threshold, 64);
    }
}
