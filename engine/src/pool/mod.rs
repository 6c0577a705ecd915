//! Many connections on one poller (issue 25): the pure-data pieces it is
//! built from, tested on the host before the poller itself exists. See
//! `docs/design/many-peers-per-core.md`.

pub(crate) mod budget;
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod device_tests;
pub(crate) mod ending;
pub(crate) mod fair;
pub(crate) mod idle;
pub(crate) mod poller;
pub(crate) mod qpn_table;
pub(crate) mod slab;
