//! The CPU set a thread may run on, read back from the kernel.

#[cfg(feature = "engine")]
use crate::error::{Error, Result};

/// One past the highest CPU number the machine may ever bring online
/// (`/sys/devices/system/cpu/possible`, e.g. `0-3,8-11`), at most what a
/// CPU set can name. Not a count: numbering may have holes. Where the
/// file cannot be read, what a CPU set can name.
pub fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|list| highest_cpu(&list))
        .map_or(libc::CPU_SETSIZE as usize, |highest| {
            highest.saturating_add(1)
        })
        .clamp(1, libc::CPU_SETSIZE as usize)
}

/// The highest CPU of a kernel CPU list (`0-3,8,10-11`), `None` if it is
/// not one.
fn highest_cpu(list: &str) -> Option<usize> {
    list.trim()
        .split(',')
        .map(|range| range.rsplit('-').next()?.parse::<usize>().ok())
        .try_fold(0usize, |max, end| Some(max.max(end?)))
        .filter(|_| !list.trim().is_empty())
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

#[cfg(test)]
mod tests {
    use super::highest_cpu;

    #[test]
    fn the_highest_cpu_of_a_list_with_holes_is_its_last_number() {
        assert_eq!(highest_cpu("0-1\n"), Some(1));
        assert_eq!(highest_cpu("0"), Some(0));
        assert_eq!(highest_cpu("0-3,8-11"), Some(11));
        assert_eq!(highest_cpu("0,2,4-5,7"), Some(7));
        assert_eq!(highest_cpu(""), None);
        assert_eq!(highest_cpu("0-x"), None);
        assert_eq!(highest_cpu("0,,3"), None);
    }

    #[test]
    fn this_machine_has_at_least_the_cpus_it_runs_on() {
        let possible = super::possible_cpus();
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(possible >= online, "{possible} < {online}");
    }
}
