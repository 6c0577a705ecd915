//! `readwrite`'s wire formats. Fixed size, big-endian, versioned, and
//! checked field by field: these bytes come from the network.
//!
//! 1. The client's rdma_cm connect private data is a [`Hello`]: magic
//!    `PPRW`, version, mode. The server registers its region for that mode
//!    before accepting, and rejects anything else with a reason the client
//!    prints.
//! 2. The server SENDs a [`pinpoll::connect::RegionDescriptor`] (address,
//!    length, rkey) of its region.
//! 3. The client RDMA-WRITEs or RDMA-READs, then SENDs a [`Done`] with the
//!    number of bytes it moved, after which both disconnect.

use std::fmt;

use pinpoll::wire::{Header, Len, WireError};
use pinpoll::Access;

/// The version of this protocol; a peer with another one is refused.
pub const VERSION: u8 = 1;
static HELLO: Header = Header::new("readwrite client", "PPRW", Some(VERSION));
/// The done message has no version: the hello settled it.
static DONE: Header = Header::new("readwrite done message", "PPDN", None);

/// What the client does to the server's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// RDMA WRITE the message into the server's region.
    Write,
    /// RDMA READ the server's message from its region.
    Read,
}

impl Mode {
    /// The mode's byte in a [`Hello`].
    pub fn code(self) -> u8 {
        match self {
            Mode::Write => 1,
            Mode::Read => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Mode> {
        match code {
            1 => Some(Mode::Write),
            2 => Some(Mode::Read),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Write => "write",
            Mode::Read => "read",
        }
    }

    /// The fewest access rights the server's region needs in this mode: the
    /// peer writes into it (and remote write requires local write), or the
    /// peer only reads it.
    pub fn region_access(self) -> Access {
        match self {
            Mode::Write => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            Mode::Read => Access::REMOTE_READ,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The client's connect private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub mode: Mode,
}

impl Hello {
    pub const LEN: usize = 6;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        HELLO.emit(&mut b);
        b[5] = self.mode.code();
        b
    }

    /// Decodes from the front of `b`: rdma_cm pads private data with zeros.
    /// The error's text goes back to the client in the reject (it fits the
    /// 148 bytes rdma_cm carries).
    pub fn decode(b: &[u8]) -> Result<Hello, WireError> {
        pinpoll::wire::record("readwrite", b);
        let v = HELLO.check(b, Len::AtLeast(Self::LEN))?;
        let mode = Mode::from_code(v.u8(5))
            .ok_or_else(|| v.field_error("mode", v.u8(5), "1 (write) or 2 (read)"))?;
        Ok(Hello { mode })
    }
}

/// The client's last message: it has finished with the region, having moved
/// `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub len: u32,
}

impl Done {
    pub const LEN: usize = 8;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        DONE.emit(&mut b);
        b[4..8].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Done, WireError> {
        pinpoll::wire::record("readwrite", b);
        let v = DONE.check(b, Len::Exactly(Self::LEN))?;
        Ok(Done { len: v.u32(4) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_with_padding() {
        for mode in [Mode::Write, Mode::Read] {
            let mut padded = Hello { mode }.encode().to_vec();
            padded.resize(56, 0);
            assert_eq!(Hello::decode(&padded), Ok(Hello { mode }));
        }
    }

    #[test]
    fn hello_rejects_each_bad_field_with_a_reason() {
        let good = Hello { mode: Mode::Read }.encode();
        let absent = |e| matches!(e, Err(WireError::Absent { .. }));
        assert!(absent(Hello::decode(&[])));
        assert!(absent(Hello::decode(&[0; 56])));
        assert!(matches!(
            Hello::decode(&good[..5]),
            Err(WireError::Length { got: 5, .. })
        ));
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(Hello::decode(&b), Err(WireError::Magic { .. })));
        let mut b = good;
        b[4] = 2;
        assert!(matches!(
            Hello::decode(&b),
            Err(WireError::Version { got: 2, .. })
        ));
        let mut reasons = Vec::new();
        for code in [0u8, 3, 9, 255] {
            let mut b = good;
            b[5] = code;
            let err = Hello::decode(&b).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!(
                    "readwrite client: mode {code} is out of range: allowed 1 (write) or 2 (read)"
                )),
                "{err}"
            );
            reasons.push(err);
        }
        // The reasons of foreign clients say so first.
        let foreign = [Hello::decode(&[]), Hello::decode(b"PPFX\x02\0")];
        for err in foreign {
            let err = err.unwrap_err().to_string();
            assert!(err.starts_with("not a readwrite client: "), "{err}");
        }
        // Every reason fits an rdma_cm reject (148 bytes with the NUL).
        reasons.extend([
            Hello::decode(&good[..1]).unwrap_err(),
            Hello::decode(&[]).unwrap_err(),
            Hello::decode(&[0xff; 6]).unwrap_err(),
            Hello::decode(&[b'P', b'P', b'R', b'W', 255, 1]).unwrap_err(),
        ]);
        for err in reasons {
            assert!(err.to_string().len() < 148, "{err}");
        }
    }

    #[test]
    fn modes_register_the_fewest_access_rights() {
        assert_eq!(
            Mode::Write.region_access(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        );
        assert_eq!(Mode::Read.region_access(), Access::REMOTE_READ);
        assert!(!Mode::Read.region_access().contains(Access::LOCAL_WRITE));
    }

    #[test]
    fn done_round_trips_and_rejects_junk() {
        let d = Done { len: 4096 };
        assert_eq!(Done::decode(&d.encode()).unwrap(), d);
        assert!(Done::decode(&d.encode()[..7]).is_err());
        assert!(Done::decode(b"PPRW\0\0\0\x01").is_err());
    }
}
