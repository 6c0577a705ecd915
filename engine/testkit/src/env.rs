//! The RDMA device and addresses of the SoftRoCE guest, from the variables
//! `scripts/softroce-vm` sets. A device test that cannot find its device
//! fails, naming the variable and how to get one.

use std::net::SocketAddr;

use pinpoll::connect::parse_socket_addr;

/// How to run the device tests, for the failure message.
const HOW: &str = "device tests need an RDMA device: run them inside the SoftRoCE guest \
     with `scripts/test.sh --device-only` (or `scripts/softroce-vm -- <test binary> --include-ignored`)";

/// The value of `var`, or a failure naming it.
#[track_caller]
pub fn required(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("{var} is not set: {HOW}"),
    }
}

/// `$PINPOLL_DEVICE` when it is set and not empty. For the benches only:
/// `cargo bench` on a host without a device says how to get one instead.
pub fn device_if_set() -> Option<String> {
    std::env::var("PINPOLL_DEVICE")
        .ok()
        .filter(|d| !d.is_empty())
}

/// The RDMA device of the guest (rxe0).
#[track_caller]
pub fn device() -> String {
    required("PINPOLL_DEVICE")
}

/// The guest's IPv4 link-local address on the rxe netdev (rdma_cm cannot
/// use 127.0.0.0/8 on rxe).
#[track_caller]
pub fn addr4() -> String {
    required("PINPOLL_ADDR4")
}

/// The guest's IPv6 link-local address, with `%interface`.
#[track_caller]
pub fn addr6() -> String {
    required("PINPOLL_ADDR6")
}

/// The netdev under the RDMA device (rxenet0).
#[track_caller]
pub fn netdev() -> String {
    required("PINPOLL_NETDEV")
}

/// [`addr4`] as a socket address with port 0 (the listener picks one).
#[track_caller]
pub fn cm_addr() -> SocketAddr {
    let host = addr4();
    parse_socket_addr(&host, 0).unwrap_or_else(|e| panic!("PINPOLL_ADDR4={host:?}: {e}"))
}
