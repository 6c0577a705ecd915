//! Pinning the calling thread to one core (a busy-polling thread that the
//! scheduler moves loses its caches and its timing).

use anyhow::bail;

/// Pins the calling thread to `core`, which must be one this process may
/// run on (its CPU set: `taskset -p`, the cgroup's cpuset).
pub fn pin(core: usize) -> anyhow::Result<()> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let Some(id) = ids.into_iter().find(|c| c.id == core) else {
        bail!("core {core}: no such core available to this process");
    };
    if !core_affinity::set_for_current(id) {
        bail!("core {core}: pinning the thread failed");
    }
    Ok(())
}
