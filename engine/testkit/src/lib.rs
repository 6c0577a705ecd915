//! The test kit of pinpoll: one place for what the test crates of the
//! workspace (engine, apps, pinpoll-perf, pinpoll-tune, the benches) share.
//!
//! - [`env`]: the RDMA device and the guest's addresses, from the
//!   environment `scripts/softroce-vm` sets; a device test without them
//!   fails with the reason, it never passes silently.
//! - [`pair`]: connected endpoints and fast-path connections over both
//!   connection methods (rdma_cm and the out-of-band TCP exchange).
//! - [`process`]: programs run as child processes, every wait bounded by a
//!   hang watchdog that kills the child and fails the test.
//! - [`scratch`]: fresh directories removed on drop.
//! - [`data`]: deterministic test data and file digests.
//! - [`maps`]: whether an address is mapped in this process.
#![forbid(unsafe_code)]

pub mod data;
pub mod env;
pub mod maps;
pub mod pair;
pub mod process;
pub mod scratch;

pub use data::{pattern, random_file, sha256};
pub use env::{addr4, addr6, cm_addr, device, netdev};
pub use maps::is_mapped;
pub use process::{
    command, run, run_within, run_within_env, Finished, Running, Server, HANG, TIMEOUT_SECS,
};
pub use scratch::Scratch;

/// Device tests in one binary run one at a time: each busy-polls, and the
/// guest has two vCPUs shared with SoftRoCE itself.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
