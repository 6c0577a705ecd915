//! How much of `--dir`'s file system one transfer may take: at most
//! `--max-size` (finite by default), and never so much that less than
//! `--min-free` would stay free. A native transfer's size is checked and
//! reserved (`fallocate`) before any data moves, under one lock per
//! server, so two transfers never count the same free bytes; a classic
//! transfer (no size in advance) is cut off at its cap while it arrives.

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rustix::io::Errno;

use crate::filexfer::server_dir::ServerDir;

/// The default `--max-size`: 64 GiB.
pub const DEFAULT_MAX_SIZE: u64 = 64 << 30;
/// The default `--min-free` is this fraction of the file system's size...
pub const DEFAULT_MIN_FREE_DIVISOR: u64 = 20;
/// ...but never more than 1 GiB.
pub const DEFAULT_MIN_FREE_CAP: u64 = 1 << 30;

/// Why a transfer cannot have its space.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpaceRefusal {
    #[error("{name} is {size} bytes, more than the server takes (--max-size {max})")]
    TooLarge { name: String, size: u64, max: u64 },
    #[error("no space left on the server for {name} (ENOSPC): it is {size} bytes, the server's directory has {free} bytes free and keeps {keep} of them free (--min-free)")]
    NoSpace {
        name: String,
        size: u64,
        free: u64,
        keep: u64,
    },
    #[error("no space left on the server for {name} (ENOSPC): reserving its {size} bytes failed: {errno}")]
    ReserveFull {
        name: String,
        size: u64,
        errno: Errno,
    },
    #[error("reserving {size} bytes for {name} on the server: {errno}")]
    Reserve {
        name: String,
        size: u64,
        errno: Errno,
    },
}

/// The free space of a file system and its size, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// What an unprivileged process can still write.
    pub free: u64,
    pub total: u64,
}

/// The usage of the file system `dir` is on, if statvfs says.
pub fn usage(dir: &Path) -> Option<Usage> {
    usage_of(rustix::fs::statvfs(dir))
}

/// The usage of the server's directory's file system (the directory it
/// holds open, wherever its path leads now), if fstatvfs says.
pub fn usage_at(dir: &ServerDir) -> Option<Usage> {
    usage_of(rustix::fs::fstatvfs(dir))
}

fn usage_of(vfs: rustix::io::Result<rustix::fs::StatVfs>) -> Option<Usage> {
    match vfs {
        Ok(vfs) => Some(Usage {
            free: vfs.f_bavail.saturating_mul(vfs.f_frsize),
            total: vfs.f_blocks.saturating_mul(vfs.f_frsize),
        }),
        Err(e) => {
            tracing::debug!(error = %e, "statvfs of --dir");
            None
        }
    }
}

/// One server's rules for space, shared by its transfers.
#[derive(Debug, Clone)]
pub struct Space {
    max_size: u64,
    /// `--min-free`; `None`: the default share of the file system.
    min_free: Option<u64>,
    /// Held from a transfer's free-space check to its reservation.
    reserving: Arc<Mutex<()>>,
}

impl Space {
    pub fn new(max_size: u64, min_free: Option<u64>) -> Space {
        Space {
            max_size,
            min_free,
            reserving: Arc::default(),
        }
    }

    /// The bytes that must stay free on a file system of `total` bytes.
    pub fn keep(&self, total: u64) -> u64 {
        self.min_free
            .unwrap_or((total / DEFAULT_MIN_FREE_DIVISOR).min(DEFAULT_MIN_FREE_CAP))
    }

    /// Refuses a file of `size` bytes named `name` (as shown) beyond
    /// `--max-size` or the free space less the margin, and otherwise
    /// reserves its size on `file` in `dir`. A file system without
    /// fallocate is written without the reservation; one whose usage
    /// cannot be read is bounded by `--max-size` alone.
    pub fn reserve(
        &self,
        dir: &ServerDir,
        file: &File,
        size: u64,
        name: &str,
    ) -> Result<(), SpaceRefusal> {
        self.check_size(size, name)?;
        let _one_at_a_time = self
            .reserving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(u) = usage_at(dir) {
            let keep = self.keep(u.total);
            if size.saturating_add(keep) > u.free {
                return Err(SpaceRefusal::NoSpace {
                    name: name.to_owned(),
                    size,
                    free: u.free,
                    keep,
                });
            }
        }
        fallocate(file, size, name)
    }

    /// Refuses a file of `size` bytes beyond `--max-size`.
    pub fn check_size(&self, size: u64, name: &str) -> Result<(), SpaceRefusal> {
        if size > self.max_size {
            return Err(SpaceRefusal::TooLarge {
                name: name.to_owned(),
                size,
                max: self.max_size,
            });
        }
        Ok(())
    }

    /// The most a classic transfer (no size in advance) may write into
    /// `dir`: `--max-size`, or less when the free space less the margin
    /// is less.
    pub fn classic_cap(&self, dir: &ServerDir) -> (u64, &'static str) {
        match usage_at(dir) {
            Some(u) if u.free.saturating_sub(self.keep(u.total)) < self.max_size => (
                u.free.saturating_sub(self.keep(u.total)),
                "the free space less --min-free",
            ),
            _ => (self.max_size, "--max-size"),
        }
    }
}

fn fallocate(file: &File, size: u64, name: &str) -> Result<(), SpaceRefusal> {
    if size == 0 {
        return Ok(());
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(e) if e == Errno::OPNOTSUPP || e == Errno::NOSYS => {
            tracing::debug!(error = %e, "no fallocate on this file system; writing without a reservation");
            Ok(())
        }
        Err(errno) if errno == Errno::NOSPC || errno == Errno::DQUOT => {
            Err(SpaceRefusal::ReserveFull {
                name: name.to_owned(),
                size,
                errno,
            })
        }
        Err(errno) => Err(SpaceRefusal::Reserve {
            name: name.to_owned(),
            size,
            errno,
        }),
    }
}

#[cfg(test)]
mod tests {
    use pinpoll_testkit::Scratch;

    use super::*;

    #[test]
    fn the_default_margin_is_a_twentieth_of_the_file_system_at_most_a_gib() {
        let space = Space::new(DEFAULT_MAX_SIZE, None);
        assert_eq!(space.keep(1 << 30), (1 << 30) / 20);
        assert_eq!(space.keep(1 << 40), 1 << 30);
        assert_eq!(Space::new(1, Some(7)).keep(1 << 40), 7);
    }

    #[test]
    fn a_size_that_would_leave_less_than_the_margin_is_refused_and_nothing_reserved() {
        let scratch = Scratch::new("margin");
        let dir = ServerDir::open(scratch.path()).unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let u = usage_at(&dir).expect("statvfs of a temp dir");
        let space = Space::new(u64::MAX, None);
        let keep = space.keep(u.total);
        // All the free space, as a hostile client would announce it.
        let refused = space.reserve(&dir, &file, u.free, "all.bin").unwrap_err();
        assert!(
            matches!(refused, SpaceRefusal::NoSpace { size, keep: k, .. } if size == u.free && k == keep),
            "{refused}"
        );
        assert!(refused.to_string().contains("(--min-free)"), "{refused}");
        assert_eq!(file.metadata().unwrap().len(), 0, "nothing reserved");
        // A small file fits and is reserved.
        space.reserve(&dir, &file, 4096, "small.bin").unwrap();
        assert_eq!(file.metadata().unwrap().len(), 4096);
    }

    #[test]
    fn max_size_is_finite_by_default_and_comes_first() {
        let scratch = Scratch::new("max");
        let dir = ServerDir::open(scratch.path()).unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let space = Space::new(DEFAULT_MAX_SIZE, None);
        let refused = space
            .reserve(&dir, &file, DEFAULT_MAX_SIZE + 1, "big.bin")
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "big.bin is {} bytes, more than the server takes (--max-size {DEFAULT_MAX_SIZE})",
                DEFAULT_MAX_SIZE + 1
            )
        );
        let (cap, _) = space.classic_cap(&dir);
        assert!(cap <= DEFAULT_MAX_SIZE);
        let (cap, why) = Space::new(10, None).classic_cap(&dir);
        assert_eq!((cap, why), (10, "--max-size"));
    }
}
