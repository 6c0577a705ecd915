//! The RDMA devices of this machine and what they say about themselves:
//! the list, an open device, its limits and ports, and the inline size a
//! queue pair gets (which no query reports).

pub use crate::sys::device::{list_devices, mtu_bytes, DeviceAttr, DeviceInfo, PortAttr};

/// An open device context (`ibv_context`).
pub type Device = crate::sys::device::Context;

use std::sync::Arc;

use crate::config::QpConfig;
use crate::error::Result;
use crate::sys::cq::CompletionQueue;
use crate::sys::pd::ProtectionDomain;
use crate::sys::qp::{QueuePair, Queues};

/// The largest `max_inline_data` the device grants an RC queue pair with
/// one SGE, at most `ceiling`, found by creating queue pairs (inline
/// capacity is monotonic, so a binary search finds it).
pub fn max_inline_data(device: &Arc<Device>, ceiling: u32) -> Result<u32> {
    let pd = ProtectionDomain::new(device)?;
    let (cq, _poller) = CompletionQueue::new(device, 32)?;
    let fits = |bytes: u32| {
        let cfg = QpConfig {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_sge: 1,
            max_inline_data: bytes,
            cq_depth: 32,
            ..QpConfig::default()
        };
        QueuePair::new(&pd, Queues::own(&cq, &cq), &cfg).map(drop)
    };
    fits(0)?;
    if fits(ceiling).is_ok() {
        return Ok(ceiling);
    }
    // Invariant: lo fits, hi does not.
    let (mut lo, mut hi) = (0u32, ceiling);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid).is_ok() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}
