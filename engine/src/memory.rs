//! Registered memory and who may touch it (see [`MemoryRegion`] and
//! [`SharedRegion`]), and the locked-memory limit registration counts
//! against.

pub use crate::config::PageSize;
pub use crate::sys::mem::{check_memlock, memlock_limit};
pub use crate::sys::mr::{Access, LocalSlice, RemoteSlice};
pub use crate::sys::posted::{CompleteError, Posted};
pub use crate::sys::raw::RawQueuePair;
pub use crate::sys::region::{MemoryRegion, RegionOp, RegionRefused, SharedRegion};
