//! Running `pinpoll-perf` as a child process, bounded by a timeout.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::measure::{Measurement, Outcome, Workload};

/// The `pinpoll-perf` binary: `explicit` (`--perf`), else next to this
/// executable (cargo puts both in target/<profile>/), else in `PATH`.
pub fn find_perf(explicit: Option<&Path>) -> Result<PathBuf, String> {
    const HINT: &str = "build it with `cargo build -p pinpoll-perf`, or give --perf PATH";
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--perf {}: no such file; {HINT}", p.display()))
        };
    }
    let mut looked = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        // Test binaries live one level down, in target/<profile>/deps.
        for d in [dir.clone(), dir.join("..")] {
            let p = d.join("pinpoll-perf");
            if p.is_file() {
                return Ok(p);
            }
            looked.push(d.display().to_string());
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let p = d.join("pinpoll-perf");
            if p.is_file() {
                return Ok(p);
            }
        }
        looked.push("$PATH".into());
    }
    Err(format!(
        "pinpoll-perf not found (looked in {}): {HINT}",
        looked.join(", ")
    ))
}

/// One `pinpoll-perf` invocation.
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    pub perf: &'a Path,
    pub workload: Workload,
    pub size: usize,
    pub iterations: Option<u64>,
    pub device: Option<&'a str>,
    pub profile: &'a Path,
    /// `-Q`: latency tests otherwise ignore the profile's signal_interval.
    pub signal_interval: Option<u32>,
    pub mode: &'a str,
    pub timeout: Duration,
    /// Where stdout and stderr go (`<scratch>.out`, `<scratch>.err`).
    pub scratch: &'a Path,
}

impl Invocation<'_> {
    /// The arguments after the program name.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            self.workload.name().to_owned(),
            "--loopback".into(),
            "-s".into(),
            self.size.to_string(),
            "--profile".into(),
            self.profile.display().to_string(),
            "--mode".into(),
            self.mode.to_owned(),
            "--json".into(),
        ];
        if let Some(d) = self.device {
            a.extend(["-d".into(), d.to_owned()]);
        }
        if let Some(n) = self.iterations {
            a.extend(["-n".into(), n.to_string()]);
        }
        if let Some(q) = self.signal_interval {
            a.extend(["-Q".into(), q.to_string()]);
        }
        a
    }

    /// The command line, for logs and errors.
    pub fn command_line(&self) -> String {
        let mut s = self.perf.display().to_string();
        for a in self.args() {
            s.push(' ');
            s.push_str(&a);
        }
        s
    }

    /// Runs it; a run that outlasts the timeout is killed (this child
    /// only, by its handle).
    pub fn run(&self) -> Outcome {
        let out_path = self.scratch.with_extension("out");
        let err_path = self.scratch.with_extension("err");
        let files = std::fs::File::create(&out_path)
            .and_then(|o| Ok((o, std::fs::File::create(&err_path)?)));
        let (out, err) = match files {
            Ok(f) => f,
            Err(e) => return Outcome::Failed(format!("cannot create {}: {e}", out_path.display())),
        };
        let mut child = match Command::new(self.perf)
            .args(self.args())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => return Outcome::Failed(format!("cannot run {}: {e}", self.perf.display())),
        };
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if start.elapsed() >= self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Outcome::TimedOut(self.timeout.as_secs_f64());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(25)),
                Err(e) => return Outcome::Failed(format!("waiting for pinpoll-perf: {e}")),
            }
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let _ = std::fs::remove_file(&out_path);
        let _ = std::fs::remove_file(&err_path);
        if !status.success() {
            let reason = stderr
                .lines()
                .rev()
                .find(|l| l.trim_start().starts_with("error"))
                .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
                .unwrap_or("no message")
                .trim()
                .to_owned();
            return Outcome::Failed(format!("pinpoll-perf exited with {status}: {reason}"));
        }
        match Measurement::from_perf_json(&stdout) {
            Ok(m) => Outcome::Ok(m),
            Err(e) => Outcome::Failed(e),
        }
    }
}
