//! Many connections on one poller (issue 25): the pure-data pieces it is
//! built from, tested on the host before the poller itself exists. See
//! `docs/design/many-peers-per-core.md`.

pub(crate) mod budget;
pub(crate) mod ending;
pub(crate) mod fair;
pub(crate) mod idle;
pub(crate) mod qpn_table;
pub(crate) mod slab;
