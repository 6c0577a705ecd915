//! The only place that talks to libibverbs and librdmacm, and the only
//! code that decides who may touch registered memory. Private to the
//! engine: what users need of it is re-exported by the crate root on
//! purpose. Everything above this module is safe Rust.
//!
//! The invariants its `unsafe` blocks rely on, who upholds each and the
//! test that catches its violation, are tabled in `docs/unsafe-contract.md`.
//!
//! - Owners of verbs and CM objects, each an RAII type whose children hold
//!   an `Arc` of their parent, so teardown runs in reverse order of
//!   construction — also after a setup step fails half-way: [`device`],
//!   [`pd`], [`cq`], [`qp`], [`cm`], [`mem`] (mappings), [`mr`]
//!   (registrations).
//! - Ownership of registered memory: [`region`] (regions users hold),
//!   [`posted`] (posting that moves a region to the NIC and back),
//!   [`parked`] (memory let go of while a request may still name it, kept
//!   until the queue pair is done with it), [`raw`] (`unsafe` posting for
//!   experts), [`wr_id`] (whose a completion is), [`send_queue`] and
//!   [`recv_queue`] (a connection's rings, whose slots only these modules
//!   hand between CPU and NIC, and which keeps the regions a caller lends
//!   it in [`lent`] until their requests retire), over the pure accounting
//!   in [`ledger`] and [`layout`], and the work-request builder in [`wr`];
//!   for many connections on one core (issue 25), [`srq`] (a shared
//!   receive queue) and [`srq_ring`] (its ring of receive slots, over the
//!   pure [`srq_ledger`]).
//! - [`handoff`]: the lock-free slot ring between an application thread
//!   and the engine's worker, over [`slot_storage`] (its bytes, and under
//!   loom the record of every access to them); [`cpu`], [`alloc`]: thread
//!   affinity and the counting allocator of the zero-allocation test.
//!
//! Sizes, counts and offsets from callers and peers are checked before
//! use, and every other sum says how it may overflow: `checked_` where it
//! may, `saturating_` where a bound is meant, `wrapping_` where the value
//! cannot get there or is modular (each says which).
#![allow(unsafe_code)]
#![deny(clippy::arithmetic_side_effects)]

pub(crate) mod alloc;
pub(crate) mod cm;
pub(crate) mod cpu;
pub(crate) mod cq;
pub(crate) mod device;
#[cfg(feature = "engine")]
pub(crate) mod handoff;
pub(crate) mod layout;
pub(crate) mod ledger;
pub(crate) mod lent;
pub(crate) mod mem;
pub(crate) mod mr;
pub(crate) mod parked;
pub(crate) mod pd;
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod pooled_send_device_tests;
pub(crate) mod posted;
pub(crate) mod qp;
pub(crate) mod raw;
pub(crate) mod recv_queue;
pub(crate) mod region;
pub(crate) mod send_names;
pub(crate) mod send_queue;
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod shared_queue_device_tests;
#[cfg(feature = "engine")]
pub(crate) mod slot_storage;
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "issue 25's poller builds on it; only its device tests use it yet"
    )
)]
pub(crate) mod srq;
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "issue 25's poller builds on it; only its tests use it yet"
    )
)]
pub(crate) mod srq_ledger;
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "issue 25's poller builds on it; only its tests use it yet"
    )
)]
pub(crate) mod srq_ring;
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod srq_ring_device_tests;
pub(crate) mod wr;
pub(crate) mod wr_id;

use pinpoll_verbs_sys as ffi;

/// Turns a C string owned by a library into `&'static str`, for the names
/// and messages that libibverbs keeps in static tables.
fn static_cstr(ptr: *const std::os::raw::c_char) -> &'static str {
    if ptr.is_null() {
        return "";
    }
    // SAFETY: callers pass pointers returned by ibv_wc_status_str,
    // rdma_event_str and friends, which point at NUL-terminated strings in
    // static storage of the shared library, valid for the process lifetime.
    let s = unsafe { std::ffi::CStr::from_ptr(ptr) };
    s.to_str().unwrap_or("")
}

/// `ibv_wc_status_str`: the library's own text for a completion status
/// (what [`crate::status::WcStatus::text`] is checked against).
#[cfg(test)]
pub(crate) fn wc_status_str(status: u32) -> &'static str {
    // SAFETY: ibv_wc_status_str accepts any value and returns a static string.
    static_cstr(unsafe { ffi::ibv_wc_status_str(status) })
}

/// `rdma_event_str`: the library's name for a CM event.
pub(crate) fn cm_event_str(event: u32) -> &'static str {
    // SAFETY: rdma_event_str accepts any value and returns a static string.
    static_cstr(unsafe { ffi::rdma_event_str(event) })
}
