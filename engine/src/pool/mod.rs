//! Many connections on one poller (issue 25). See
//! `docs/design/many-peers-per-core.md`.
//!
//! - `poller`: the poller, its joins over TCP and its turn;
//! - `cm_joins`: rdma_cm connections accepted onto it, without waiting;
//! - `pooled`, `walks`: one connection of it, and the walks over what a
//!   poll took;
//! - `ends`, `ending`: how one connection ends while the others run;
//! - pure data, tested on the host: `slab`, `qpn_table`, `budget`,
//!   `fair`, `idle`.

pub(crate) mod budget;
mod cm_joins;
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod device_tests;
pub(crate) mod ending;
mod ends;
pub(crate) mod event;
pub(crate) mod fair;
pub(crate) mod idle;
pub(crate) mod poller;
mod pooled;
pub(crate) mod qpn_table;
pub(crate) mod slab;
mod walks;
// Needs the workspace's malloc interposer, which the published crate
// leaves out (build.rs).
#[cfg(all(test, pinpoll_malloc_count))]
#[allow(clippy::arithmetic_side_effects)] // counts of the test's own
mod zero_alloc_device_tests;
