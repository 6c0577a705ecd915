//! Two first-class ways to a connected RC queue pair:
//! - [`cm`]: librdmacm resolves addresses and routes and drives the QP
//!   through its states; the peers exchange private data in the handshake.
//! - [`oob`]: the peers swap a [`ConnectionRecord`] over a TCP socket and
//!   move the QP through RESET→INIT→RTR→RTS themselves.

pub mod addr;
pub mod cm;
pub mod oob;
pub mod record;

pub use addr::parse_socket_addr;
pub use record::{ConnectionRecord, RegionDescriptor};
