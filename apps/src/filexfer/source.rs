//! The file `filexfer send` reads: opened without waiting (a FIFO, or a
//! device that would block in open, is refused rather than waited on),
//! and checked unchanged once every chunk was read — a file that was
//! written to meanwhile would arrive torn, a mix of old and new bytes
//! whose digest the sender computed from what it read.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{ensure, Context as _};
use rustix::fs::OFlags;

/// What a write to a file changes: its size, its modification and its
/// status-change times (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// An open regular file to send, and what it looked like when opened.
#[derive(Debug)]
pub struct Source {
    path: PathBuf,
    file: Arc<File>,
    stamp: Stamp,
}

impl Source {
    /// Opens `path` for reading, which must be a regular file. The open
    /// itself never waits (`O_NONBLOCK`: a FIFO without a writer would
    /// block it); a regular file ignores the flag when read.
    pub fn open(path: &Path) -> anyhow::Result<Source> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags((OFlags::NONBLOCK | OFlags::NOCTTY).bits() as i32)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let meta = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?;
        ensure!(meta.is_file(), "{}: not a regular file", path.display());
        Ok(Source {
            path: path.to_owned(),
            stamp: Stamp::of(&meta),
            file: Arc::new(file),
        })
    }

    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.stamp.len
    }

    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Fails if the file's size, modification or status-change time moved
    /// since it was opened: what was read may mix two versions.
    pub fn check_unchanged(&self) -> anyhow::Result<()> {
        let now = self
            .file
            .metadata()
            .with_context(|| format!("reading {}", self.path.display()))?;
        ensure!(
            Stamp::of(&now) == self.stamp,
            "{} changed while it was sent (its size, modification or status-change time moved): the server keeps nothing; send it again once it is complete",
            self.path.display()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use pinpoll_testkit::Scratch;

    use super::*;
    use std::io::Write as _;
    use std::os::unix::fs::FileExt as _;

    #[test]
    fn a_fifo_is_refused_at_once() {
        let scratch = Scratch::new("fifo");
        let dir = scratch.path().to_owned();
        let fifo = dir.join("pipe");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let (tx, rx) = std::sync::mpsc::channel();
        let opening = fifo.clone();
        std::thread::spawn(move || tx.send(Source::open(&opening).map(|_| ())));
        let opened = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("opening a FIFO without a writer returned");
        let err = opened.unwrap_err();
        assert!(
            err.to_string().ends_with("pipe: not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn a_write_or_an_append_after_the_open_is_seen() {
        let scratch = Scratch::new("changed");
        let dir = scratch.path().to_owned();
        let path = dir.join("f.bin");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let source = Source::open(&path).unwrap();
        assert_eq!(source.size(), 4096);
        source.check_unchanged().unwrap();
        // Same size, bytes rewritten in place.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"new", 100).unwrap();
        let err = source.check_unchanged().unwrap_err();
        assert!(
            err.to_string().contains("changed while it was sent"),
            "{err}"
        );
        // An append.
        let source = Source::open(&path).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"more")
            .unwrap();
        assert!(source.check_unchanged().is_err());
    }
}
