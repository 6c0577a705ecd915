//! Page-aligned memory for registration: anonymous pages, or 2 MiB / 1 GiB
//! huge pages, mapped and pre-faulted up front so the data path never takes
//! a page fault, and never inherited by a child process: a fork would
//! otherwise make the pages copy-on-write, and the first write after it
//! would move this process's copy away from the pages the NIC was told
//! about (kernels before 5.12 do not protect registrations from that).

use std::ptr::NonNull;

use crate::error::{Error, Result};

use crate::config::PageSize;

// The size a page choice stands for is the system's to say, so it is
// answered here rather than where the choice is configured.
impl PageSize {
    /// Bytes per page.
    pub fn bytes(self) -> usize {
        match self {
            PageSize::Base => base_page_size(),
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    fn sysfs_dir(self) -> Option<&'static str> {
        match self {
            PageSize::Base => None,
            PageSize::Huge2M => Some("/sys/kernel/mm/hugepages/hugepages-2048kB"),
            PageSize::Huge1G => Some("/sys/kernel/mm/hugepages/hugepages-1048576kB"),
        }
    }
}

fn base_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// An owned, page-aligned, pre-faulted mapping, not inherited across fork.
/// It hands out raw pointers only: once registered, the NIC may write it,
/// and [`super::mr`] decides who may look.
#[derive(Debug)]
pub(crate) struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    mapped: usize,
}

// SAFETY: the buffer is plain memory owned by this value; moving the owner
// moves the right to free it, nothing else.
unsafe impl Send for Buffer {}
// SAFETY: &Buffer gives out only its address and length, never access.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed memory.
    ///
    /// Huge pages are never a silent fallback: when they were asked for and
    /// none are free, this fails and says how to reserve them.
    pub(crate) fn new(len: usize, page: PageSize) -> Result<Buffer> {
        let mapped = mapped_len(len, page)?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        match page {
            PageSize::Base => {}
            PageSize::Huge2M => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            PageSize::Huge1G => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
        }
        // SAFETY: an anonymous private mapping at a kernel-chosen address
        // aliases nothing; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let source = std::io::Error::last_os_error();
            return Err(Error::Map {
                len: mapped,
                hint: map_hint(page, mapped),
                source,
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap returned NULL without MAP_FIXED");
        // SAFETY: the range is the mapping just made, owned by this call.
        if unsafe { libc::madvise(ptr.as_ptr().cast(), mapped, libc::MADV_DONTFORK) } != 0 {
            let source = std::io::Error::last_os_error();
            // SAFETY: as in Drop: our mapping, unmapped once.
            unsafe { libc::munmap(ptr.as_ptr().cast(), mapped) };
            return Err(Error::Map {
                len: mapped,
                hint: "madvise(MADV_DONTFORK) refused the mapping".into(),
                source,
            });
        }
        Ok(Buffer { ptr, len, mapped })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start of the mapping: `len` bytes, zero-filled by the kernel.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, of exactly `mapped` bytes, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

/// The bytes a mapping of `len` bytes takes: whole pages, at least one,
/// or an error when that is more than one mapping can span.
pub(crate) fn mapped_len(len: usize, page: PageSize) -> Result<usize> {
    len.max(1)
        .checked_next_multiple_of(page.bytes())
        .filter(|mapped| isize::try_from(*mapped).is_ok())
        .ok_or_else(|| Error::Map {
            len,
            hint: "more bytes than one mapping can span".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOMEM),
        })
}

fn map_hint(page: PageSize, mapped: usize) -> String {
    let Some(dir) = page.sysfs_dir() else {
        return "the machine is out of memory or the address space is exhausted".into();
    };
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .ok()
            .map(|s| s.trim().to_owned())
    };
    let need = mapped.checked_div(page.bytes()).unwrap_or(0);
    match (read("nr_hugepages"), read("free_hugepages")) {
        (Some(total), Some(free)) => format!(
            "{need} huge page(s) of {} needed, {free} free of {total} reserved; reserve more with \
             `echo N | sudo tee {dir}/nr_hugepages` (2 MiB pages: also /proc/sys/vm/nr_hugepages)",
            human(page.bytes())
        ),
        _ => format!(
            "this kernel has no {} huge pages (no {dir})",
            human(page.bytes())
        ),
    }
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`None` = unlimited).
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid out-pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(lim.rlim_cur)
    }
}

/// What `/proc/self/status` says about locking memory: whether the
/// process has CAP_IPC_LOCK in its effective set (which exempts it from
/// `RLIMIT_MEMLOCK` in the kernel's registration check), and how many bytes
/// it has pinned already (`VmPin`, which registrations count against the
/// limit).
fn lock_status(status: &str) -> (Option<bool>, u64) {
    const CAP_IPC_LOCK: u32 = 14;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let cap = field("CapEff:")
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .map(|bits| bits & (1 << CAP_IPC_LOCK) != 0);
    let pinned = field("VmPin:")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb.saturating_mul(1024));
    (cap, pinned)
}

/// Fails up front when registering `need` more bytes would exceed the
/// locked-memory limit, counting what this process has pinned already —
/// the kernel's own rule. A process with CAP_IPC_LOCK in its effective
/// set (root, normally) is exempt, as the kernel exempts it; root without
/// that capability is not.
pub fn check_memlock(need: u64) -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let (cap, pinned) = lock_status(&status);
    // SAFETY: geteuid has no preconditions.
    let privileged = cap.unwrap_or_else(|| unsafe { libc::geteuid() } == 0);
    memlock_verdict(need, pinned, memlock_limit(), privileged)
}

fn memlock_verdict(need: u64, locked: u64, limit: Option<u64>, privileged: bool) -> Result<()> {
    match limit {
        Some(limit) if !privileged && need.saturating_add(locked) > limit => Err(Error::Memlock {
            need,
            locked,
            limit,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    #[test]
    fn memlock_is_checked_before_registration() {
        assert!(memlock_verdict(1 << 20, 0, Some(64 << 10), false)
            .unwrap_err()
            .to_string()
            .contains("ulimit -l unlimited"));
        memlock_verdict(1 << 20, 0, Some(64 << 10), true).unwrap();
        memlock_verdict(1 << 20, 0, None, false).unwrap();
        memlock_verdict(1 << 10, 0, Some(64 << 10), false).unwrap();
        // What is pinned already counts, as it does for the kernel.
        let err = memlock_verdict(40 << 10, 30 << 10, Some(64 << 10), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("40960 more bytes") && err.contains("30720 already locked"),
            "{err}"
        );
        memlock_verdict(30 << 10, 30 << 10, Some(64 << 10), false).unwrap();
    }

    #[test]
    fn the_capability_not_the_uid_exempts_from_the_limit() {
        let root = "Name:\tx\nVmPin:\t    2048 kB\nCapEff:\t000001ffffffffff\n";
        assert_eq!(lock_status(root), (Some(true), 2 << 20));
        // Root after `setpriv --bounding-set=-ipc_lock`: bit 14 clear.
        let no_ipc_lock = "VmPin:\t0 kB\nCapEff:\t000001ffffffbfff\n";
        assert_eq!(lock_status(no_ipc_lock), (Some(false), 0));
        assert_eq!(lock_status(""), (None, 0));
    }

    #[test]
    fn base_pages_map_zeroed_and_aligned() {
        let b = Buffer::new(10_000, PageSize::Base).unwrap();
        assert_eq!(b.len(), 10_000);
        assert_eq!(b.as_ptr() as usize % PageSize::Base.bytes(), 0);
        // SAFETY: the buffer is ours, unregistered, 10 000 bytes long.
        let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
        assert!(bytes.iter().all(|x| *x == 0));
    }

    #[test]
    fn a_child_process_does_not_inherit_the_pages() {
        let b = Buffer::new(4096, PageSize::Base).unwrap();
        let maps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", b.as_ptr() as usize);
        let flags = maps
            .lines()
            .skip_while(|l| !l.starts_with(&start))
            .find(|l| l.starts_with("VmFlags:"))
            .expect("an smaps entry for the mapping");
        // `dc`: "do not copy area on fork" (proc(5)).
        assert!(flags.split_whitespace().any(|f| f == "dc"), "{flags}");
    }

    #[test]
    fn a_length_past_the_address_space_is_refused_not_wrapped() {
        for len in [usize::MAX, usize::MAX - 4095, (isize::MAX as usize) + 1] {
            let err = Buffer::new(len, PageSize::Base).unwrap_err().to_string();
            assert!(
                err.contains("more bytes than one mapping can span"),
                "{err}"
            );
        }
        assert_eq!(
            mapped_len(0, PageSize::Base).unwrap(),
            PageSize::Base.bytes()
        );
        assert_eq!(mapped_len(1 << 20, PageSize::Huge2M).unwrap(), 2 << 20);
    }

    #[test]
    fn huge_pages_are_never_a_silent_fallback() {
        // More 1 GiB pages than any test machine reserves: a clear error
        // that says how to reserve them, not a base-page mapping.
        let err = Buffer::new(64 << 30, PageSize::Huge1G)
            .unwrap_err()
            .to_string();
        assert!(err.contains("1 GiB"), "{err}");
        assert!(
            err.contains("nr_hugepages") || err.contains("has no 1 GiB huge pages"),
            "{err}"
        );
    }
}
