//! The programs under test, and pinpoll-testkit's harness, device and
//! files for running them.
#![allow(dead_code, unused_imports)]

pub use pinpoll_testkit::process::*;
pub use pinpoll_testkit::{addr4, addr6, device, random_file, serial, sha256, Scratch};

pub const BASIC: &str = env!("CARGO_BIN_EXE_basic");
pub const READWRITE: &str = env!("CARGO_BIN_EXE_readwrite");
pub const FILEXFER: &str = env!("CARGO_BIN_EXE_filexfer");
