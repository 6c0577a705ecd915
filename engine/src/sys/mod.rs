//! The only place that talks to libibverbs and librdmacm. Every type here is
//! an RAII owner whose children hold an `Arc` of their parent, so teardown
//! runs in reverse order of construction — also after a setup step fails
//! half-way. Everything above this module is safe Rust.
#![allow(unsafe_code)]

pub mod alloc;
pub mod chain;
pub mod cm;
pub mod cpu;
pub mod cq;
pub mod device;
pub mod handoff;
pub mod mem;
pub mod mr;
pub mod pd;
pub mod qp;

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

/// `ibv_wc_status_str`: the library's own text for a completion status.
pub fn wc_status_str(status: u32) -> &'static str {
    // SAFETY: ibv_wc_status_str accepts any value and returns a static string.
    static_cstr(unsafe { ffi::ibv_wc_status_str(status) })
}

/// `rdma_event_str`: the library's name for a CM event.
pub fn cm_event_str(event: u32) -> &'static str {
    // SAFETY: rdma_event_str accepts any value and returns a static string.
    static_cstr(unsafe { ffi::rdma_event_str(event) })
}
