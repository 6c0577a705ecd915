//! Wire formats exchanged while connecting: the out-of-band connection
//! record, and the region descriptor carried in rdma_cm private data.
//! Big-endian, fixed size, versioned, and validated field by field: these
//! bytes come from the network.

use crate::error::{Error, Result};
use crate::sys::mr::RemoteSlice;

const RECORD_MAGIC: [u8; 4] = *b"PPCR";
const REGION_MAGIC: [u8; 4] = *b"PPRD";
const VERSION: u8 = 1;

/// Everything a peer needs to move its QP to RTR towards ours, plus the
/// memory it may RDMA into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub qpn: u32,
    /// First packet sequence number, random, 24 bits.
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    pub gid_index: u8,
    /// `enum ibv_mtu` (1..=5).
    pub mtu: u8,
    pub region: Option<RemoteSlice>,
}

impl ConnectionRecord {
    pub const LEN: usize = 64;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&RECORD_MAGIC);
        b[4] = VERSION;
        b[5] = self.gid_index;
        b[6] = self.mtu;
        b[7] = u8::from(self.region.is_some());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        b[18..34].copy_from_slice(&self.gid);
        if let Some(r) = self.region {
            b[34..42].copy_from_slice(&r.addr.to_be_bytes());
            b[42..50].copy_from_slice(&r.len.to_be_bytes());
            b[50..54].copy_from_slice(&r.rkey.to_be_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<ConnectionRecord> {
        let bad = |m: String| Error::BadRecord(m);
        if b.len() != Self::LEN {
            return Err(bad(format!("{} bytes, expected {}", b.len(), Self::LEN)));
        }
        if b[0..4] != RECORD_MAGIC {
            return Err(bad(
                "wrong magic: the peer is not a pinpoll out-of-band endpoint".into(),
            ));
        }
        if b[4] != VERSION {
            return Err(bad(format!(
                "version {} (this side speaks {VERSION})",
                b[4]
            )));
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let qpn = u32_at(8);
        let psn = u32_at(12);
        if qpn == 0 || qpn > 0xff_ffff {
            return Err(bad(format!(
                "QP number {qpn:#x} is not a 24-bit non-zero QPN"
            )));
        }
        if psn > 0xff_ffff {
            return Err(bad(format!("PSN {psn:#x} exceeds 24 bits")));
        }
        let mtu = b[6];
        if !(1..=5).contains(&mtu) {
            return Err(bad(format!(
                "MTU code {mtu} is not 1 (256 B) ..= 5 (4096 B)"
            )));
        }
        let region = match b[7] {
            0 => None,
            1 => Some(RemoteSlice {
                addr: u64_at(34),
                len: u64_at(42),
                rkey: u32_at(50),
            }),
            f => return Err(bad(format!("region flag {f} is not 0 or 1"))),
        };
        if let Some(r) = region {
            if r.addr.checked_add(r.len).is_none() {
                return Err(bad(format!(
                    "region {:#x}+{} wraps the address space",
                    r.addr, r.len
                )));
            }
        }
        Ok(ConnectionRecord {
            qpn,
            psn,
            lid: u16::from_be_bytes([b[16], b[17]]),
            gid: b[18..34].try_into().expect("16 bytes"),
            gid_index: b[5],
            mtu,
            region,
        })
    }
}

/// A memory region descriptor (address, length, rkey) small enough for the
/// 56 bytes of private data an RC connect request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDescriptor(pub RemoteSlice);

impl RegionDescriptor {
    pub const LEN: usize = 28;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&REGION_MAGIC);
        b[4] = VERSION;
        b[8..16].copy_from_slice(&self.0.addr.to_be_bytes());
        b[16..24].copy_from_slice(&self.0.len.to_be_bytes());
        b[24..28].copy_from_slice(&self.0.rkey.to_be_bytes());
        b
    }

    /// Decodes from the front of `b` (rdma_cm may pad private data with zeros).
    pub fn decode(b: &[u8]) -> Result<RegionDescriptor> {
        if b.len() < Self::LEN {
            return Err(Error::BadRecord(format!(
                "region descriptor of {} bytes, expected {}",
                b.len(),
                Self::LEN
            )));
        }
        if b[0..4] != REGION_MAGIC || b[4] != VERSION {
            return Err(Error::BadRecord(
                "the bytes are not a pinpoll region descriptor (wrong magic or version)".into(),
            ));
        }
        let addr = u64::from_be_bytes(b[8..16].try_into().expect("8 bytes"));
        let len = u64::from_be_bytes(b[16..24].try_into().expect("8 bytes"));
        let rkey = u32::from_be_bytes(b[24..28].try_into().expect("4 bytes"));
        if addr.checked_add(len).is_none() {
            return Err(Error::BadRecord(format!(
                "region {addr:#x}+{len} wraps the address space"
            )));
        }
        Ok(RegionDescriptor(RemoteSlice { addr, len, rkey }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ConnectionRecord {
        ConnectionRecord {
            qpn: 0x11,
            psn: 0xabcdef,
            lid: 0,
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x50, 0, 1,
            ],
            gid_index: 1,
            mtu: 3,
            region: Some(RemoteSlice {
                addr: 0x7f00_0000_1000,
                len: 4096,
                rkey: 0x1234,
            }),
        }
    }

    #[test]
    fn record_round_trips() {
        let r = record();
        assert_eq!(ConnectionRecord::decode(&r.encode()).unwrap(), r);
        let no_region = ConnectionRecord { region: None, ..r };
        assert_eq!(
            ConnectionRecord::decode(&no_region.encode()).unwrap(),
            no_region
        );
    }

    #[test]
    fn record_rejects_each_bad_field() {
        let good = record().encode();
        let cases: [(usize, u8, &str); 5] = [
            (0, b'X', "wrong magic"),
            (4, 9, "version 9"),
            (6, 0, "MTU code 0"),
            (7, 2, "region flag 2"),
            (12, 0x01, "PSN 0x1abcdef exceeds 24 bits"),
        ];
        for (at, value, expected) in cases {
            let mut b = good;
            b[at] = value;
            let err = ConnectionRecord::decode(&b).unwrap_err().to_string();
            assert!(err.contains(expected), "byte {at}={value}: {err}");
        }
        assert!(ConnectionRecord::decode(&good[..63])
            .unwrap_err()
            .to_string()
            .contains("63 bytes"));
        let mut zero_qpn = good;
        zero_qpn[8..12].copy_from_slice(&[0; 4]);
        assert!(ConnectionRecord::decode(&zero_qpn).is_err());
        let mut wrap = good;
        wrap[34..42].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(ConnectionRecord::decode(&wrap)
            .unwrap_err()
            .to_string()
            .contains("wraps"));
    }

    #[test]
    fn region_descriptor_round_trips_with_padding_and_rejects_junk() {
        let d = RegionDescriptor(RemoteSlice {
            addr: 42,
            len: 7,
            rkey: 9,
        });
        let mut padded = d.encode().to_vec();
        padded.resize(56, 0);
        assert_eq!(RegionDescriptor::decode(&padded).unwrap(), d);
        assert!(RegionDescriptor::decode(&[0u8; 56]).is_err());
        assert!(RegionDescriptor::decode(&d.encode()[..10]).is_err());
    }
}
