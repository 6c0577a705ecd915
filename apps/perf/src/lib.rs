//! pinpoll-perf: perftest's latency and bandwidth tests, run on pinpoll.
//!
//! The binary (`src/main.rs`) is a thin shell over this library, which the
//! criterion benches in `benches/` share: the measured loops live in
//! [`driver`], the in-process pair and the client/server sessions in
//! [`session`], the figures in [`report`].
#![forbid(unsafe_code)]

pub mod admit;
pub mod cli;
pub mod clock;
pub mod control;
pub mod driver;
pub mod plan;
pub mod report;
pub mod session;

pub use cli::{Cli, Command, PerfArgs, Role, Settings, Transport};
pub use plan::{data_config, Kind, Mode, Overrides, Params, Plan};

/// How many cores this process may run on.
pub fn available_cores() -> usize {
    core_affinity::get_core_ids().map_or(1, |c| c.len().max(1))
}
