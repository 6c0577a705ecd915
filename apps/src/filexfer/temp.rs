//! The server's temporary files: where a transfer is written until it is
//! verified, and how one left behind by a server that died is found.
//!
//! A temp file is named `.filexfer-PID-SERIAL.tmp` (client names cannot
//! start with the reserved prefix) and holds an exclusive `flock` for as
//! long as its server lives. The kernel drops the lock when the process
//! dies, however it dies (SIGKILL included), so at start-up a temp file
//! whose lock can be taken, and whose PID is no process on this host, is
//! an orphan and is removed. The two tests guard each other: the lock
//! covers a reused PID, and the PID covers the instant between a live
//! server creating its file and locking it. Both hold across servers of
//! one directory on this host; a shared network directory relies on the
//! lock alone.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

use crate::filexfer::name::RESERVED_PREFIX;

/// A temporary file in the server's directory, locked while it exists and
/// removed on drop unless [`TempFile::renamed`] says it took another name.
pub struct TempFile {
    path: PathBuf,
    file: File,
    renamed: bool,
}

impl TempFile {
    /// Creates (never opens an existing) `.filexfer-PID-SERIAL.tmp` in
    /// `dir` and locks it.
    pub fn create(dir: &Path, serial: u64) -> io::Result<TempFile> {
        let path = dir.join(format!(
            "{RESERVED_PREFIX}{}-{serial}.tmp",
            std::process::id()
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        let temp = TempFile {
            path,
            file,
            renamed: false,
        };
        flock(&temp.file, FlockOperation::NonBlockingLockExclusive)?;
        Ok(temp)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }

    /// The file was renamed into place: there is no temp name to remove.
    pub fn renamed(&mut self) {
        self.renamed = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.renamed {
            if let Err(err) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %err, "removing the temporary file failed");
            }
        }
    }
}

/// Removes the temp files in `dir` that no live server holds (see the
/// module docs) and returns their names. A file that cannot be checked is
/// left alone.
pub fn remove_orphans(dir: &Path) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = owner_pid(name) else { continue };
        if pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        // Not a symlink or anything else a client could have planted:
        // names with the prefix are refused on the wire, but be sure.
        match entry.file_type() {
            Ok(t) if t.is_file() => {}
            _ => continue,
        }
        let Ok(file) = File::open(entry.path()) else {
            continue;
        };
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        std::fs::remove_file(entry.path())?;
        removed.push(name.to_owned());
    }
    removed.sort();
    Ok(removed)
}

/// The PID in a temp file's name `.filexfer-PID-SERIAL.tmp`.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(RESERVED_PREFIX)?.strip_suffix(".tmp")?;
    let (pid, serial) = rest.split_once('-')?;
    serial.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// The bytes an unprivileged process can still write to the file system
/// of `dir`, if statvfs says.
pub fn free_space(dir: &Path) -> Option<u64> {
    match rustix::fs::statvfs(dir) {
        Ok(vfs) => Some(vfs.f_bavail.saturating_mul(vfs.f_frsize)),
        Err(e) => {
            tracing::debug!(error = %e, "statvfs of --dir");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_temp_names_carry_an_owner() {
        assert_eq!(owner_pid(".filexfer-1234-0.tmp"), Some(1234));
        assert_eq!(owner_pid(".filexfer-1234-17.tmp"), Some(1234));
        for not in [
            ".filexfer-probe-1234",
            ".filexfer-1234.tmp",
            ".filexfer-x-1.tmp",
            ".filexfer-12-x.tmp",
            "filexfer-12-1.tmp",
            ".filexfer-12-1.tmpx",
            "data.bin",
        ] {
            assert_eq!(owner_pid(not), None, "{not}");
        }
    }

    #[test]
    fn orphans_are_removed_and_live_or_foreign_files_kept() {
        let dir = std::env::temp_dir().join(format!("pinpoll-temp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        // A dead owner: PID 0 is never a process's.
        let orphan = dir.join(".filexfer-0-3.tmp");
        std::fs::write(&orphan, b"partial").unwrap();
        // A live temp file of this process, and one of a live other
        // process (PID 1) that does not even hold the lock.
        let mine = TempFile::create(&dir, 9).unwrap();
        let foreign = dir.join(".filexfer-1-4.tmp");
        std::fs::write(&foreign, b"x").unwrap();
        // A dead PID whose file is still locked (a reused PID's file on
        // another host, say) is kept too.
        let locked = dir.join(".filexfer-0-5.tmp");
        std::fs::write(&locked, b"y").unwrap();
        let holder = File::open(&locked).unwrap();
        flock(&holder, FlockOperation::NonBlockingLockExclusive).unwrap();
        // Anything else is not ours to judge.
        std::fs::write(dir.join("data.bin"), b"z").unwrap();

        let removed = remove_orphans(&dir).unwrap();
        assert_eq!(removed, vec![".filexfer-0-3.tmp".to_owned()]);
        assert!(!orphan.exists());
        for kept in [mine.path(), &foreign, &locked, &dir.join("data.bin")] {
            assert!(kept.exists(), "{}", kept.display());
        }
        drop(holder);
        assert_eq!(
            remove_orphans(&dir).unwrap(),
            vec![".filexfer-0-5.tmp".to_owned()]
        );
        let path = mine.path().to_owned();
        drop(mine);
        assert!(!path.exists(), "a dropped temp file is removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
