//! The native filexfer wire formats. Big-endian, versioned, and decoded
//! field by field with every length checked: these bytes come from the
//! network.
//!
//! Connect private data: the client's ring descriptor
//! ([`RegionDescriptor`], which the engine's connection handshake puts
//! first), then [`HELLO`] (8 bytes): `PPFX`, version, 0 (a transfer's
//! first stream), 2 zero bytes — or for each further stream of a
//! `--streams N` transfer [`join_hello`] (18 bytes): `PPFX`, version, 1
//! (join), 2 zero bytes, the token from the transfer's `Ready` (u64), the
//! stream's index (u16, `1..N`). rdma_cm pads private data with zeros, so a
//! classic client's (none) arrives as all zeros and never matches.
//!
//! Every control message (SEND) starts with an 8-byte header: `PPFX`,
//! version, kind, 2 zero bytes; then the kind's body, exact length:
//!
//! | kind | message    | body |
//! |------|------------|------|
//! | 1    | `Start`    | size u64, streams u16 (1..=16), name length u16, name (1..=255 bytes) |
//! | 2    | `Ready`    | slots u32, slot size u32 (each stream's ring), token u64 (for the joining streams) |
//! | 3    | `Credit`   | count u32 |
//! | 4    | `Finish`   | size u64, BLAKE3 digest of the file (32 bytes) |
//! | 5    | `Complete` | size u64 |
//! | 6    | `Fail`     | code u16, message length u16, message (UTF-8, ≤ 1024 bytes; other bytes are refused) |
//!
//! Chunks are not messages: each is an RDMA WRITE_WITH_IMM of its data
//! followed by its 32-byte BLAKE3 chaining value (see
//! [`digest`](super::digest)) into the slot the immediate names.

use std::fmt;

use pinpoll::connect::RegionDescriptor;
use pinpoll::wire::{Header, Len};

use crate::filexfer::name::MAX_NAME;

const MAGIC: [u8; 4] = *b"PPFX";
/// The protocol version; a peer with another one is refused. Version 2
/// replaced version 1's whole-file SHA-256 with BLAKE3; version 3 replaced
/// version 2's per-chunk CRC32C and second pass over the file with one
/// BLAKE3 pass: each chunk carries its chaining value, and the values
/// merge into the file's digest.
pub const VERSION: u8 = 3;
/// The header every control message starts with (kind and two reserved
/// bytes follow).
static WIRE: Header = Header::new("filexfer message", "PPFX", Some(VERSION));
/// The client's connect private data, after its ring descriptor.
pub const HELLO: [u8; 8] = [b'P', b'P', b'F', b'X', VERSION, 0, 0, 0];
/// The most streams (queue pairs) one transfer may use.
pub const MAX_STREAMS: u16 = 16;

/// The connect private data of stream `stream` (`1..N`) of the transfer
/// whose `Ready` gave `token`, after the stream's ring descriptor.
pub fn join_hello(token: u64, stream: u16) -> [u8; 18] {
    let mut b = [0u8; 18];
    b[..8].copy_from_slice(&HELLO);
    b[5] = 1;
    b[8..16].copy_from_slice(&token.to_be_bytes());
    b[16..].copy_from_slice(&stream.to_be_bytes());
    b
}
/// The longest `Fail` message.
pub const MAX_FAIL: usize = 1024;
const HEADER: usize = 8;
/// Bytes of an encoded `Credit` (the hot path's only message).
pub const CREDIT_LEN: usize = HEADER + 4;

/// What the connect private data says the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hello {
    /// `PPFX` and this side's [`VERSION`]: a transfer's first stream.
    Native,
    /// A further stream of the transfer whose `Ready` gave `token`.
    Join { token: u64, stream: u16 },
    /// No private data at all (all zeros): a classic client.
    Classic,
}

/// Classifies connect private data: a native hello follows the client's
/// ring descriptor.
pub fn classify_hello(private: &[u8]) -> Result<Hello, String> {
    pinpoll::wire::record("filexfer_hello", private);
    let hello = private.get(RegionDescriptor::LEN..).unwrap_or(&[]);
    if hello.len() >= HELLO.len() && hello[..4] == MAGIC {
        if hello[4] != VERSION {
            return Err(format!(
                "filexfer protocol version {} is not supported (this server speaks {VERSION})",
                hello[4]
            ));
        }
        return match hello[5] {
            0 => Ok(Hello::Native),
            1 if hello.len() >= 18 => Ok(Hello::Join {
                token: u64::from_be_bytes(hello[8..16].try_into().expect("8 bytes")),
                stream: u16::from_be_bytes([hello[16], hello[17]]),
            }),
            kind => Err(format!("a filexfer hello of unknown kind {kind}")),
        };
    }
    if private.iter().all(|b| *b == 0) {
        return Ok(Hello::Classic);
    }
    if private.starts_with(&MAGIC) {
        return Err(
            "the filexfer client sends its hello without a ring descriptor first (an older client); upgrade it"
                .into(),
        );
    }
    Err("the connect request is not from a filexfer client (unknown private data)".into())
}

/// Why a transfer failed, as the peer is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailCode {
    /// The request was malformed (e.g. a bad file name).
    BadRequest,
    /// The target file already exists.
    Exists,
    /// A local I/O error (create, write, fsync, link).
    Io,
    /// A chunk or digest mismatch, or a size that does not add up.
    Integrity,
    /// A message or write that breaks the protocol.
    Protocol,
    /// The file is larger than the server takes (`--max-size`).
    TooLarge,
    /// The transfer fell below the server's `--min-rate` or exceeded its
    /// `--deadline`.
    TooSlow,
    /// Any code this side does not know.
    Other(u16),
}

impl FailCode {
    pub fn code(self) -> u16 {
        match self {
            FailCode::BadRequest => 1,
            FailCode::Exists => 2,
            FailCode::Io => 3,
            FailCode::Integrity => 4,
            FailCode::Protocol => 5,
            FailCode::TooLarge => 6,
            FailCode::TooSlow => 7,
            FailCode::Other(n) => n,
        }
    }

    pub fn from_code(code: u16) -> FailCode {
        match code {
            1 => FailCode::BadRequest,
            2 => FailCode::Exists,
            3 => FailCode::Io,
            4 => FailCode::Integrity,
            5 => FailCode::Protocol,
            6 => FailCode::TooLarge,
            7 => FailCode::TooSlow,
            n => FailCode::Other(n),
        }
    }
}

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Start {
        size: u64,
        /// Queue pairs the transfer uses, `1..=MAX_STREAMS`.
        streams: u16,
        name: Vec<u8>,
    },
    Ready {
        slots: u32,
        slot_size: u32,
        token: u64,
    },
    Credit {
        count: u32,
    },
    /// The whole file's size and BLAKE3 digest.
    Finish {
        size: u64,
        digest: [u8; 32],
    },
    Complete {
        size: u64,
    },
    Fail {
        code: FailCode,
        message: String,
    },
}

/// A message that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMessage(pub String);

impl fmt::Display for BadMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad message from the peer: {}", self.0)
    }
}

impl std::error::Error for BadMessage {}

fn header(kind: u8) -> [u8; HEADER] {
    let mut b = [0u8; HEADER];
    WIRE.emit(&mut b);
    b[5] = kind;
    b
}

/// `Credit{count}` into a fixed array: no allocation per chunk.
pub fn credit(count: u32) -> [u8; CREDIT_LEN] {
    let mut b = [0u8; CREDIT_LEN];
    b[..HEADER].copy_from_slice(&header(3));
    b[HEADER..].copy_from_slice(&count.to_be_bytes());
    b
}

impl Msg {
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Start { .. } => "Start",
            Msg::Ready { .. } => "Ready",
            Msg::Credit { .. } => "Credit",
            Msg::Finish { .. } => "Finish",
            Msg::Complete { .. } => "Complete",
            Msg::Fail { .. } => "Fail",
        }
    }

    /// The bytes of this message. A `Start` name or `Fail` message longer
    /// than its limit is cut to it (a name too long is refused before).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        match self {
            Msg::Start {
                size,
                streams,
                name,
            } => {
                let name = &name[..name.len().min(MAX_NAME)];
                b.extend_from_slice(&header(1));
                b.extend_from_slice(&size.to_be_bytes());
                b.extend_from_slice(&streams.to_be_bytes());
                b.extend_from_slice(&(name.len() as u16).to_be_bytes());
                b.extend_from_slice(name);
            }
            Msg::Ready {
                slots,
                slot_size,
                token,
            } => {
                b.extend_from_slice(&header(2));
                b.extend_from_slice(&slots.to_be_bytes());
                b.extend_from_slice(&slot_size.to_be_bytes());
                b.extend_from_slice(&token.to_be_bytes());
            }
            Msg::Credit { count } => b.extend_from_slice(&credit(*count)),
            Msg::Finish { size, digest } => {
                b.extend_from_slice(&header(4));
                b.extend_from_slice(&size.to_be_bytes());
                b.extend_from_slice(digest);
            }
            Msg::Complete { size } => {
                b.extend_from_slice(&header(5));
                b.extend_from_slice(&size.to_be_bytes());
            }
            Msg::Fail { code, message } => {
                let mut cut = message.len().min(MAX_FAIL);
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                let message = &message.as_bytes()[..cut];
                b.extend_from_slice(&header(6));
                b.extend_from_slice(&code.code().to_be_bytes());
                b.extend_from_slice(&(message.len() as u16).to_be_bytes());
                b.extend_from_slice(message);
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Msg, BadMessage> {
        pinpoll::wire::record("filexfer_message", b);
        let bad = |m: String| Err(BadMessage(m));
        if let Err(err) = WIRE.check(b, Len::AtLeast(HEADER)) {
            return bad(err.to_string());
        }
        if b[6..8] != [0, 0] {
            return bad("reserved header bytes are not zero".into());
        }
        let body = &b[HEADER..];
        let u16_at = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(body[i..i + 8].try_into().expect("8 bytes"));
        let exact = |name: &str, want: usize| {
            if body.len() == want {
                Ok(())
            } else {
                Err(BadMessage(format!(
                    "{name} with a {}-byte body, expected {want}",
                    body.len()
                )))
            }
        };
        match b[5] {
            1 => decode_start(body),
            2 => {
                exact("Ready", 16)?;
                Ok(Msg::Ready {
                    slots: u32_at(0),
                    slot_size: u32_at(4),
                    token: u64_at(8),
                })
            }
            3 => {
                exact("Credit", 4)?;
                Ok(Msg::Credit { count: u32_at(0) })
            }
            4 => {
                exact("Finish", 40)?;
                Ok(Msg::Finish {
                    size: u64_at(0),
                    digest: body[8..40].try_into().expect("32 bytes"),
                })
            }
            5 => {
                exact("Complete", 8)?;
                Ok(Msg::Complete { size: u64_at(0) })
            }
            6 => {
                if body.len() < 4 {
                    return bad(format!(
                        "Fail with a {}-byte body, expected at least 4",
                        body.len()
                    ));
                }
                let len = usize::from(u16_at(2));
                if len > MAX_FAIL {
                    return bad(format!(
                        "Fail with a {len}-byte message, at most {MAX_FAIL}"
                    ));
                }
                exact("Fail", 4 + len)?;
                // Strictly: a lossy decoding would hold up to three times
                // the bytes sent, and not the bytes sent.
                let Ok(message) = std::str::from_utf8(&body[4..]) else {
                    return bad("a Fail message that is not UTF-8".into());
                };
                Ok(Msg::Fail {
                    code: FailCode::from_code(u16_at(0)),
                    message: message.to_owned(),
                })
            }
            k => bad(format!("unknown message kind {k}")),
        }
    }
}

/// The body of a `Start`: size, streams, name, each checked.
fn decode_start(body: &[u8]) -> Result<Msg, BadMessage> {
    let bad = |m: String| Err(BadMessage(m));
    if body.len() < 12 {
        return bad(format!(
            "Start with a {}-byte body, expected at least 12",
            body.len()
        ));
    }
    let streams = u16::from_be_bytes([body[8], body[9]]);
    if !(1..=MAX_STREAMS).contains(&streams) {
        return bad(format!(
            "Start with {streams} streams, expected 1..={MAX_STREAMS}"
        ));
    }
    let len = usize::from(u16::from_be_bytes([body[10], body[11]]));
    if len == 0 || len > MAX_NAME {
        return bad(format!(
            "Start with a {len}-byte name, expected 1..={MAX_NAME}"
        ));
    }
    if body.len() != 12 + len {
        return bad(format!(
            "Start with a {}-byte body, expected {}",
            body.len(),
            12 + len
        ));
    }
    Ok(Msg::Start {
        size: u64::from_be_bytes(body[..8].try_into().expect("8 bytes")),
        streams,
        name: body[12..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Msg> {
        vec![
            Msg::Start {
                size: 0,
                streams: 1,
                name: b"a".to_vec(),
            },
            Msg::Start {
                size: u64::MAX,
                streams: MAX_STREAMS,
                name: vec![b'n'; 255],
            },
            Msg::Ready {
                slots: 16,
                slot_size: 262144,
                token: u64::MAX - 5,
            },
            Msg::Credit { count: 1 },
            Msg::Finish {
                size: 7,
                digest: [9; 32],
            },
            Msg::Complete { size: 1 << 40 },
            Msg::Fail {
                code: FailCode::Exists,
                message: "already there".into(),
            },
            Msg::Fail {
                code: FailCode::Other(77),
                message: String::new(),
            },
            Msg::Fail {
                code: FailCode::TooLarge,
                message: "too large".into(),
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            assert_eq!(Msg::decode(&m.encode()), Ok(m.clone()), "{m:?}");
        }
        assert_eq!(credit(3).to_vec(), Msg::Credit { count: 3 }.encode());
    }

    #[test]
    fn bad_bytes_are_named() {
        let good = Msg::Ready {
            slots: 1,
            slot_size: 64,
            token: 9,
        }
        .encode();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..5].to_vec(), "shorter than"),
            (
                {
                    let mut b = good.clone();
                    b[0] = b'X';
                    b
                },
                "wrong magic",
            ),
            (
                {
                    let mut b = good.clone();
                    b[4] = 2;
                    b
                },
                "version 2",
            ),
            (
                {
                    let mut b = good.clone();
                    b[5] = 42;
                    b
                },
                "unknown message kind 42",
            ),
            (
                {
                    let mut b = good.clone();
                    b[7] = 1;
                    b
                },
                "reserved",
            ),
            (
                {
                    let mut b = good.clone();
                    b.push(0);
                    b
                },
                "Ready with a 17-byte body",
            ),
            (
                Msg::Start {
                    size: 1,
                    streams: 1,
                    name: b"ab".to_vec(),
                }
                .encode()[..21]
                    .to_vec(),
                "Start with a 13-byte body, expected 14",
            ),
            (
                {
                    let mut b = Msg::Start {
                        size: 1,
                        streams: 1,
                        name: b"a".to_vec(),
                    }
                    .encode();
                    b[18..20].copy_from_slice(&0u16.to_be_bytes());
                    b
                },
                "0-byte name",
            ),
            (
                {
                    let mut b = Msg::Start {
                        size: 1,
                        streams: 1,
                        name: b"a".to_vec(),
                    }
                    .encode();
                    b[18..20].copy_from_slice(&300u16.to_be_bytes());
                    b
                },
                "300-byte name",
            ),
            (
                {
                    let mut b = Msg::Start {
                        size: 1,
                        streams: 1,
                        name: b"a".to_vec(),
                    }
                    .encode();
                    b[16..18].copy_from_slice(&17u16.to_be_bytes());
                    b
                },
                "Start with 17 streams, expected 1..=16",
            ),
            (
                {
                    let mut b = Msg::Fail {
                        code: FailCode::Io,
                        message: "x".into(),
                    }
                    .encode();
                    b[10..12].copy_from_slice(&5000u16.to_be_bytes());
                    b
                },
                "5000-byte message",
            ),
        ];
        for (bytes, expected) in cases {
            let err = Msg::decode(&bytes).unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }

    /// A native client's private data as the engine's handshake sends
    /// it: its ring descriptor, the hello, zero padding.
    fn native(hello: &[u8]) -> Vec<u8> {
        let ring = pinpoll::RemoteSlice {
            addr: 0x7f00_0000_1000,
            len: 4 << 20,
            rkey: 0x1234,
        };
        let mut b = RegionDescriptor(ring).encode().to_vec();
        b.extend_from_slice(hello);
        b.resize(56, 0);
        b
    }

    #[test]
    fn hellos_are_told_apart() {
        assert_eq!(classify_hello(&native(&HELLO)), Ok(Hello::Native));
        assert_eq!(classify_hello(&[0; 56]), Ok(Hello::Classic));
        assert_eq!(classify_hello(&[]), Ok(Hello::Classic));
        let mut v1 = HELLO;
        v1[4] = 1;
        assert!(classify_hello(&native(&v1))
            .unwrap_err()
            .contains("version 1"));
        assert!(classify_hello(&native(b"PPRW\x01\x01\0\0"))
            .unwrap_err()
            .contains("not from a filexfer client"));
        // The hello alone, where it was before the descriptor came first.
        let mut alone = HELLO.to_vec();
        alone.resize(56, 0);
        assert!(classify_hello(&alone)
            .unwrap_err()
            .contains("without a ring descriptor"));
        // A descriptor with nothing after it: no hello.
        assert!(classify_hello(&native(&[])).is_err());
        // A further stream names its transfer and its index.
        assert_eq!(
            classify_hello(&native(&join_hello(0x0123_4567_89ab_cdef, 3))),
            Ok(Hello::Join {
                token: 0x0123_4567_89ab_cdef,
                stream: 3
            })
        );
        let mut odd = HELLO;
        odd[5] = 7;
        assert!(classify_hello(&native(&odd))
            .unwrap_err()
            .contains("unknown kind 7"));
    }

    /// Found by the fuzz target `filexfer_message`: a `Fail` whose message
    /// is not UTF-8 decoded lossily, to text that is not what was sent and
    /// up to three times longer than `MAX_FAIL` (each bad byte a 3-byte
    /// U+FFFD).
    #[test]
    fn a_fail_message_that_is_not_utf8_is_refused() {
        let crash = b"PPFX\x03\x06\0\0\xff\xfd\0\x02\xdf\xff";
        let err = Msg::decode(crash).unwrap_err().to_string();
        assert!(err.contains("a Fail message that is not UTF-8"), "{err}");
        let mut longest = header(6).to_vec();
        longest.extend_from_slice(&4u16.to_be_bytes());
        longest.extend_from_slice(&(MAX_FAIL as u16).to_be_bytes());
        longest.extend_from_slice(&[0xff; MAX_FAIL]);
        assert!(Msg::decode(&longest).is_err());
        longest[12..].fill(b'x');
        assert!(
            matches!(Msg::decode(&longest), Ok(Msg::Fail { message, .. }) if message.len() == MAX_FAIL)
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics_and_accepts_only_what_encodes_back(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(m) = Msg::decode(&bytes) {
                prop_assert_eq!(m.encode(), bytes);
            }
        }

        #[test]
        fn mutated_valid_messages_never_panic(i in 0usize..9, at in 0usize..300, value in any::<u8>(), cut in 0usize..300) {
            let mut b = samples()[i].encode();
            if at < b.len() { b[at] = value; }
            b.truncate(cut.max(1));
            let _ = Msg::decode(&b);
        }

        #[test]
        fn starts_round_trip(size in any::<u64>(), streams in 1..=MAX_STREAMS, name in proptest::collection::vec(any::<u8>(), 1..=255)) {
            let m = Msg::Start { size, streams, name };
            prop_assert_eq!(Msg::decode(&m.encode()), Ok(m));
        }
    }
}
