//! pinpoll-hostile's command line, without a device.

use std::time::Duration;

use pinpoll_testkit::run_within;

const HOSTILE: &str = env!("CARGO_BIN_EXE_pinpoll-hostile");

#[test]
fn help_names_every_attack() {
    let out = run_within(HOSTILE, &["--help"], Duration::from_secs(30));
    assert!(out.status.success(), "{out:#?}");
    for attack in [
        "bad-hellos",
        "stalled-joins",
        "guessed-tokens",
        "half-open",
        "announce",
        "trickle",
    ] {
        assert!(out.stdout.contains(attack), "{attack}: {}", out.stdout);
    }
}

#[test]
fn a_bad_command_line_is_one_error_line_and_status_2() {
    let out = run_within(
        HOSTILE,
        &["169.254.0.1", "trickle", "--size", "x"],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2), "{out:#?}");
    assert_eq!(
        out.stderr
            .lines()
            .filter(|l| l.starts_with("error:"))
            .count(),
        1,
        "{out:#?}"
    );
}
