//! The CPU set a thread may run on, read back from the kernel.

#[cfg(feature = "engine")]
use crate::error::{Error, Result};

/// How many CPUs the machine has configured (`_SC_NPROCESSORS_CONF`),
/// at most what a CPU set can name.
pub fn configured_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n)
        .unwrap_or(1)
        .clamp(1, libc::CPU_SETSIZE as usize)
}

/// The CPUs the calling thread may run on (`sched_getaffinity`).
#[cfg(feature = "engine")]
pub fn current_affinity() -> Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = the calling thread; set is a valid out-pointer of
    // the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(Error::Affinity(std::io::Error::last_os_error()));
    }
    // SAFETY: CPU_ISSET reads the set filled above; i < CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect())
}
