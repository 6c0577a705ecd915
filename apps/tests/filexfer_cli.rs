//! filexfer without an RDMA device: the command line, file names the
//! client refuses before connecting, and a `--dir` the server cannot use.
//! Each failure is one `error: ...` line and a non-zero exit status.

mod common;

use std::os::unix::ffi::OsStrExt as _;
use std::time::Duration;

use common::{run_within, Scratch, FILEXFER};

const BOUND: Duration = Duration::from_secs(60);

#[test]
fn help_explains_every_flag() {
    let top = run_within(FILEXFER, &["--help"], BOUND);
    assert!(top.status.success(), "{top:#?}");
    for flag in [
        "--port",
        "--hugepages",
        "--device",
        "--core",
        "--quiet",
        "--timeout",
        "--profile <NAME>",
        "--verify-threads <N>",
        "--core <N[,N...]>",
    ] {
        assert!(top.stdout.contains(flag), "{flag} missing: {}", top.stdout);
    }
    let serve = run_within(FILEXFER, &["serve", "--help"], BOUND);
    for flag in [
        "--dir",
        "--max-clients",
        "--count",
        "--overwrite",
        "--bind",
        "--max-size <BYTES>",
        "--min-free <BYTES>",
        "[default: 68719476736]",
        "--min-rate <BYTES_PER_S>",
        "--deadline <SECONDS>",
    ] {
        assert!(
            serve.stdout.contains(flag),
            "{flag} missing: {}",
            serve.stdout
        );
    }
    let send = run_within(FILEXFER, &["send", "--help"], BOUND);
    assert!(
        send.stdout.contains("<HOST>") && send.stdout.contains("<FILE>"),
        "{}",
        send.stdout
    );
    for text in [
        "--wait-for-file <SECONDS>",
        "Heartbeats watch the idle connection",
        "--streams <N>",
    ] {
        assert!(
            send.stdout.contains(text),
            "{text} missing: {}",
            send.stdout
        );
    }
}

#[test]
fn bad_command_lines_exit_2_with_one_line() {
    for args in [
        &[][..],
        &["send"][..],
        &["send", "169.254.0.1"][..],
        &["serve", "--max-clients", "0"][..],
        &["serve", "--port", "70000"][..],
        &["send", "h", "f", "--timeout", "0"][..],
        &["send", "h", "f", "--wait-for-file", "0"][..],
        &["send", "h", "f", "--wait-for-file", "soon"][..],
        &["send", "h", "f", "--wait-for-file", "5", "--classic"][..],
        &["send", "h", "f", "--verify-threads", "0"][..],
        &["send", "h", "f", "--streams", "0"][..],
        &["send", "h", "f", "--streams", "17"][..],
        &["send", "h", "f", "--streams", "2", "--classic"][..],
        &["send", "h", "f", "--core", "0,x"][..],
        &["serve", "--max-size", "0"][..],
        &["serve", "--max-size", "lots"][..],
        &["serve", "--min-rate", "fast"][..],
        &["serve", "--deadline", "-1"][..],
        &["frob"][..],
    ] {
        let out = run_within(FILEXFER, args, BOUND);
        out.assert_one_error_line(&format!("filexfer {args:?}"));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:#?}");
    }
}

#[test]
fn the_client_refuses_bad_names_before_connecting() {
    let dir = Scratch::new("names");
    std::fs::write(dir.join(".filexfer-x"), b"x").unwrap();
    let non_utf8 = std::ffi::OsStr::from_bytes(b"bad\xff.bin");
    std::fs::write(dir.path().join(non_utf8), b"x").unwrap();
    let non_utf8_path = dir.path().join(non_utf8);
    let cases: Vec<(String, &str)> = vec![
        // `DIR/.` names DIR itself (Path drops a trailing `.`).
        (format!("{}/.", dir.str()), "not a regular file"),
        (format!("{}/..", dir.str()), "no file name"),
        ("/".to_owned(), "no file name"),
        (dir.join(".filexfer-x").display().to_string(), "reserved"),
    ];
    for (path, expected) in cases {
        let out = run_within(FILEXFER, &["send", "169.254.0.1", &path], BOUND);
        let line = out.assert_one_error_line(&path);
        assert!(line.contains(expected), "{path}: {line}");
    }
    let out = std::process::Command::new(FILEXFER)
        .arg("send")
        .arg("169.254.0.1")
        .arg(&non_utf8_path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("not UTF-8"), "{err}");
    // A missing file fails before any connection too.
    let out = run_within(
        FILEXFER,
        &[
            "send",
            "169.254.0.1",
            &dir.join("missing").display().to_string(),
        ],
        BOUND,
    );
    assert!(
        out.assert_one_error_line("missing").contains("opening"),
        "{out:#?}"
    );
}

#[test]
fn wait_for_file_connects_before_it_needs_the_file() {
    // Without a device or a server the connection fails; with
    // --wait-for-file that is the first thing tried, not opening the file.
    let dir = Scratch::new("wait");
    let missing = dir.join("later.bin").display().to_string();
    let out = run_within(
        FILEXFER,
        &[
            "send",
            "169.254.0.99",
            &missing,
            "--wait-for-file",
            "5",
            "--timeout",
            "2",
        ],
        BOUND,
    );
    let line = out.assert_one_error_line("--wait-for-file");
    assert!(!line.contains("opening"), "{line}");
    assert!(
        line.contains("connecting to") || line.contains("no RDMA device"),
        "{line}"
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(dir.names().is_empty(), "{:?}", dir.names());
}

#[test]
fn a_profile_that_does_not_exist_is_one_error_line() {
    let dir = Scratch::new("profile");
    for args in [
        &[
            "serve",
            "--dir",
            dir.str(),
            "--port",
            "0",
            "--profile",
            "nosuch",
        ][..],
        &["send", "169.254.0.1", dir.str(), "--profile", "nosuch"][..],
    ] {
        let out = run_within(FILEXFER, args, BOUND);
        let line = out.assert_one_error_line("--profile nosuch");
        assert!(
            line.starts_with("error: --profile: ") && line.contains("no profile named \"nosuch\""),
            "{line}"
        );
        assert_eq!(out.status.code(), Some(1));
    }
    // A real one loads: the failure is then the connection's.
    std::fs::write(dir.join("f.bin"), b"x").unwrap();
    let file = dir.join("f.bin").display().to_string();
    let out = run_within(
        FILEXFER,
        &[
            "send",
            "169.254.0.99",
            &file,
            "--profile",
            "softroce",
            "--timeout",
            "1",
        ],
        BOUND,
    );
    let line = out.assert_one_error_line("--profile softroce");
    assert!(!line.contains("--profile"), "{line}");
}

#[test]
fn the_server_refuses_a_dir_it_cannot_use() {
    // Tests run as root, which ignores permission bits: these dirs are
    // unusable for root too — a regular file, a missing path, and /proc
    // (no regular files can be created there).
    let scratch = Scratch::new("dirs");
    let file = scratch.join("plain");
    std::fs::write(&file, b"x").unwrap();
    let cases = [
        (file.display().to_string(), "not a directory"),
        (
            scratch.join("missing").display().to_string(),
            "No such file",
        ),
        ("/proc".to_owned(), "cannot create files there"),
    ];
    for (dir, expected) in cases {
        let out = run_within(FILEXFER, &["serve", "--dir", &dir, "--port", "0"], BOUND);
        let line = out.assert_one_error_line(&dir);
        assert!(line.contains(expected), "{dir}: {line}");
        assert_eq!(out.status.code(), Some(1));
    }
    assert_eq!(scratch.names(), ["plain"]);
}

/// A FIFO (or anything else that is not a regular file) is refused at
/// once: opening one without a writer would wait forever.
#[test]
fn sending_a_fifo_is_refused_without_waiting() {
    let src = Scratch::new("fifo");
    let fifo = src.join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let path = fifo.display().to_string();
    for extra in [&[][..], &["--classic"][..]] {
        let mut args = vec!["send", "169.254.0.1", path.as_str(), "--timeout", "5"];
        args.extend_from_slice(extra);
        let out = run_within(FILEXFER, &args, BOUND);
        let line = out.assert_one_error_line("send of a FIFO");
        assert!(
            line.ends_with("pipe: not a regular file"),
            "{extra:?}: {line}"
        );
    }
}
