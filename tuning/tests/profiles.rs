//! The shipped profiles load, are commented line by line, have the
//! character their names promise; `pinpoll-tune profile check` validates
//! and prints the effective configuration.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::tune;
use pinpoll::config::profile::{ProfileSource, BUILTIN};
use pinpoll::{EngineConfig, IdlePolicy};
use pinpoll_testkit::Scratch;
use pinpoll_tune::profile;

/// The profile files in the engine's source tree, which the crate compiles in.
fn shipped() -> Vec<(String, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/profiles");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    out
}

#[test]
fn every_shipped_profile_loads() {
    let profiles = shipped();
    let names: BTreeSet<&str> = profiles.iter().map(|(n, _)| n.as_str()).collect();
    let built_in: BTreeSet<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names, built_in,
        "every profile file is built in, and only those"
    );
    for (name, path) in &profiles {
        let text = std::fs::read_to_string(path).unwrap();
        let parsed = EngineConfig::from_toml(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        // By name (the compiled-in text), and by path.
        assert_eq!(EngineConfig::load(name).unwrap(), parsed, "{name}");
        assert_eq!(EngineConfig::load(path.to_str().unwrap()).unwrap(), parsed);
        // profile check finds what the engine loads.
        assert!(matches!(profile::locate(name), Some(ProfileSource::Builtin(n)) if n == name));
    }
}

#[test]
fn shipped_profiles_are_commented_line_by_line() {
    for (name, path) in shipped() {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with(&format!("# {name}:")),
            "{name}: first line names the profile"
        );
        for (i, line) in lines.iter().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let commented = line.contains('#') || (i > 0 && lines[i - 1].trim().starts_with('#'));
            assert!(
                commented,
                "{name}.toml line {}: {line:?} has no comment of its own",
                i + 1
            );
        }
    }
}

#[test]
fn profiles_have_the_character_their_names_promise() {
    let latency = EngineConfig::load("latency").unwrap();
    assert_eq!(latency.batch_size, 1);
    assert!(
        latency.signal_interval <= 4,
        "every send signaled, or a small K"
    );
    assert!(latency.inline_threshold > 0, "inline on");
    assert_eq!(latency.idle, IdlePolicy::Spin, "pure spin");

    let throughput = EngineConfig::load("throughput").unwrap();
    assert!(throughput.batch_size >= 16, "large batches");
    assert_eq!(
        throughput.signal_interval, throughput.batch_size,
        "K = batch"
    );
    assert!(
        throughput.qp.max_send_wr >= 512 && throughput.qp.max_recv_wr >= 512,
        "deep queues"
    );
    assert!(throughput.slot_size >= 64 * 1024, "big slots");

    let softroce = EngineConfig::load("softroce").unwrap();
    assert!(
        matches!(softroce.idle, IdlePolicy::Backoff { .. }),
        "backoff: TCG guests have 2 vCPUs"
    );
    assert!(
        softroce.qp.max_send_wr <= 256 && softroce.qp.max_recv_wr <= 256,
        "moderate depths"
    );
    // rxe's max_inline_data (32 SGEs x 16 B); the device test checks it on rxe0.
    assert!(softroce.inline_threshold > 0 && softroce.inline_threshold <= 512);
    assert_ne!(softroce.qp.timeout, 0);
}

#[test]
fn the_effective_configuration_loads_back_unchanged() {
    let mut configs: Vec<(String, EngineConfig)> = shipped()
        .into_iter()
        .map(|(n, _)| (n.clone(), EngineConfig::load(&n).unwrap()))
        .collect();
    configs.push(("defaults".into(), EngineConfig::default()));
    configs.push((
        "heartbeat off".into(),
        EngineConfig::from_toml("heartbeat_interval_ms = 0").unwrap(),
    ));
    configs.push((
        "heartbeat".into(),
        EngineConfig::from_toml("heartbeat_interval_ms = 250\nheartbeat_misses = 5").unwrap(),
    ));
    configs.push((
        "gid".into(),
        EngineConfig::from_toml(
            "gid_index = 3\nidle = \"backoff\"\nbackoff_spins = 7\nhugepages = \"2M\"\ncore = 0",
        )
        .unwrap(),
    ));
    for (name, cfg) in configs {
        let text = profile::effective_toml(&cfg, &BTreeSet::new());
        let back = EngineConfig::from_toml(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(back, cfg, "{name}:\n{text}");
    }
}

#[test]
fn the_effective_configuration_names_every_key_the_engine_accepts() {
    // serde lists the accepted keys in its unknown-field error.
    let err = EngineConfig::from_toml("no_such_key = 1")
        .unwrap_err()
        .to_string();
    let accepted: BTreeSet<&str> = err
        .split_once("expected one of")
        .unwrap_or_else(|| panic!("{err}"))
        .1
        .split('`')
        .skip(1)
        .step_by(2)
        .collect();
    let cfg = EngineConfig::from_toml("gid_index = 1\nidle = \"backoff\"").unwrap();
    let printed: BTreeSet<&str> = profile::effective_keys(&cfg)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        printed, accepted,
        "profile::effective_keys is out of step with the engine's profile keys"
    );
}

#[test]
fn profile_check_prints_every_key_and_marks_the_defaults() {
    let out = tune(&["profile", "check", "softroce"]);
    assert_eq!(out.status.code(), Some(0));
    let text = out.stdout;
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("# profile softroce ("), "{first}");
    assert!(
        first.ends_with("(built-in softroce): valid. Effective configuration:"),
        "{first}"
    );
    for (key, _) in profile::effective_keys(&EngineConfig::load("softroce").unwrap()) {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{key} = "))),
            "{key} missing:\n{text}"
        );
    }
    assert!(text.contains("inline_threshold = 512\n"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("min_rnr_timer = 12") && l.ends_with("# engine default")),
        "{text}"
    );
    assert!(
        text.contains("# per connection: 2097152 bytes registered and locked"),
        "{text}"
    );
    // The whole output is itself a valid profile.
    assert_eq!(
        EngineConfig::from_toml(&text).unwrap(),
        EngineConfig::load("softroce").unwrap()
    );
}

#[test]
fn profile_check_rejects_bad_profiles_in_one_line_naming_key_and_range() {
    let dir = Scratch::new("pinpoll-tune-profiles");
    let cases = [
        (
            "unknown.toml",
            "batch_size = 4\nbatch_sise = 4\n",
            "unknown field `batch_sise`, expected one of",
        ),
        (
            "range.toml",
            "batch_size = 0\n",
            "batch_size = 0 is out of range: allowed 1..=256 (send_queue_depth)",
        ),
        (
            "timeout.toml",
            "qp_timeout = 40\n",
            "qp_timeout (field qp.timeout) = 40 is out of range 1..=31",
        ),
        (
            "type.toml",
            "slot_size = \"big\"\n",
            "invalid type: string \"big\", expected u32",
        ),
    ];
    for (file, text, expected) in cases {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let out = tune(&["profile", "check", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{file}");
        assert!(out.stdout.is_empty());
        let err = out.stderr;
        assert_eq!(err.lines().count(), 1, "{file}: {err}");
        assert!(
            err.starts_with(&format!("error: profile {}: ", path.display())),
            "{err}"
        );
        assert!(
            err.contains(expected),
            "{file}: {err:?} should contain {expected:?}"
        );
    }

    let out = tune(&["profile", "check", "no-such-profile"]);
    assert_eq!(out.status.code(), Some(1));
    let err = out.stderr;
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: no profile named \"no-such-profile\""),
        "{err}"
    );
}
