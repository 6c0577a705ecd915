//! Pinning the calling thread to one core (a busy-polling thread that the
//! scheduler moves loses its caches and its timing).

use anyhow::bail;

/// Pins the calling thread to `core`. The thread's current affinity does
/// not matter (a thread spawned by a pinned one inherits its single core
/// and may still move to another); the process's CPU set does.
pub fn pin(core: usize) -> anyhow::Result<()> {
    // A cpu_set_t holds CPU_SETSIZE CPUs; core_affinity indexes it
    // unchecked, so a larger id must not reach it.
    const CPU_SETSIZE: usize = 1024;
    if core < CPU_SETSIZE && core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        return Ok(());
    }
    bail!(
        "cannot pin the thread to core {core}: not a core this process may use \
         (see `taskset -p` and the cgroup's cpuset)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread pinned to one core can be pinned to another: what
    /// pinpoll-perf's loopback server does after the measuring thread
    /// (its parent) pinned itself.
    #[test]
    fn a_pinned_thread_moves_to_another_core() {
        let ids = core_affinity::get_core_ids().expect("the cores of this process");
        let (first, last) = (ids[0].id, ids[ids.len() - 1].id);
        std::thread::spawn(move || {
            pin(last).unwrap();
            std::thread::spawn(move || {
                pin(first).unwrap();
                assert_eq!(core_affinity::get_core_ids().unwrap().len(), 1);
                assert_eq!(core_affinity::get_core_ids().unwrap()[0].id, first);
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_core_that_does_not_exist_is_an_error_naming_it() {
        let err = pin(1 << 20).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "cannot pin the thread to core 1048576: not a core this process may use"
            ),
            "{err}"
        );
    }
}
