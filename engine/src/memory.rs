//! Registered memory and who may touch it (see [`MemoryRegion`] and
//! [`SharedRegion`]), and the locked-memory limit registration counts
//! against.

pub use crate::sys::mem::{check_memlock, memlock_limit, PageSize};
pub use crate::sys::mr::{Access, LocalSlice, RemoteSlice};
pub use crate::sys::region::{
    MemoryRegion, Posted, RawQueuePair, RegionOp, RegionRefused, SharedRegion,
};
