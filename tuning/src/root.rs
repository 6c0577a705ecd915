//! [`SystemRoot`]: where `/sys` and `/proc` are read from. `/` in
//! production; a fixture tree in tests. Every read names the file and the
//! reason when it fails, so a check can say "cannot read X: reason".

use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

/// A root directory that system paths (`/sys/...`, `/proc/...`) resolve under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemRoot {
    dir: PathBuf,
}

/// A failed read of a system file: which file, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// The path as read (under the root).
    pub path: String,
    pub kind: io::ErrorKind,
    pub reason: String,
}

impl ReadError {
    fn new(path: &Path, err: &io::Error) -> ReadError {
        ReadError {
            path: path.display().to_string(),
            kind: err.kind(),
            reason: io_reason(err),
        }
    }

    /// The file (or a directory on its path) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.kind == io::ErrorKind::NotFound
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot read {}: {}", self.path, self.reason)
    }
}

impl std::error::Error for ReadError {}

/// The OS's text for an error, without Rust's " (os error N)" suffix.
fn io_reason(err: &io::Error) -> String {
    let text = err.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

impl SystemRoot {
    /// The running system.
    pub fn host() -> SystemRoot {
        SystemRoot {
            dir: PathBuf::from("/"),
        }
    }

    /// A tree laid out like `/` (tests, `--root`).
    pub fn new(dir: impl Into<PathBuf>) -> SystemRoot {
        SystemRoot { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether this is the running system's `/` (verbs queries only make
    /// sense then).
    pub fn is_host(&self) -> bool {
        self.dir == Path::new("/")
    }

    /// `abs` (e.g. `/proc/cmdline`) under the root.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.dir.join(abs.trim_start_matches('/'))
    }

    /// The whole file.
    pub fn read(&self, abs: &str) -> Result<String, ReadError> {
        let path = self.path(abs);
        std::fs::read_to_string(&path).map_err(|e| ReadError::new(&path, &e))
    }

    /// The file's contents without surrounding whitespace (sysfs values).
    pub fn read_trim(&self, abs: &str) -> Result<String, ReadError> {
        self.read(abs).map(|s| s.trim().to_owned())
    }

    /// A number in a sysfs file.
    pub fn read_u64(&self, abs: &str) -> Result<u64, ReadError> {
        let text = self.read_trim(abs)?;
        text.parse().map_err(|_| ReadError {
            path: self.path(abs).display().to_string(),
            kind: io::ErrorKind::InvalidData,
            reason: format!("{text:?} is not a number"),
        })
    }

    /// The names in a directory, sorted (numerically where they are numbers).
    pub fn list(&self, abs: &str) -> Result<Vec<String>, ReadError> {
        let path = self.path(abs);
        let entries = std::fs::read_dir(&path).map_err(|e| ReadError::new(&path, &e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ReadError::new(&path, &e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)).then_with(|| a.cmp(b)));
        Ok(names)
    }

    /// Whether anything (even a dangling symlink) is at `abs`.
    pub fn exists(&self, abs: &str) -> bool {
        std::fs::symlink_metadata(self.path(abs)).is_ok()
    }

    /// Where the symlink at `abs` points, as written.
    pub fn read_link(&self, abs: &str) -> Result<PathBuf, ReadError> {
        let path = self.path(abs);
        std::fs::read_link(&path).map_err(|e| ReadError::new(&path, &e))
    }

    /// `abs` with every symlink resolved, as a path inside the root
    /// (`/sys/devices/virtual/infiniband/rxe0`). Symlinks in fixture trees
    /// must be relative, as sysfs's are.
    pub fn canonical(&self, abs: &str) -> Result<String, ReadError> {
        let path = self.path(abs);
        let real = std::fs::canonicalize(&path).map_err(|e| ReadError::new(&path, &e))?;
        let base = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        let inside = real.strip_prefix(&base).map_err(|_| ReadError {
            path: path.display().to_string(),
            kind: io::ErrorKind::InvalidData,
            reason: format!("resolves to {} outside the root", real.display()),
        })?;
        let mut out = String::new();
        for part in inside.components() {
            if let Component::Normal(p) = part {
                out.push('/');
                out.push_str(&p.to_string_lossy());
            }
        }
        if out.is_empty() {
            out.push('/');
        }
        Ok(out)
    }
}

/// Sort key that orders `state10` after `state2` and `10` after `9`.
fn natural_key(s: &str) -> (String, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, num) = s.split_at(s.len() - digits);
    (stem.to_owned(), num.parse().unwrap_or(0))
}

/// The last component of a path.
pub fn basename(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_sort_naturally_and_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("pinpoll-tune-root-{}", std::process::id()));
        for name in ["state10", "state2", "9", "10", "a"] {
            std::fs::create_dir_all(dir.join("d").join(name)).unwrap();
        }
        let root = SystemRoot::new(&dir);
        assert_eq!(
            root.list("/d").unwrap(),
            ["9", "10", "a", "state2", "state10"]
        );
        let err = root.read("/d/state2").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("cannot read {}/d/state2: Is a directory", dir.display())
        );
        assert!(root.read("/nope").unwrap_err().is_not_found());
        assert_eq!(basename("/sys/devices/virtual/infiniband/rxe0"), "rxe0");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
