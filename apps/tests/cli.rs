//! The command lines of `basic` and `readwrite`: help that explains every
//! flag, and bad input refused with one `error: ...` line and a non-zero
//! status before anything touches a device. These run anywhere.

mod common;

use common::*;

fn help(bin: &str, args: &[&str]) -> String {
    let out = run(bin, args);
    out.assert_ok(&format!("{bin} {args:?}"));
    out.stdout
}

fn assert_mentions(text: &str, words: &[&str]) {
    for w in words {
        assert!(text.contains(w), "{w:?} missing from:\n{text}");
    }
}

const COMMON_FLAGS: [&str; 8] = [
    "-d, --device <NAME>",
    "-p, --port <PORT>",
    "--timeout <SECONDS>",
    "-q, --quiet",
    "RDMA device the connection must use",
    "on every completion wait",
    "[default: 10]",
    "Print only the received data",
];

#[test]
fn basic_help_explains_every_flag() {
    let top = help(BASIC, &["--help"]);
    assert_mentions(&top, &COMMON_FLAGS);
    assert_mentions(
        &top,
        &["server", "client", "[default: 7471]", "Exit status"],
    );
    let server = help(BASIC, &["server", "--help"]);
    assert_mentions(&server, &COMMON_FLAGS);
    assert_mentions(
        &server,
        &[
            "--bind <ADDR>",
            "[default: ::]",
            "--count <N>",
            "SIGINT or SIGTERM",
        ],
    );
    let client = help(BASIC, &["client", "--help"]);
    assert_mentions(&client, &COMMON_FLAGS);
    assert_mentions(&client, &["<HOST>", "%interface"]);
    // Flags go before or after the subcommand.
    help(BASIC, &["-q", "client", "--help"]);
}

#[test]
fn readwrite_help_explains_every_flag() {
    let top = help(READWRITE, &["--help"]);
    assert_mentions(&top, &COMMON_FLAGS);
    assert_mentions(&top, &["[default: 7472]"]);
    let server = help(READWRITE, &["server", "--help"]);
    assert_mentions(
        &server,
        &["--bind <ADDR>", "--count <N>", "--message <TEXT>"],
    );
    let client = help(READWRITE, &["client", "--help"]);
    assert_mentions(
        &client,
        &[
            "<MODE>",
            "<HOST>",
            "--message <TEXT>",
            "write: RDMA WRITE",
            "read:  RDMA READ",
        ],
    );
}

#[test]
fn version_prints_and_exits_zero() {
    for bin in [BASIC, READWRITE] {
        let out = run(bin, &["--version"]);
        out.assert_ok(bin);
        assert!(out.stdout.contains(env!("CARGO_PKG_VERSION")), "{out:#?}");
    }
}

#[test]
fn bad_hosts_are_one_line_errors_naming_the_host() {
    let cases: [(&str, &str); 4] = [
        ("not-an-ip", "not-an-ip is not a valid socket address"),
        ("localhost", "give an IPv4 or IPv6 address"),
        ("fe80::1", "needs a scope"),
        (
            "fe80::1%nosuchif0",
            "no network interface named \"nosuchif0\"",
        ),
    ];
    for (host, expected) in cases {
        for (bin, args) in [
            (BASIC, vec!["client", host]),
            (READWRITE, vec!["client", "write", host]),
            (READWRITE, vec!["client", "read", host, "-q"]),
        ] {
            let out = run(bin, &args);
            let line = out.assert_one_error_line(&format!("{bin} {args:?}"));
            assert_eq!(out.status.code(), Some(1), "{out:#?}");
            assert!(line.starts_with("error: invalid address: "), "{line}");
            assert!(line.contains(expected), "{line:?} should say {expected:?}");
            assert!(out.stdout.is_empty(), "{out:#?}");
        }
    }
}

#[test]
fn a_bad_bind_address_is_a_one_line_error() {
    let out = run(BASIC, &["server", "--bind", "::1::2"]);
    let line = out.assert_one_error_line("basic server --bind ::1::2");
    assert!(
        line.starts_with("error: --bind: invalid address: ::1::2"),
        "{line}"
    );
}

#[test]
fn an_unknown_mode_is_a_usage_error_listing_the_modes() {
    let out = run(READWRITE, &["client", "append", "169.254.0.1"]);
    let line = out.assert_one_error_line("readwrite client append");
    assert_eq!(out.status.code(), Some(2), "{out:#?}");
    assert!(line.contains("invalid value 'append'"), "{line}");
    assert!(line.contains("[possible values: write, read]"), "{line}");
}

#[test]
fn usage_errors_are_one_line_with_status_2() {
    let cases: [(&str, &[&str], &str); 10] = [
        (BASIC, &[], "no subcommand given: use one of server, client"),
        (
            BASIC,
            &["client"],
            "required arguments were not provided: <HOST>",
        ),
        (BASIC, &["serve"], "unrecognized subcommand 'serve'"),
        (
            BASIC,
            &["client", "169.254.0.1", "--frob"],
            "unexpected argument '--frob'",
        ),
        (
            BASIC,
            &["client", "169.254.0.1", "--timeout", "0"],
            "must be more than 0 seconds",
        ),
        (
            BASIC,
            &["client", "169.254.0.1", "--timeout", "soon"],
            "is not a number of seconds",
        ),
        (
            BASIC,
            &["client", "169.254.0.1", "--port", "70000"],
            "70000",
        ),
        (BASIC, &["server", "--count", "0"], "--count <N>"),
        (
            READWRITE,
            &["client", "write", "169.254.0.1", "--message", ""],
            "the message is empty",
        ),
        (
            READWRITE,
            &["server", "--message", &"x".repeat(4097)],
            "4097 bytes; at most 4096",
        ),
    ];
    for (bin, args, expected) in cases {
        let out = run(bin, args);
        let line = out.assert_one_error_line(&format!("{bin} {args:?}"));
        assert_eq!(out.status.code(), Some(2), "{out:#?}");
        assert!(line.contains(expected), "{line:?} should say {expected:?}");
        assert!(line.ends_with("(see --help)"), "{line}");
    }
}

#[test]
fn a_message_in_read_mode_is_refused() {
    let out = run(
        READWRITE,
        &["client", "read", "169.254.0.1", "--message", "x"],
    );
    let line = out.assert_one_error_line("readwrite client read --message");
    assert!(line.contains("--message is for write mode"), "{line}");
}
