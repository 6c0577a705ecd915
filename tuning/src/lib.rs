//! pinpoll-tune: the tuning kit of pinpoll.
//!
//! - [`profile`] — the engine profiles (built in from `engine/profiles/*.toml`, or files):
//!   finding them, and printing the effective configuration of one.
//! - [`doctor`] — is this host ready for busy-poll RDMA? Every check is a
//!   pure function over a [`SystemRoot`] (sysfs and procfs under `/`, or a
//!   fixture tree) and an [`facts::Inventory`] of device facts (pinpoll's
//!   verbs queries, or hand-made in tests).
//!
//! - [`sweep`] — measure `pinpoll-perf` workloads over a grid of engine
//!   parameters (medians of repeats), plot them, recommend a profile.
//! - [`topology`] — NUMA nodes, the bus device behind an RDMA device, its
//!   NUMA node and interrupts, from sysfs and procfs.
//! - [`plot`] — every chart (the sweep's, and the perftest comparison of
//!   `pinpoll-tune plot`), drawn with plotters as SVG.
//!
//! The `pinpoll-tune` binary is the command line over them.
#![forbid(unsafe_code)]

pub mod cpulist;
pub mod doctor;
pub mod facts;
pub mod plot;
pub mod profile;
pub mod root;
pub mod sweep;
pub mod topology;

pub use root::SystemRoot;
