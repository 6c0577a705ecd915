//! The C heap allocations of this process, counted by an LD_PRELOAD
//! interposer (`malloc_count.c`, built by `build.rs`): every call of the
//! malloc family — Rust's allocator's and every C library's — on any thread.
//!
//! A program runs itself again under the interposer ([`run_counted`]); the
//! counted run attaches to the counters ([`CHeap::attach`]) and reads them
//! around the work it measures ([`CHeap::read`]). The counters live in a
//! file the interposer maps shared, so reading them is a `pread` into the
//! stack: no allocation, no call into the interposer, no `unsafe`.
#![forbid(unsafe_code)]

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// The interposer's shared object.
pub const INTERPOSER: &str = env!("PINPOLL_MALLOC_COUNT_SO");

/// The variable that names the counter file (set by [`run_counted`]).
pub const FILE_VAR: &str = "PINPOLL_MALLOC_COUNT_FILE";

/// Written by the interposer once the counters are shared (its `MAGIC`).
const MAGIC: u64 = 0x706e_706c_6d61_6c63;

/// The counted functions, in the order of the file's counters.
pub const FUNCTIONS: [&str; 8] = [
    "malloc",
    "calloc",
    "realloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
];

/// The magic, then one counter per function (the interposer's `struct counts`).
const FILE_BYTES: usize = 8 * (1 + FUNCTIONS.len());

/// Calls of each counted function: since the process started, or between
/// two readings ([`Calls::since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls([u64; FUNCTIONS.len()]);

impl Calls {
    /// Calls of every function together.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The calls made after `earlier` was read.
    pub fn since(&self, earlier: &Calls) -> Calls {
        let mut delta = *self;
        for (d, e) in delta.0.iter_mut().zip(earlier.0) {
            *d = d.wrapping_sub(e);
        }
        delta
    }
}

/// The total, then the functions that were called: `3 (malloc 2, calloc 1)`.
impl fmt::Display for Calls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.total())?;
        let mut called = FUNCTIONS.iter().zip(self.0).filter(|(_, n)| *n > 0);
        if let Some((name, n)) = called.next() {
            write!(f, " ({name} {n}")?;
            for (name, n) in called {
                write!(f, ", {name} {n}")?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// This process's view of the interposer's counters.
#[derive(Debug)]
pub struct CHeap {
    file: File,
}

impl CHeap {
    /// Attaches to the counters of the interposer this process runs
    /// under; an error says why it does not (not started by
    /// [`run_counted`], or the interposer was not loaded).
    pub fn attach() -> io::Result<CHeap> {
        let path = std::env::var_os(FILE_VAR).ok_or_else(|| {
            io::Error::other(format!(
                "{FILE_VAR} is not set: this process was not started under the interposer"
            ))
        })?;
        CHeap::open(Path::new(&path))
    }

    /// The counters in the file at `path`, which an interposed process
    /// shares (or shared); an error if no interposer ever mapped it.
    pub fn open(path: &Path) -> io::Result<CHeap> {
        let heap = CHeap {
            file: File::open(path)?,
        };
        heap.read()?;
        Ok(heap)
    }

    /// The counters now. Allocates nothing (a `pread` into the stack), so
    /// it can bracket a region that must not allocate.
    pub fn read(&self) -> io::Result<Calls> {
        let mut raw = [0u8; FILE_BYTES];
        // The interposer sizes the file when it maps it: a short one was
        // never mapped.
        self.file
            .read_exact_at(&mut raw, 0)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => not_loaded(),
                _ => e,
            })?;
        let word = |i: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&raw[8 * i..8 * i + 8]);
            u64::from_ne_bytes(bytes)
        };
        if word(0) != MAGIC {
            return Err(not_loaded());
        }
        let mut calls = Calls::default();
        for (i, c) in calls.0.iter_mut().enumerate() {
            *c = word(i + 1);
        }
        Ok(calls)
    }
}

#[cold]
fn not_loaded() -> io::Error {
    io::Error::other(format!(
        "the malloc-counting interposer is not active in this process \
         (LD_PRELOAD={INTERPOSER} did not load, or could not map ${FILE_VAR})"
    ))
}

/// Runs this program again, with the same arguments, under the interposer
/// (prepended to any `LD_PRELOAD`), with a fresh counter file that is
/// removed afterwards. Returns the run's exit status.
pub fn run_counted() -> io::Result<ExitStatus> {
    let path: PathBuf =
        std::env::temp_dir().join(format!("pinpoll-malloc-count-{}", std::process::id()));
    // Empty: no magic until the interposer has mapped it.
    File::create(&path)?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(other) if !other.is_empty() => format!("{INTERPOSER} {other}"),
        _ => INTERPOSER.to_owned(),
    };
    let status = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env("LD_PRELOAD", preload)
        .env(FILE_VAR, &path)
        .status();
    let _ = std::fs::remove_file(&path);
    status
}

/// Whether this process is the counted run [`run_counted`] started.
pub fn is_counted_run() -> bool {
    std::env::var_os(FILE_VAR).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_and_their_display_name_the_functions_called() {
        let before = Calls([1, 2, 3, 0, 0, 0, 0, 0]);
        let after = Calls([3, 2, 4, 0, 0, 0, 0, 0]);
        let delta = after.since(&before);
        assert_eq!(delta.total(), 3);
        assert_eq!(delta.to_string(), "3 (malloc 2, realloc 1)");
        assert_eq!(Calls::default().to_string(), "0");
    }

    fn counter_file(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "pinpoll-malloc-count-{name}-{}",
            std::process::id()
        ));
        File::create(&path).unwrap();
        path
    }

    #[test]
    fn the_interposer_counts_what_a_c_program_allocates() {
        let path = counter_file("sh");
        let out = Command::new("sh")
            .args(["-c", "echo counted"])
            .env("LD_PRELOAD", INTERPOSER)
            .env(FILE_VAR, &path)
            .output()
            .unwrap();
        let calls = CHeap::open(&path).and_then(|heap| heap.read());
        std::fs::remove_file(&path).unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"counted\n");
        let calls = calls.unwrap();
        assert!(calls.0[0] > 0, "sh called malloc: {calls}");
    }

    #[test]
    fn a_file_no_interposer_mapped_is_refused() {
        let path = counter_file("unmapped");
        let err = CHeap::open(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(err.contains("interposer is not active"), "{err}");
    }
}
