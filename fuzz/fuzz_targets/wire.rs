//! `pinpoll::wire`, under every fixed format a peer sends (the engine's
//! records, readwrite's and filexfer's headers): `Header::check` accepts
//! exactly the bytes whose length, magic and version are right, refuses
//! the rest with the first check that failed (zeros, length, magic,
//! version, in that order), and its reasons fit an rdma_cm reject.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpoll::wire::{Header, Len, WireError};
use pinpoll_fuzz::{within_budget, REJECT_LEN};

/// Each format's header and the length its decoder asks for.
static FORMATS: [(Header, Len); 5] = [
    (
        Header::new("pinpoll out-of-band endpoint", "PPCR", Some(1)),
        Len::Exactly(64),
    ),
    (
        Header::new("pinpoll region descriptor", "PPRD", Some(1)),
        Len::AtLeast(28),
    ),
    (
        Header::new("readwrite client", "PPRW", Some(1)),
        Len::AtLeast(6),
    ),
    (
        Header::new("readwrite done message", "PPDN", None),
        Len::Exactly(8),
    ),
    (
        Header::new("filexfer message", "PPFX", Some(3)),
        Len::AtLeast(8),
    ),
];

fn accepts(len: Len, n: usize) -> bool {
    match len {
        Len::Exactly(want) => n == want,
        Len::AtLeast(least) => n >= least,
    }
}

fn check(header: &'static Header, len: Len, bytes: &[u8]) {
    let checked = within_budget(header.name, bytes.len(), 0, || {
        header.check(bytes, len).map(|v| v.bytes().len())
    });
    let zeros = bytes.iter().all(|b| *b == 0);
    let magic_ok = bytes.get(..4) == Some(&header.magic()[..]);
    let version_ok = header.version.is_none() || bytes.get(4).copied() == header.version;
    match checked {
        Ok(n) => {
            assert_eq!(n, bytes.len());
            assert!(
                !zeros && accepts(len, n) && magic_ok && version_ok,
                "{bytes:?}"
            );
        }
        Err(err) => {
            let first = match &err {
                WireError::Absent { .. } => zeros,
                WireError::Length { got, .. } => {
                    !zeros && *got == bytes.len() && !accepts(len, *got)
                }
                WireError::Magic { .. } => !zeros && accepts(len, bytes.len()) && !magic_ok,
                WireError::Version { got, .. } => {
                    !zeros
                        && accepts(len, bytes.len())
                        && magic_ok
                        && Some(*got) == bytes.get(4).copied()
                        && !version_ok
                }
                WireError::Field { .. } => false,
                // WireError is #[non_exhaustive]: a new refusal must be
                // taught to this target before it passes.
                _ => false,
            };
            assert!(first, "{err} for {bytes:?} ({len:?})");
            assert!(err.to_string().len() < REJECT_LEN, "{err}");
        }
    }
}

fuzz_target!(|bytes: &[u8]| {
    for (header, len) in &FORMATS {
        // The decoder's own length, and both kinds of length at it.
        let n = match len {
            Len::Exactly(n) | Len::AtLeast(n) => *n,
        };
        for len in [*len, Len::Exactly(n), Len::AtLeast(n)] {
            check(header, len, bytes);
        }
    }
});
