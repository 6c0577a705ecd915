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

use pinpoll::Access;

const HELLO_MAGIC: [u8; 4] = *b"PPRW";
const DONE_MAGIC: [u8; 4] = *b"PPDN";
/// The version of this protocol; a peer with another one is refused.
pub const VERSION: u8 = 1;

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

/// Why a connect request's private data is not a [`Hello`] this server
/// serves. The text goes back to the client in the reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloError {
    /// Fewer bytes than a hello.
    Short(usize),
    /// Nothing but the zeros rdma_cm pads private data with: the client sent
    /// none (e.g. a `basic` client).
    Missing,
    /// Other magic: not a readwrite client.
    Magic([u8; 4]),
    Version(u8),
    UnknownMode(u8),
}

impl fmt::Display for HelloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelloError::Short(n) => write!(
                f,
                "not a readwrite client: {n} bytes of connect private data, expected a {}-byte header",
                Hello::LEN
            ),
            HelloError::Missing => f.write_str(
                "not a readwrite client: the connect request carries no readwrite header",
            ),
            HelloError::Magic(m) => write!(
                f,
                "not a readwrite client: header magic {:?}, expected \"PPRW\"",
                String::from_utf8_lossy(m)
            ),
            HelloError::Version(v) => write!(
                f,
                "readwrite protocol version {v} is not supported (this server speaks {VERSION})"
            ),
            HelloError::UnknownMode(m) => write!(
                f,
                "unknown readwrite mode {m} (known: {} = write, {} = read)",
                Mode::Write.code(),
                Mode::Read.code()
            ),
        }
    }
}

impl std::error::Error for HelloError {}

impl Hello {
    pub const LEN: usize = 6;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC);
        b[4] = VERSION;
        b[5] = self.mode.code();
        b
    }

    /// Decodes from the front of `b`: rdma_cm pads private data with zeros.
    pub fn decode(b: &[u8]) -> Result<Hello, HelloError> {
        if b.iter().all(|x| *x == 0) {
            return Err(HelloError::Missing);
        }
        if b.len() < Self::LEN {
            return Err(HelloError::Short(b.len()));
        }
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != HELLO_MAGIC {
            return Err(HelloError::Magic(magic));
        }
        if b[4] != VERSION {
            return Err(HelloError::Version(b[4]));
        }
        let mode = Mode::from_code(b[5]).ok_or(HelloError::UnknownMode(b[5]))?;
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
        b[0..4].copy_from_slice(&DONE_MAGIC);
        b[4..8].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> anyhow::Result<Done> {
        anyhow::ensure!(
            b.len() == Self::LEN,
            "a done message has {} bytes, got {}",
            Self::LEN,
            b.len()
        );
        anyhow::ensure!(
            b[0..4] == DONE_MAGIC,
            "not a done message (magic {:?})",
            String::from_utf8_lossy(&b[0..4])
        );
        Ok(Done {
            len: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
        })
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
        assert_eq!(Hello::decode(&[]), Err(HelloError::Missing));
        assert_eq!(Hello::decode(&[0; 56]), Err(HelloError::Missing));
        assert_eq!(Hello::decode(&good[..5]), Err(HelloError::Short(5)));
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(Hello::decode(&b), Err(HelloError::Magic(_))));
        let mut b = good;
        b[4] = 2;
        assert_eq!(Hello::decode(&b), Err(HelloError::Version(2)));
        for code in [0u8, 3, 9, 255] {
            let mut b = good;
            b[5] = code;
            let err = Hello::decode(&b).unwrap_err();
            assert_eq!(err, HelloError::UnknownMode(code));
            assert!(
                err.to_string()
                    .starts_with(&format!("unknown readwrite mode {code} ")),
                "{err}"
            );
        }
        // Every reason fits an rdma_cm reject (148 bytes with the NUL).
        for err in [
            HelloError::Short(0),
            HelloError::Missing,
            HelloError::Magic([0xff; 4]),
            HelloError::Version(255),
            HelloError::UnknownMode(255),
        ] {
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
