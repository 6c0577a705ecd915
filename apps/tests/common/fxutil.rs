//! Helpers of the filexfer tests: files with known contents, their
//! SHA-256, scratch directories, and a child run with a bound of its own
//! (a large transfer of an unoptimized build in the TCG guest takes minutes).
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const FILEXFER: &str = env!("CARGO_BIN_EXE_filexfer");

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("filexfer-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn str(&self) -> &str {
        self.0.to_str().expect("UTF-8 temp dir")
    }

    /// The names in the directory, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `len` pseudo-random bytes (a fixed xorshift stream per `seed`).
pub fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    std::fs::write(path, data).expect("write source file");
}

pub fn sha256(path: &Path) -> [u8; 32] {
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().into()
}

/// What a finished child printed.
#[derive(Debug)]
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Failed with exactly one line on stderr, `error: ...`; returns it.
    pub fn one_error_line(&self, who: &str) -> &str {
        assert!(!self.status.success(), "{who} should fail: {self:#?}");
        assert!(
            self.status.code().is_some(),
            "{who} died by a signal: {self:#?}"
        );
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{who} should print one line on stderr: {self:#?}"
        );
        assert!(lines[0].starts_with("error: "), "{self:#?}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        lines[0]
    }

    pub fn assert_ok(&self, who: &str) {
        assert!(
            self.status.success() && self.stderr.is_empty(),
            "{who} should succeed quietly: {self:#?}"
        );
    }
}

/// Runs `bin args` to completion, killing it (through its own handle) and
/// failing the test if it runs longer than `bound`.
pub fn run_bounded(bin: &str, args: &[&str], bound: Duration) -> Out {
    run_bounded_env(bin, args, &[], bound)
}

/// [`run_bounded`] with extra environment variables.
pub fn run_bounded_env(bin: &str, args: &[&str], env: &[(&str, &str)], bound: Duration) -> Out {
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} {args:?} did not exit within {bound:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        status,
        stdout: t1.join().expect("stdout reader"),
        stderr: t2.join().expect("stderr reader"),
    }
}
