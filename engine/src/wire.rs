//! Fixed-size, big-endian wire formats that start with a 4-byte magic and
//! (most) a version byte: the connection records of [`crate::connect`],
//! and the applications' own (readwrite, filexfer). These bytes come from
//! the network, so every format checks them the same way, in the pattern
//! of smoltcp's `wire` module:
//!
//! - a [`Header`] describes a format (its name, magic and version) and
//!   writes itself to the front of a buffer ([`Header::emit`]);
//! - [`Header::check`] turns bytes into a [`Checked`] view only once their
//!   length, magic and version are right, and the view reads the fields;
//! - each format's parsed representation (a plain struct) is built from
//!   the view, checking its own fields with [`Checked::field_error`].
//!
//! Every failure is a [`WireError`] naming the format, the field, what it
//! held and what is allowed.
//!
//! Every decoder of bytes from a peer, here and in the applications, hands
//! them to [`record`] first: the hook that records real sessions' messages
//! as the fuzz targets' seed corpora (`fuzz/README.md`).

use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The header of a wire format: a 4-byte ASCII `magic` at bytes 0..4, then
/// `version` at byte 4 when the format has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the bytes are, for messages ("pinpoll region descriptor").
    pub name: &'static str,
    magic: &'static str,
    /// The version byte (byte 4) this side writes and the only one it
    /// accepts; `None` for a format without one.
    pub version: Option<u8>,
}

/// The lengths a format accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Len {
    /// Exactly this many bytes, no more.
    Exactly(usize),
    /// A header of this many bytes, and maybe more after it (rdma_cm pads
    /// private data with zeros; messages with a body check the rest).
    AtLeast(usize),
}

impl Len {
    fn accepts(self, len: usize) -> bool {
        match self {
            Len::Exactly(n) => len == n,
            Len::AtLeast(n) => len >= n,
        }
    }
}

impl fmt::Display for Len {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Len::Exactly(n) => write!(f, "expected {n}"),
            Len::AtLeast(n) => write!(f, "shorter than the {n}-byte header"),
        }
    }
}

/// Why bytes are not a valid message of a format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The bytes are not of a length the format accepts.
    #[error("{format}: {got} bytes, {expected}")]
    Length {
        /// The format's name ([`Header::name`]).
        format: &'static str,
        /// Bytes received.
        got: usize,
        /// What the format accepts.
        expected: Len,
    },
    /// Nothing but zeros (rdma_cm's padding): the peer sent no header.
    /// An empty input is reported as this too.
    #[error("not a {format}: no {magic} header (the bytes are all zeros)")]
    Absent {
        /// The format's name ([`Header::name`]).
        format: &'static str,
        /// The magic that was looked for.
        magic: &'static str,
    },
    /// Bytes 0..4 are not the format's magic: another format, or noise.
    #[error("not a {format}: wrong magic {got:?}, expected {expected:?}")]
    Magic {
        /// The format's name ([`Header::name`]).
        format: &'static str,
        /// The 4 bytes found, as text (invalid UTF-8 replaced).
        got: String,
        /// The format's magic.
        expected: &'static str,
    },
    /// The magic is right, the version byte is not the one this side
    /// speaks (no other is accepted).
    #[error("{format}: version {got} (this side speaks {speaks})")]
    Version {
        /// The format's name ([`Header::name`]).
        format: &'static str,
        /// The version the bytes carry.
        got: u8,
        /// The version this side speaks.
        speaks: u8,
    },
    /// A field holds a value its format does not allow (made by
    /// [`Checked::field_error`]).
    #[error("{format}: {field} {value} is out of range: allowed {allowed}")]
    Field {
        /// The format's name ([`Header::name`]).
        format: &'static str,
        /// The field's name, e.g. `PSN`.
        field: &'static str,
        /// The value found, as text.
        value: String,
        /// What the field may hold, e.g. `0..=0xffffff (24 bits)`.
        allowed: &'static str,
    },
}

impl Header {
    /// A format's header; `magic` is 4 ASCII bytes (checked when the
    /// constant is built).
    pub const fn new(name: &'static str, magic: &'static str, version: Option<u8>) -> Header {
        assert!(
            magic.len() == 4 && magic.is_ascii(),
            "a magic is 4 ASCII bytes"
        );
        Header {
            name,
            magic,
            version,
        }
    }

    /// The 4 magic bytes, as they stand at bytes 0..4 of a message.
    pub fn magic(&self) -> [u8; 4] {
        let m = self.magic.as_bytes();
        [m[0], m[1], m[2], m[3]]
    }

    /// Bytes the header takes: the magic, and the version byte if any.
    pub const fn header_len(&self) -> usize {
        if self.version.is_some() {
            5
        } else {
            4
        }
    }

    /// Writes the magic (and version) to the front of `buf`, which holds at
    /// least [`Header::header_len`] bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(self.magic.as_bytes());
        if let Some(v) = self.version {
            buf[4] = v;
        }
    }

    /// Checks `bytes` against this format: not all zeros, `len`, magic,
    /// version (in that order); the view reads the fields.
    pub fn check<'a>(&'static self, bytes: &'a [u8], len: Len) -> Result<Checked<'a>, WireError> {
        record("wire", bytes);
        if bytes.iter().all(|b| *b == 0) {
            return Err(WireError::Absent {
                format: self.name,
                magic: self.magic,
            });
        }
        let least = match len {
            Len::Exactly(n) | Len::AtLeast(n) => n,
        };
        debug_assert!(
            least >= self.header_len(),
            "{} is shorter than its header",
            self.name
        );
        if !len.accepts(bytes.len()) {
            return Err(WireError::Length {
                format: self.name,
                got: bytes.len(),
                expected: len,
            });
        }
        if bytes[0..4] != *self.magic.as_bytes() {
            return Err(WireError::Magic {
                format: self.name,
                got: String::from_utf8_lossy(&bytes[0..4]).into_owned(),
                expected: self.magic,
            });
        }
        if let Some(speaks) = self.version {
            if bytes[4] != speaks {
                return Err(WireError::Version {
                    format: self.name,
                    got: bytes[4],
                    speaks,
                });
            }
        }
        Ok(Checked {
            header: self,
            bytes,
        })
    }
}

/// Bytes whose length, magic and version [`Header::check`] found right:
/// their fields, read big-endian at byte offsets within that length.
#[derive(Debug, Clone, Copy)]
pub struct Checked<'a> {
    header: &'static Header,
    bytes: &'a [u8],
}

impl<'a> Checked<'a> {
    /// All the bytes, header included.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Bytes `range` of the message. Like every reader of the view, it
    /// panics past the end of the bytes: the offsets are the format's own,
    /// inside the length [`Header::check`] accepted.
    pub fn slice(&self, range: Range<usize>) -> &'a [u8] {
        &self.bytes[range]
    }

    /// The byte at offset `at`.
    pub fn u8(&self, at: usize) -> u8 {
        self.bytes[at]
    }

    /// The big-endian `u16` at bytes `at..at + 2`.
    pub fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes(self.array(at))
    }

    /// The big-endian `u32` at bytes `at..at + 4`.
    pub fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.array(at))
    }

    /// The big-endian `u64` at bytes `at..at + 8`.
    pub fn u64(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.array(at))
    }

    /// A copy of the `N` bytes at `at..at + N` (a GID, a fixed-size name).
    pub fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[at..at + N]);
        out
    }

    /// The error of a field of this format that holds `value` where only
    /// `allowed` may be.
    pub fn field_error(
        &self,
        field: &'static str,
        value: impl fmt::Display,
        allowed: &'static str,
    ) -> WireError {
        WireError::Field {
            format: self.header.name,
            field,
            value: value.to_string(),
            allowed,
        }
    }
}

/// Writes big-endian fields into a message being built.
#[derive(Debug)]
pub struct Emit<'a>(pub &'a mut [u8]);

impl Emit<'_> {
    /// Writes `v` at offset `at`. Like every writer here, it panics when
    /// the bytes do not fit the buffer, and returns `self` for chaining.
    pub fn u8(&mut self, at: usize, v: u8) -> &mut Self {
        self.0[at] = v;
        self
    }

    /// Writes `v` big-endian at bytes `at..at + 2`.
    pub fn u16(&mut self, at: usize, v: u16) -> &mut Self {
        self.bytes(at, &v.to_be_bytes())
    }

    /// Writes `v` big-endian at bytes `at..at + 4`.
    pub fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.bytes(at, &v.to_be_bytes())
    }

    /// Writes `v` big-endian at bytes `at..at + 8`.
    pub fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.bytes(at, &v.to_be_bytes())
    }

    /// Copies `v` to bytes `at..at + v.len()`.
    pub fn bytes(&mut self, at: usize, v: &[u8]) -> &mut Self {
        self.0[at..at + v.len()].copy_from_slice(v);
        self
    }
}

/// Test hook, debug builds only: with `PINPOLL_RECORD_WIRE=DIR` set, saves
/// `bytes`, which a decoder was given, as the file `DIR/CORPUS/HASH`
/// (named by content, so a message seen twice is saved once) for the fuzz
/// target `corpus`. `scripts/record-corpus.sh` runs real sessions with it
/// set. Failures to save are ignored: the hook never changes an outcome.
/// Release builds, and debug builds without the variable, record nothing
/// (and allocate nothing). A process records at most [`MAX_RECORDS`]
/// distinct messages: its peers choose how many they send.
pub fn record(corpus: &str, bytes: &[u8]) {
    const RECORD_ENV: &str = "PINPOLL_RECORD_WIRE";
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    static RECORDED: AtomicUsize = AtomicUsize::new(0);
    if !cfg!(debug_assertions) {
        return;
    }
    let Some(dir) = DIR.get_or_init(|| std::env::var_os(RECORD_ENV).map(PathBuf::from)) else {
        return;
    };
    // SipHash with fixed keys: the same bytes get the same name in every
    // process, so the processes of a session share one copy.
    let mut hasher = DefaultHasher::new();
    hasher.write(bytes);
    let dir = dir.join(corpus);
    let file = dir.join(format!("{:016x}", hasher.finish()));
    // A message seen before (a credit per chunk) costs no record.
    if file.exists() || !take_a_record(&RECORDED) {
        return;
    }
    let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, bytes));
    if let Err(e) = saved {
        tracing::warn!(error = %e, corpus, "{RECORD_ENV}: could not record a message");
    }
}

/// The most messages one process records under `PINPOLL_RECORD_WIRE`.
pub const MAX_RECORDS: usize = 10_000;

/// Counts one more record in `recorded`; false once [`MAX_RECORDS`] were
/// taken (said once).
fn take_a_record(recorded: &AtomicUsize) -> bool {
    let taken = recorded.fetch_add(1, Ordering::Relaxed);
    if taken == MAX_RECORDS {
        tracing::warn!("PINPOLL_RECORD_WIRE: {MAX_RECORDS} messages recorded; no more");
    }
    // Saturates far below wrapping: counting stops mattering past the cap.
    if taken > MAX_RECORDS {
        recorded.store(MAX_RECORDS + 1, Ordering::Relaxed);
    }
    taken < MAX_RECORDS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_records_at_most_max_records_messages() {
        let recorded = AtomicUsize::new(0);
        let taken = (0..MAX_RECORDS + 50)
            .filter(|_| take_a_record(&recorded))
            .count();
        assert_eq!(taken, MAX_RECORDS);
        assert!(!take_a_record(&recorded));
    }

    static TEST: Header = Header::new("test message", "TEST", Some(3));

    fn good() -> [u8; 12] {
        let mut b = [0u8; 12];
        TEST.emit(&mut b);
        Emit(&mut b).u16(6, 0xbeef).u32(8, 0x0102_0304);
        b
    }

    #[test]
    fn a_good_message_reads_back_its_fields() {
        let b = good();
        let v = TEST.check(&b, Len::Exactly(12)).unwrap();
        assert_eq!((v.u8(4), v.u16(6), v.u32(8)), (3, 0xbeef, 0x0102_0304));
        assert!(TEST.check(&b, Len::AtLeast(5)).is_ok());
    }

    #[test]
    fn each_header_check_names_the_format_and_what_is_allowed() {
        let b = good();
        let err = |bytes: &[u8], len| TEST.check(bytes, len).unwrap_err().to_string();
        assert_eq!(
            err(&b[..7], Len::Exactly(12)),
            "test message: 7 bytes, expected 12"
        );
        assert_eq!(
            err(&b[..7], Len::AtLeast(8)),
            "test message: 7 bytes, shorter than the 8-byte header"
        );
        assert_eq!(
            err(&[0; 12], Len::Exactly(12)),
            "not a test message: no TEST header (the bytes are all zeros)"
        );
        let mut m = b;
        m[0] = b'X';
        assert_eq!(
            err(&m, Len::Exactly(12)),
            "not a test message: wrong magic \"XEST\", expected \"TEST\""
        );
        let mut v = b;
        v[4] = 9;
        assert_eq!(
            err(&v, Len::Exactly(12)),
            "test message: version 9 (this side speaks 3)"
        );
        let view = TEST.check(&b, Len::Exactly(12)).unwrap();
        assert_eq!(
            view.field_error("flag", 7, "0 or 1").to_string(),
            "test message: flag 7 is out of range: allowed 0 or 1"
        );
    }
}
