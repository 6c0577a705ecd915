//! pinpoll: a zero-allocation, busy-poll RDMA engine over libibverbs and
//! librdmacm.
//!
//! The module tree is the architecture:
//! - [`sys`] — the only unsafe code: RAII owners of verbs and CM objects.
//! - [`completion`], [`config`], [`error`] — plain data: statuses, tunables, errors.
//! - [`gid`] — which GID to use on RoCE, read from sysfs.
//! - [`connect`] — two ways to a connected queue pair: rdma_cm, and an
//!   out-of-band TCP exchange of a [`connect::ConnectionRecord`].
//! - [`endpoint`] — a connected queue pair with its CQs, and bounded waits.
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod completion;
pub mod config;
pub mod connect;
pub mod datapath;
pub mod endpoint;
pub mod error;
pub mod gid;
pub mod profile;
pub mod sys;
pub mod worker;

pub use completion::{WcError, WcOpcode, WcStatus};
pub use config::QpConfig;
pub use datapath::{Batch, Connection, Event};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use profile::{EngineConfig, IdlePolicy};
pub use sys::mem::{Buffer, PageSize};
pub use sys::mr::{Access, LocalSlice, MemoryRegion, RemoteSlice};
pub use sys::qp::SendFlags;
pub use worker::{Completion, Engine, WorkerReport};
