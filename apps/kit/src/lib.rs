//! What every pinpoll program (basic, readwrite, filexfer, pinpoll-perf,
//! pinpoll-tune) shares, so each concern is written once:
//!
//! - [`run`] — `main`: parse the command line, set up logging, run, and
//!   turn any failure into one `error: ...` line and a non-zero exit
//!   status (2 for bad usage).
//! - [`logging`] — `tracing` to stderr, `RUST_LOG` overriding.
//! - [`pin`] — pinning the calling thread to a core.
//! - [`random`] — tokens a peer must not guess, from the OS.
#![forbid(unsafe_code)]

pub mod logging;
pub mod pin;
pub mod random;
pub mod run;

pub use logging::init_logging;
pub use pin::pin;
pub use random::random_u64;
pub use run::{error_line, main, usage, AlreadyReported};
