//! The server's temporary files: where a transfer is written until it is
//! verified, and how one left behind by a server that died is found.
//!
//! A temp file is named `.filexfer-PID-NONCE-SERIAL.tmp` (client names
//! cannot start with the reserved prefix): NONCE is 64 random bits drawn
//! once per server, so no later server — not even one that gets the same
//! PID — can repeat a name a dead one left. It holds an exclusive `flock`
//! for as long as its server lives; where the file system allows, it is
//! created unnamed (`O_TMPFILE`), locked, and only then linked under its
//! name, so it is never seen unlocked. The kernel drops the lock when the
//! process dies, however it dies (SIGKILL included), so at start-up a temp
//! file whose lock can be taken is an orphan and is removed: the lock
//! alone decides, which also holds across hosts sharing a network
//! directory. Where `O_TMPFILE` is missing the file is locked right after
//! its exclusive create; a server starting in the same directory in that
//! instant may remove it, and that transfer then fails when it links the
//! file into place — it never stores a wrong file.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd};
use std::path::PathBuf;
use std::sync::OnceLock;

use rustix::fs::{flock, AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::filexfer::name::RESERVED_PREFIX;
use crate::filexfer::server_dir::ServerDir;

/// A temporary file in the server's directory, locked while it exists and
/// removed on drop unless [`TempFile::rename_as`] gave it another name.
pub struct TempFile {
    dir: ServerDir,
    name: String,
    file: File,
    /// The mode the file gets once in place; until then it is 0600.
    mode: Mode,
    renamed: bool,
}

/// The temp name of a file is no longer the file the server wrote:
/// something with write access to the directory gave the name to another
/// file.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0} in the server's directory is no longer the file the server wrote (something replaced it)"
)]
pub struct Replaced(pub String);

/// The temp name of a file was removed while the file was written (by a
/// server starting in the same directory in the instant after the file
/// was created, where `O_TMPFILE` is missing, or by hand), so the file
/// cannot be linked into place.
#[derive(Debug, thiserror::Error)]
#[error(
    "its temporary file was removed from the server's directory during the transfer (by another server starting there, or by hand); nothing was kept: send it again"
)]
pub struct TempRemoved;

/// A rename over the target (`--overwrite`, where the file system cannot
/// exchange two names) took a file another process swapped in under the
/// temp name: the target's previous content is gone.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0} on the server was replaced by a file this server did not write (something swapped it in under the temporary name); its previous content is gone"
)]
pub struct ReplacedByAnother(pub String);

/// With `--overwrite`, a file another process swapped in under the temp
/// name was exchanged with the target and exchanged back: the target is
/// as it was.
#[derive(Debug, thiserror::Error)]
#[error(
    "something swapped another file in under the temporary name of {0}; the upload was not kept and {0} on the server was left as it was"
)]
pub struct SwappedBack(pub String);

/// The mode a file stored by this server gets: what creating it with 0666
/// under the process's umask gives, as before temp files were private.
pub fn stored_mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| Mode::from_bits_truncate(0o666) & !umask())
}

/// The process's umask, read where it can be without changing it.
fn umask() -> Mode {
    let from_status = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
            u32::from_str_radix(line.trim(), 8).ok()
        });
    match from_status {
        Some(mask) => Mode::from_bits_truncate(mask),
        None => {
            // Without /proc it can only be set and set back. Meanwhile
            // (the server's start-up, before any transfer) it is the
            // strictest there is, so nothing is created more open.
            let mask = rustix::process::umask(Mode::from_bits_truncate(0o077));
            rustix::process::umask(mask);
            mask
        }
    }
}

/// A temp file's mode until it is in place.
const PRIVATE: Mode = Mode::RUSR.union(Mode::WUSR);

/// This server's NONCE (see the module docs).
fn nonce() -> io::Result<u64> {
    static NONCE: OnceLock<u64> = OnceLock::new();
    if let Some(n) = NONCE.get() {
        return Ok(*n);
    }
    let drawn = pinpoll_appkit::random_u64()?;
    Ok(*NONCE.get_or_init(|| drawn))
}

/// The name of this server's temp file number `serial`.
pub fn temp_name(serial: u64) -> io::Result<String> {
    Ok(format!(
        "{RESERVED_PREFIX}{}-{:016x}-{serial}.tmp",
        std::process::id(),
        nonce()?
    ))
}

impl TempFile {
    /// Creates (never opens an existing) this server's temp file number
    /// `serial` in `dir`, locked before anyone can see it where the file
    /// system allows.
    pub fn create(dir: &ServerDir, serial: u64) -> io::Result<TempFile> {
        Self::create_for(dir, serial, stored_mode())
    }

    /// As [`TempFile::create`], for a file that gets `mode` once in place;
    /// until then no one but this process's user can open it (to rewrite
    /// bytes after they were verified), whatever the umask.
    pub fn create_for(dir: &ServerDir, serial: u64, mode: Mode) -> io::Result<TempFile> {
        let name = temp_name(serial)?;
        let file = match create_locked_unnamed(dir, &name) {
            Ok(file) => file,
            Err(e) if unnamed_unsupported(e) => {
                let fd = rustix::fs::openat(
                    dir,
                    name.as_str(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    PRIVATE,
                )?;
                let temp = TempFile {
                    dir: dir.clone(),
                    name,
                    file: File::from(fd),
                    mode,
                    renamed: false,
                };
                flock(&temp.file, FlockOperation::NonBlockingLockExclusive)?;
                return Ok(temp);
            }
            Err(e) => return Err(e.into()),
        };
        Ok(TempFile {
            dir: dir.clone(),
            name,
            file,
            mode,
            renamed: false,
        })
    }

    /// Where the temp file is, as the server's directory was named at the
    /// start: for messages (and tests) only.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join(&self.name)
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }

    /// Links the file this server wrote — by its descriptor, not by its
    /// temp name, which anything with write access to the directory may
    /// have given to another file meanwhile — as `target` in the server's
    /// directory; fails if `target` exists. Without /proc the temp name is
    /// linked, and `target` checked after: a file swapped in under the
    /// temp name at that instant is removed again and the link fails
    /// ([`Replaced`]), never taken for the one written.
    pub fn link_as(&self, target: &str) -> io::Result<()> {
        match link_fd(&self.file, &self.dir, target) {
            Ok(()) => {}
            Err(Errno::NOENT) if !proc_fds(&self.dir) => {
                self.check(&self.name)?;
                rustix::fs::linkat(
                    &self.dir,
                    self.name.as_str(),
                    &self.dir,
                    target,
                    AtFlags::empty(),
                )
                .map_err(|e| self.removed(e))?;
                if self.check(target).is_err() {
                    self.unlink_if_not_held(target);
                    return Err(io::Error::other(Replaced(self.name.clone())));
                }
            }
            Err(e) => return Err(self.removed(e)),
        }
        self.widen();
        Ok(())
    }

    /// Puts the file this server wrote in place as `target`, replacing
    /// the regular file there (`--overwrite`): exchanges the two names
    /// (`renameat2` with `RENAME_EXCHANGE`, one step) once the temp name
    /// is checked to still name the file written, and checks `target`
    /// after. A file another process swapped in under the temp name at
    /// that instant is exchanged back, so the target keeps its content
    /// ([`SwappedBack`]). The old target is left under the temp name, and
    /// removed with it. Where the file system cannot exchange names, a
    /// rename, after which such a swap can only be reported
    /// ([`ReplacedByAnother`]); a target removed meanwhile is linked anew.
    pub fn rename_as(&mut self, target: &str) -> io::Result<()> {
        use rustix::fs::RenameFlags;
        self.check(&self.name)?;
        let exchanged = rustix::fs::renameat_with(
            &self.dir,
            self.name.as_str(),
            &self.dir,
            target,
            RenameFlags::EXCHANGE,
        );
        match exchanged {
            Ok(()) => {}
            Err(Errno::NOENT) => return self.link_as(target),
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => return self.rename_over(target),
            Err(e) => return Err(e.into()),
        }
        if self.check(target).is_err() {
            rustix::fs::renameat_with(
                &self.dir,
                self.name.as_str(),
                &self.dir,
                target,
                RenameFlags::EXCHANGE,
            )
            .map_err(|_| io::Error::other(ReplacedByAnother(target.to_owned())))?;
            // Exchanged back: the target is the file it was before — or,
            // if the swapping went on meanwhile, the one this server wrote.
            return match self.check(target) {
                Ok(()) => {
                    self.widen();
                    Ok(())
                }
                Err(_) => Err(io::Error::other(SwappedBack(target.to_owned()))),
            };
        }
        self.widen();
        Ok(())
    }

    /// A rename of the temp name over `target`, for file systems that
    /// cannot exchange names.
    fn rename_over(&mut self, target: &str) -> io::Result<()> {
        rustix::fs::renameat(&self.dir, self.name.as_str(), &self.dir, target)?;
        self.renamed = true;
        self.check(target)
            .map_err(|_| io::Error::other(ReplacedByAnother(target.to_owned())))?;
        self.widen();
        Ok(())
    }

    /// Gives the file in place its [`stored_mode`]. A failure leaves it
    /// readable by this server's user alone, which is logged, not failed:
    /// the file is stored and verified.
    fn widen(&self) {
        if let Err(e) = rustix::fs::fchmod(&self.file, self.mode) {
            tracing::warn!(path = %self.path().display(), error = %e, mode = format!("{:o}", self.mode.bits()), "setting the stored file's mode failed; it stays 0600");
        }
    }

    /// A link that found no file: the temp name (or the file behind the
    /// descriptor) was removed meanwhile.
    fn removed(&self, e: Errno) -> io::Error {
        match e {
            Errno::NOENT => io::Error::new(io::ErrorKind::NotFound, TempRemoved),
            e => e.into(),
        }
    }

    /// Removes `name` unless it is the file this server holds: what a
    /// link by name took in place of it.
    fn unlink_if_not_held(&self, name: &str) {
        let (Ok(held), Ok(named)) = (
            rustix::fs::fstat(&self.file),
            rustix::fs::statat(&self.dir, name, AtFlags::SYMLINK_NOFOLLOW),
        ) else {
            return;
        };
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino) {
            if let Err(e) = rustix::fs::unlinkat(&self.dir, name, AtFlags::empty()) {
                tracing::warn!(name, error = %e, "removing a file linked in place of the one written");
            }
        }
    }

    /// Fails with [`Replaced`] unless `name` in the directory is the file
    /// this server holds.
    fn check(&self, name: &str) -> io::Result<()> {
        let held = rustix::fs::fstat(&self.file)?;
        let named = match rustix::fs::statat(&self.dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) if name == self.name => {
                return Err(io::Error::new(io::ErrorKind::NotFound, TempRemoved))
            }
            named => named?,
        };
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino) {
            return Err(io::Error::other(Replaced(name.to_owned())));
        }
        Ok(())
    }
}

/// Creates an unnamed file in `dir` (`O_TMPFILE`), locks it, and links it
/// as `name` (failing if that exists).
fn create_locked_unnamed(dir: &ServerDir, name: &str) -> Result<File, Errno> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        PRIVATE,
    )?;
    flock(&fd, FlockOperation::NonBlockingLockExclusive)?;
    link_fd(&fd, dir, name)?;
    Ok(File::from(fd))
}

/// Links the file open as `fd` as `name` in `dir`. Through /proc, which
/// needs no privilege (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH).
fn link_fd(fd: &impl AsFd, dir: &ServerDir, name: &str) -> Result<(), Errno> {
    let by_fd = dir
        .proc()
        .join(format!("self/fd/{}", fd.as_fd().as_raw_fd()));
    rustix::fs::linkat(rustix::fs::CWD, &by_fd, dir, name, AtFlags::SYMLINK_FOLLOW)
}

/// Whether this process sees its descriptors in /proc.
fn proc_fds(dir: &ServerDir) -> bool {
    dir.proc().join("self/fd").is_dir()
}

/// Whether creating an unnamed file failed only because this system
/// cannot (no `O_TMPFILE` in the file system or kernel, no /proc).
fn unnamed_unsupported(e: Errno) -> bool {
    [
        Errno::OPNOTSUPP,
        Errno::ISDIR,
        Errno::INVAL,
        Errno::NOENT,
        Errno::NOSYS,
    ]
    .contains(&e)
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.renamed {
            if let Err(err) = rustix::fs::unlinkat(&self.dir, self.name.as_str(), AtFlags::empty())
            {
                tracing::warn!(path = %self.path().display(), error = %err, "removing the temporary file failed");
            }
        }
    }
}

/// What [`remove_orphans`] did.
#[derive(Debug, Default)]
pub struct Orphans {
    /// The names removed, sorted.
    pub removed: Vec<String>,
    /// The orphans that could not be removed, and why; the others were
    /// removed all the same.
    pub failed: Vec<(String, io::Error)>,
}

/// Removes the temp files in `dir` whose lock is free (see the module
/// docs). A name with the temp files' pattern that is not a regular file
/// (a link, a FIFO, a directory — planted, or swapped in meanwhile) is
/// never opened through, never waited on, and left alone; an error with
/// one file does not stop the others.
pub fn remove_orphans(dir: &ServerDir) -> io::Result<Orphans> {
    let mut orphans = Orphans::default();
    for entry in rustix::fs::Dir::read_from(dir.reader()?)? {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                orphans
                    .failed
                    .push((String::from("(a directory entry)"), e.into()));
                continue;
            }
        };
        let Some(name) = entry.file_name().to_str().ok().filter(|n| is_temp_name(n)) else {
            continue;
        };
        match remove_if_orphan(dir, name) {
            Ok(true) => orphans.removed.push(name.to_owned()),
            Ok(false) => {}
            Err(e) => orphans.failed.push((name.to_owned(), e)),
        }
    }
    orphans.removed.sort();
    Ok(orphans)
}

/// Removes `name` in `dir` if it is a regular file whose lock is free;
/// whether it did. Opened without following a link and without waiting
/// (a FIFO), and removed only if the name still is the file that was
/// checked.
fn remove_if_orphan(dir: &ServerDir, name: &str) -> io::Result<bool> {
    let fd: OwnedFd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        // Gone meanwhile, or a symbolic link (O_NOFOLLOW): not ours.
        Err(Errno::NOENT | Errno::LOOP) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let meta = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(meta.st_mode) != rustix::fs::FileType::RegularFile {
        return Ok(false);
    }
    if let Err(e) = flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        return match e {
            // Held: a live server's file.
            Errno::WOULDBLOCK => Ok(false),
            e => Err(e.into()),
        };
    }
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(now) if (now.st_dev, now.st_ino) == (meta.st_dev, meta.st_ino) => {}
        Ok(_) | Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `name` is a temp file's: `.filexfer-PID-NONCE-SERIAL.tmp`, or
/// `.filexfer-PID-SERIAL.tmp` of servers before the nonce.
fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name
        .strip_prefix(RESERVED_PREFIX)
        .and_then(|r| r.strip_suffix(".tmp"))
    else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    let digits = |p: &str, radix: u32| !p.is_empty() && p.chars().all(|c| c.is_digit(radix));
    match parts.as_slice() {
        [pid, serial] => digits(pid, 10) && digits(serial, 10),
        [pid, nonce, serial] => digits(pid, 10) && digits(nonce, 16) && digits(serial, 10),
        _ => false,
    }
}

/// Makes the directory entry of a file just linked into place in `dir`
/// durable. A failure is said as what it is: the file is in place,
/// verified and its data durable; only its name may not survive a power
/// loss.
pub fn sync_dir_after_link(dir: &ServerDir, shown: &str) -> Result<(), String> {
    dir_synced(dir.sync(), shown)
}

fn dir_synced(synced: io::Result<()>, shown: &str) -> Result<(), String> {
    synced.map_err(|e| {
        format!(
            "{shown} is in place on the server with its data verified and durable, \
             but the fsync of the server's directory failed ({e}): after a power loss \
             the file may be missing"
        )
    })
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::path::Path;

    use pinpoll_testkit::Scratch;

    use super::*;

    fn open(dir: &Path) -> ServerDir {
        ServerDir::open(dir).unwrap()
    }

    #[test]
    fn only_temp_names_are_candidates() {
        for name in [
            ".filexfer-1234-0.tmp",
            ".filexfer-1234-17.tmp",
            ".filexfer-1234-00ff00ff00ff00ff-3.tmp",
            &temp_name(5).unwrap(),
        ] {
            assert!(is_temp_name(name), "{name}");
        }
        for not in [
            ".filexfer-probe-1234",
            ".filexfer-1234.tmp",
            ".filexfer-x-1.tmp",
            ".filexfer-12-x.tmp",
            ".filexfer-12-zz-1.tmp",
            ".filexfer-12-ab-1-2.tmp",
            "filexfer-12-1.tmp",
            ".filexfer-12-1.tmpx",
            "data.bin",
        ] {
            assert!(!is_temp_name(not), "{not}");
        }
    }

    #[test]
    fn no_restart_repeats_a_name() {
        let name = temp_name(0).unwrap();
        let own = format!("{RESERVED_PREFIX}{}-0.tmp", std::process::id());
        assert_ne!(name, own, "the name of a server before the nonce, same PID");
        assert!(name.starts_with(&format!("{RESERVED_PREFIX}{}-", std::process::id())));
        // A file planted under this very PID and serial does not stop a
        // temp file from being created.
        let scratch = Scratch::new("reuse");
        let dir = scratch.path().to_owned();
        std::fs::write(dir.join(&own), b"left by a dead server of this PID").unwrap();
        let temp = TempFile::create(&open(&dir), 0).unwrap();
        assert_eq!(temp.path(), dir.join(&name));
        drop(temp);
    }

    #[test]
    fn the_lock_alone_decides_what_is_an_orphan() {
        let scratch = Scratch::new("orphans");
        let dir = scratch.path().to_owned();
        // Unlocked: of this very PID (a dead server whose PID came back),
        // of a live other process (PID 1), of a dead one (PID 0).
        let unlocked = [
            format!(".filexfer-{}-0.tmp", std::process::id()),
            ".filexfer-1-4.tmp".to_owned(),
            ".filexfer-0-00000000deadbeef-3.tmp".to_owned(),
        ];
        for name in &unlocked {
            std::fs::write(dir.join(name), b"partial").unwrap();
        }
        // Locked: this server's live file, and a dead PID's file whose
        // lock someone holds (a server on another host, say).
        let mine = TempFile::create(&open(&dir), 9).unwrap();
        let locked = dir.join(".filexfer-0-5.tmp");
        std::fs::write(&locked, b"y").unwrap();
        let holder = File::open(&locked).unwrap();
        flock(&holder, FlockOperation::NonBlockingLockExclusive).unwrap();
        // Anything else is not ours to judge.
        std::fs::write(dir.join("data.bin"), b"z").unwrap();

        let orphans = remove_orphans(&open(&dir)).unwrap();
        let mut want = unlocked.to_vec();
        want.sort();
        assert_eq!(orphans.removed, want);
        assert!(orphans.failed.is_empty(), "{:?}", orphans.failed);
        for kept in [&mine.path(), &locked, &dir.join("data.bin")] {
            assert!(kept.exists(), "{}", kept.display());
        }
        drop(holder);
        assert_eq!(
            remove_orphans(&open(&dir)).unwrap().removed,
            vec![".filexfer-0-5.tmp".to_owned()]
        );
        let path = mine.path();
        drop(mine);
        assert!(!path.exists(), "a dropped temp file is removed");
    }

    /// A FIFO or a symbolic link under a temp file's name — planted, or
    /// swapped in between the directory listing and the open — is never
    /// opened through and never waited on, and a name that vanishes
    /// meanwhile stops nothing: every round removes the plain orphan too.
    /// Sixteen names each swap (rename with RENAME_EXCHANGE, one system
    /// call) between a regular file and a FIFO or a link to one, as fast
    /// as they can.
    #[test]
    fn a_fifo_or_link_swapped_in_is_never_followed_or_waited_on() {
        const NAMES: usize = 16;
        let scratch = Scratch::new("swap");
        let dir = scratch.path().to_owned();
        let fifo = dir.join("outside-fifo");
        let fifo_at = |path: &Path| {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                path,
                rustix::fs::FileType::Fifo,
                Mode::from_bits_truncate(0o600),
                0,
            )
            .unwrap()
        };
        fifo_at(&fifo);
        let names: Vec<PathBuf> = (0..NAMES)
            .map(|i| dir.join(format!(".filexfer-0-7{i}.tmp")))
            .collect();
        let alts: Vec<PathBuf> = (0..NAMES).map(|i| dir.join(format!("alt-{i}"))).collect();
        for (i, alt) in alts.iter().enumerate() {
            if i % 2 == 0 {
                fifo_at(alt);
            } else {
                std::os::unix::fs::symlink(&fifo, alt).unwrap();
            }
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (name, alt) in names.iter().zip(&alts) {
                        let swapped = rustix::fs::renameat_with(
                            rustix::fs::CWD,
                            name,
                            rustix::fs::CWD,
                            alt,
                            rustix::fs::RenameFlags::EXCHANGE,
                        );
                        if swapped.is_err() {
                            // Removed as an orphan (or its FIFO half
                            // was): a regular file takes its place.
                            let _ = std::fs::write(name, b"orphan");
                            if !alt.exists() {
                                fifo_at(alt);
                            }
                        }
                    }
                }
            });
            let remover = s.spawn(|| {
                for round in 0..2000 {
                    let plain = dir.join(format!(".filexfer-0-{round}00.tmp"));
                    std::fs::write(&plain, b"orphan").unwrap();
                    let orphans = remove_orphans(&open(&dir)).unwrap();
                    assert!(
                        orphans.failed.is_empty(),
                        "round {round}: {:?}",
                        orphans.failed
                    );
                    assert!(!plain.exists(), "round {round}: the plain orphan stayed");
                }
                tx.send(()).unwrap();
            });
            let finished = rx.recv_timeout(std::time::Duration::from_secs(60));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            if finished.is_err() {
                // Unblock a remover stuck in open(2) on a FIFO — again
                // and again, as the listing it works through may hold
                // more — so the test fails rather than hangs.
                while !remover.is_finished() {
                    for path in names.iter().chain(&alts).chain([&fifo]) {
                        let _ = OpenOptions::new()
                            .write(true)
                            .custom_flags(libc_o_nonblock())
                            .open(path);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                let _ = remover.join();
                panic!(
                    "remove_orphans did not finish 2000 rounds within 60 s: it waited on a FIFO"
                );
            }
            remover.join().unwrap();
        });
    }

    fn libc_o_nonblock() -> i32 {
        OFlags::NONBLOCK.bits() as i32
    }

    use std::os::unix::fs::OpenOptionsExt as _;

    const WRITTEN: &[u8] = b"the transferred bytes";
    const PLANTED: &[u8] = b"a planted file!!!!!!!";
    const OLD: &[u8] = b"the target before";

    /// Stores `rounds` temp files as `f.bin` with `store` while another
    /// thread swaps each one's temp name with a planted file as fast as it
    /// can (rename with RENAME_EXCHANGE: one system call, as a local
    /// attacker with write access to the directory would); returns what
    /// went wrong: a store reported done for bytes not written, or a
    /// failed one that left `f.bin` other than it was (`before`).
    fn stores_under_a_swapper(
        dir: &ServerDir,
        rounds: u32,
        before: Option<&[u8]>,
        store: impl Fn(&mut TempFile) -> io::Result<()>,
    ) -> Vec<String> {
        use std::sync::Mutex;
        let swapping: Mutex<Option<String>> = Mutex::new(None);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let path = |name: &str| dir.path().join(name);
        let mut wrong = Vec::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = swapping.lock().unwrap();
                    if let Some(name) = name.as_deref() {
                        let _ = rustix::fs::renameat_with(
                            dir,
                            name,
                            dir,
                            "planted",
                            rustix::fs::RenameFlags::EXCHANGE,
                        );
                    }
                }
            });
            for round in 0..rounds {
                std::fs::write(path("planted"), PLANTED).unwrap();
                if let Some(before) = before {
                    std::fs::write(path("f.bin"), before).unwrap();
                }
                let mut temp = TempFile::create(dir, u64::from(round)).unwrap();
                std::io::Write::write_all(temp.file_mut(), WRITTEN).unwrap();
                *swapping.lock().unwrap() = Some(temp.name.clone());
                let stored = store(&mut temp);
                *swapping.lock().unwrap() = None;
                let now = std::fs::read(path("f.bin")).ok();
                match &stored {
                    Ok(()) if now.as_deref() != Some(WRITTEN) => wrong.push(format!(
                        "round {round}: stored, but f.bin holds {:?}",
                        now.map(|b| String::from_utf8_lossy(&b).into_owned())
                    )),
                    Err(e) if now.as_deref() != before => wrong.push(format!(
                        "round {round}: failed ({e}), and f.bin holds {:?}",
                        now.map(|b| String::from_utf8_lossy(&b).into_owned())
                    )),
                    _ => {}
                }
                drop(temp);
                for name in ["f.bin", "planted"] {
                    let _ = std::fs::remove_file(path(name));
                }
                // The swapped-in file's name, if the temp name moved.
                for leftover in std::fs::read_dir(dir.path()).unwrap() {
                    let _ = std::fs::remove_file(leftover.unwrap().path());
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        wrong
    }

    /// Without /proc the file written cannot be linked by its descriptor:
    /// whatever its temp name names at the instant of the link is linked.
    /// A file swapped in then is never reported stored, nor left in place.
    #[test]
    fn without_proc_a_file_swapped_in_at_the_link_is_never_stored() {
        let scratch = Scratch::new("noproc");
        let dir = open(scratch.path()).with_proc(&scratch.path().join("no-proc-here"));
        let wrong = stores_under_a_swapper(&dir, 3_000, None, |temp| temp.link_as("f.bin"));
        assert!(
            wrong.is_empty(),
            "{} wrong: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
    }

    /// With --overwrite: a file swapped in under the temp name at the
    /// rename never replaces the target — the target keeps its old bytes
    /// when the store fails.
    #[test]
    fn overwriting_never_loses_the_old_target_to_a_file_swapped_in() {
        let scratch = Scratch::new("exchange");
        let dir = open(scratch.path());
        let wrong = stores_under_a_swapper(&dir, 3_000, Some(OLD), |temp| temp.rename_as("f.bin"));
        assert!(
            wrong.is_empty(),
            "{} wrong: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
    }

    fn mode_of(file: &File) -> u32 {
        rustix::fs::fstat(file).unwrap().st_mode & 0o7777
    }

    /// While bytes land in it, whatever the umask, no one but the server's
    /// user can open a temp file (to rewrite what was verified).
    #[test]
    fn a_temp_file_is_the_server_s_alone_until_it_is_in_place() {
        let scratch = Scratch::new("mode");
        for dir in [
            open(scratch.path()),
            open(scratch.path()).with_proc(&scratch.path().join("no-proc-here")),
        ] {
            let temp = TempFile::create(&dir, 0).unwrap();
            assert_eq!(mode_of(temp.file()), 0o600, "{:o}", mode_of(temp.file()));
            drop(temp);
            // Under a umask of 000 a file in place gets 0666, as it did
            // before: only the temp file is private.
            let open_to_all = Mode::from_bits_truncate(0o666);
            let temp = TempFile::create_for(&dir, 1, open_to_all).unwrap();
            assert_eq!(mode_of(temp.file()), 0o600);
            temp.link_as("linked").unwrap();
            assert_eq!(mode_of(temp.file()), 0o666, "once linked");
            drop(temp);
            std::fs::write(scratch.path().join("renamed"), OLD).unwrap();
            let mut temp = TempFile::create_for(&dir, 2, open_to_all).unwrap();
            temp.rename_as("renamed").unwrap();
            assert_eq!(mode_of(temp.file()), 0o666, "once renamed");
            drop(temp);
            for name in ["linked", "renamed"] {
                std::fs::remove_file(scratch.path().join(name)).unwrap();
            }
        }
        // What any file created 0666 gets under the process's umask.
        let plain = scratch.path().join("plain");
        std::fs::write(&plain, b"").unwrap();
        assert_eq!(
            stored_mode().bits(),
            mode_of(&File::open(&plain).unwrap()),
            "a stored file's mode follows the umask"
        );
    }

    #[test]
    fn a_failed_directory_fsync_says_the_file_is_in_place() {
        let failed = Err(io::Error::from(io::ErrorKind::StorageFull));
        let why = dir_synced(failed, "f.bin").unwrap_err();
        assert!(
            why.starts_with("f.bin is in place on the server with its data verified and durable, but the fsync of the server's directory failed ("),
            "{why}"
        );
        assert!(
            why.ends_with("after a power loss the file may be missing"),
            "{why}"
        );
        sync_dir_after_link(&open(&std::env::temp_dir()), "f.bin").unwrap();
    }
}
