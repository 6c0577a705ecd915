//! The server's directory (`--dir`), held open from start-up.
//!
//! The path is looked up once, when the server starts; from then on every
//! file the server creates, links, renames, removes, stats or syncs there
//! is named relative to this descriptor (`openat`, `linkat`, `renameat`,
//! `unlinkat`, `fstatvfs`, `fsync`). A `--dir` renamed away, or replaced
//! by a symbolic link to another directory, after the start changes
//! nothing: the server goes on writing into the directory it started
//! with, never through the link.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The server's directory: a descriptor of it, and its path as it was at
/// the start, only ever shown.
#[derive(Debug, Clone)]
pub struct ServerDir {
    fd: Arc<OwnedFd>,
    shown: Arc<Path>,
    /// Where this process's descriptors are linked from: `/proc`, or, in
    /// tests of a system without it, a path that does not exist.
    proc: Arc<Path>,
}

impl ServerDir {
    /// Opens the directory `path` names now. A path descriptor
    /// (`O_PATH`): it names the directory for the `*at` calls, `fstatvfs`
    /// and `fstat` without needing read permission, so a write-only drop
    /// directory (mode 0300) serves as it always did.
    pub fn open(path: &Path) -> io::Result<ServerDir> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(ServerDir {
            fd: Arc::new(fd),
            shown: path.into(),
            proc: Path::new("/proc").into(),
        })
    }

    /// The same directory, as a server on a system whose procfs is at
    /// `proc` (none, if nothing is there) sees it: for tests of the paths
    /// taken without /proc, which cannot unmount it.
    #[cfg(test)]
    pub fn with_proc(mut self, proc: &Path) -> ServerDir {
        self.proc = proc.into();
        self
    }

    /// Where this process's procfs is mounted, if it is.
    pub fn proc(&self) -> &Path {
        &self.proc
    }

    /// The directory's path as it was at the start: for messages only.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// What `name` in the directory is, never following a link; `None`
    /// if nothing has that name.
    pub fn entry(&self, name: &str) -> io::Result<Option<FileType>> {
        match rustix::fs::statat(self.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The directory opened for reading, relative to the held descriptor
    /// (never by its path): to list its entries, or to fsync it. Needs
    /// read permission on the directory.
    pub fn reader(&self) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            self.as_fd(),
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// Makes the directory's entries durable.
    pub fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::fsync(self.reader()?)?)
    }
}

impl AsFd for ServerDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use pinpoll_testkit::Scratch;

    use super::*;

    #[test]
    fn entries_are_seen_without_following_links() {
        let scratch = Scratch::new("serverdir");
        let dir = ServerDir::open(scratch.path()).unwrap();
        std::fs::write(scratch.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("/", scratch.path().join("l")).unwrap();
        assert_eq!(dir.entry("f").unwrap(), Some(FileType::RegularFile));
        assert_eq!(dir.entry("l").unwrap(), Some(FileType::Symlink));
        assert_eq!(dir.entry("none").unwrap(), None);
        dir.sync().unwrap();
        assert_eq!(dir.path(), scratch.path());
    }
}
