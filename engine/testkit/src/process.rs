//! Programs run as child processes: a server whose `listening on` line
//! gives its port, clients run to completion, and what each printed. Every
//! wait on a child is bounded by a watchdog: a hung child is killed,
//! through its own handle, and the test fails. No assertion depends on
//! timing; the bound only turns a hang into a failure.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The `--timeout` (seconds) the device tests give the example programs.
pub const TIMEOUT_SECS: u64 = 10;
/// How long a child may run before it counts as hung: far beyond anything
/// it waits for with [`TIMEOUT_SECS`], so only a real hang trips it.
pub const HANG: Duration = Duration::from_secs(4 * TIMEOUT_SECS + 30);

/// A command for `bin` with `args` in a clean environment for logs (no
/// `RUST_LOG`, no `RUST_BACKTRACE`), stdin empty, stdout and stderr piped.
pub fn command(bin: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// What a finished process printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn stdout_lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }

    /// Succeeded, with nothing on stderr.
    #[track_caller]
    pub fn assert_ok(&self, who: &str) {
        assert!(
            self.status.success() && self.stderr.is_empty(),
            "{who} should succeed quietly: {self:#?}"
        );
    }

    /// Failed with exactly one line on stderr, `error: ...`, by an exit
    /// (not a signal) and without a panic; returns the line.
    #[track_caller]
    pub fn assert_one_error_line(&self, who: &str) -> &str {
        assert!(!self.status.success(), "{who} should fail: {self:#?}");
        assert!(
            self.status.code().is_some(),
            "{who} should exit, not die by a signal: {self:#?}"
        );
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "{who} should print exactly one line on stderr: {self:#?}"
        );
        assert!(
            lines[0].starts_with("error: "),
            "{who}'s stderr line should start with `error: `: {self:#?}"
        );
        assert!(
            !self.stderr.contains("panicked") && !self.stderr.contains("RUST_BACKTRACE"),
            "{self:#?}"
        );
        lines[0]
    }
}

/// A started child. Kills it on drop unless it was waited for: a failing
/// test never leaves a server behind.
pub struct Running {
    child: Option<Child>,
    /// Every stdout line as it comes; the reader returns them all at the end.
    lines: Receiver<String>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl Running {
    /// Spawns `cmd`, whose stdout and stderr must be piped (as
    /// [`command`] makes them); both are read as they come.
    pub fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = channel();
        let stdout = std::thread::spawn(move || {
            let mut all = String::new();
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                all.push_str(&line);
                all.push('\n');
                let _ = tx.send(line);
            }
            all
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = BufReader::new(stderr).read_to_string(&mut text);
            text
        });
        Running {
            child: Some(child),
            lines,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The first stdout line (from here on) that satisfies `pred`; `None`
    /// when stdout ends first. Fails the test after [`HANG`].
    pub fn wait_for_line(&self, pred: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + HANG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return Some(line),
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => panic!("no such line on stdout within {HANG:?}"),
            }
        }
    }

    /// Sends `signal` (e.g. "TERM") to this child, by its pid.
    pub fn signal(&self, signal: &str) {
        let pid = self.id().to_string();
        let status = Command::new("kill")
            .args(["-s", signal, &pid])
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill -s {signal} {pid} failed");
    }

    /// Waits for the exit (killing it and failing the test after [`HANG`]).
    pub fn finish(self) -> Finished {
        self.finish_within(HANG)
    }

    /// Waits for the exit, killing the child and failing the test if it
    /// runs longer than `bound` (for programs whose work is long in a TCG
    /// guest, such as a large transfer of an unoptimised build).
    pub fn finish_within(mut self, bound: Duration) -> Finished {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + bound;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child did not exit within {bound:?}; killed it");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Finished {
            status,
            stdout: self.stdout.take().unwrap().join().expect("stdout reader"),
            stderr: self.stderr.take().unwrap().join().expect("stderr reader"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `bin args` to completion (bounded by [`HANG`]).
pub fn run(bin: &str, args: &[&str]) -> Finished {
    Running::spawn(command(bin, args)).finish()
}

/// Runs `bin args` to completion, bounded by `bound` instead of [`HANG`].
pub fn run_within(bin: &str, args: &[&str], bound: Duration) -> Finished {
    run_within_env(bin, args, &[], bound)
}

/// [`run_within`] with extra environment variables `env`.
pub fn run_within_env(bin: &str, args: &[&str], env: &[(&str, &str)], bound: Duration) -> Finished {
    let mut cmd = command(bin, args);
    cmd.envs(env.iter().copied());
    Running::spawn(cmd).finish_within(bound)
}

/// A server started with `args` plus `--port 0`, its port read from its
/// `listening on ADDR:PORT` line.
pub struct Server {
    pub proc: Running,
    pub port: u16,
}

impl Server {
    pub fn start(bin: &str, args: &[&str]) -> Server {
        Server::start_env(bin, args, &[])
    }

    /// [`Server::start`] with extra environment variables.
    pub fn start_env(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut all = args.to_vec();
        all.extend(["--port", "0"]);
        let mut cmd = command(bin, &all);
        cmd.envs(env.iter().copied());
        let proc = Running::spawn(cmd);
        let line = proc.wait_for_line(|l| l.starts_with("listening on "));
        let Some(line) = line else {
            let finished = proc.finish();
            panic!("{bin} {all:?} never said it was listening: {finished:#?}")
        };
        let port = line
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        assert_ne!(port, 0, "{line}");
        Server { proc, port }
    }

    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    pub fn port_arg(&self) -> String {
        self.port.to_string()
    }

    pub fn finish(self) -> Finished {
        self.proc.finish()
    }
}
