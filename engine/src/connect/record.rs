//! Wire formats exchanged while connecting: the out-of-band connection
//! record, and the region descriptor carried in rdma_cm private data.
//! Big-endian, fixed size, versioned, and validated field by field: these
//! bytes come from the network.

use crate::error::{Error, Result};
use crate::sys::mr::RemoteSlice;
use crate::wire::{Checked, Emit, Header, Len, WireError};

static RECORD: Header = Header::new("pinpoll out-of-band endpoint", "PPCR", Some(1));
static REGION: Header = Header::new("pinpoll region descriptor", "PPRD", Some(1));

impl From<WireError> for Error {
    fn from(e: WireError) -> Error {
        Error::Wire(e)
    }
}

/// Everything a peer needs to move its QP to RTR towards ours, plus the
/// memory it may RDMA into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionRecord {
    /// The sender's queue pair number (24 bits, never 0): the peer's
    /// destination QP.
    pub qpn: u32,
    /// First packet sequence number, random, 24 bits.
    pub psn: u32,
    /// The sender's port LID (InfiniBand). 0 on RoCE, which has no LIDs: a
    /// peer given 0 routes by GID.
    pub lid: u16,
    /// The GID the sender routes from (all zeros on an InfiniBand port
    /// without one): the peer's destination GID.
    pub gid: [u8; 16],
    /// The index of that GID in the sender's own table, for information:
    /// each side sends from its own index.
    pub gid_index: u8,
    /// `enum ibv_mtu` (1..=5).
    pub mtu: u8,
    /// Memory the sender lets the peer RDMA into or from (a connection's
    /// target ring), if any.
    pub region: Option<RemoteSlice>,
}

/// The region at bytes `at..at + 20` (address, length, rkey), checked not
/// to wrap the address space.
fn region_at(v: &Checked<'_>, at: usize) -> std::result::Result<RemoteSlice, WireError> {
    let r = RemoteSlice {
        addr: v.u64(at),
        len: v.u64(at + 8),
        rkey: v.u32(at + 16),
    };
    if r.addr.checked_add(r.len).is_none() {
        return Err(v.field_error(
            "region",
            format!("{:#x}+{}", r.addr, r.len),
            "an end that never wraps past 2^64",
        ));
    }
    Ok(r)
}

fn emit_region(b: &mut [u8], at: usize, r: &RemoteSlice) {
    Emit(b)
        .u64(at, r.addr)
        .u64(at + 8, r.len)
        .u32(at + 16, r.rkey);
}

impl ConnectionRecord {
    /// Bytes of an encoded record.
    pub const LEN: usize = 64;

    /// The record's wire bytes: magic `PPCR`, version 1, then every field
    /// big-endian (the region's bytes zero when there is none).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        RECORD.emit(&mut b);
        Emit(&mut b)
            .u8(5, self.gid_index)
            .u8(6, self.mtu)
            .u8(7, u8::from(self.region.is_some()))
            .u32(8, self.qpn)
            .u32(12, self.psn)
            .u16(16, self.lid)
            .bytes(18, &self.gid);
        if let Some(r) = &self.region {
            emit_region(&mut b, 34, r);
        }
        b
    }

    /// Decodes a peer's record, checking its length (exactly
    /// [`LEN`](Self::LEN)), magic and version, then each field: a QP number
    /// of 1..=0xffffff, a 24-bit PSN, an MTU code of 1..=5, a region flag
    /// of 0 or 1 and a region that does not wrap the address space. Any
    /// failure is an [`Error::Wire`] whose source names the field.
    pub fn decode(b: &[u8]) -> Result<ConnectionRecord> {
        crate::wire::record("connection_record", b);
        Ok(Self::parse(&RECORD.check(b, Len::Exactly(Self::LEN))?)?)
    }

    fn parse(v: &Checked<'_>) -> std::result::Result<ConnectionRecord, WireError> {
        let (qpn, psn, mtu) = (v.u32(8), v.u32(12), v.u8(6));
        if qpn == 0 || qpn > 0xff_ffff {
            return Err(v.field_error("QP number", format!("{qpn:#x}"), "1..=0xffffff (24 bits)"));
        }
        if psn > 0xff_ffff {
            return Err(v.field_error("PSN", format!("{psn:#x}"), "0..=0xffffff (24 bits)"));
        }
        if !(1..=5).contains(&mtu) {
            return Err(v.field_error("MTU code", mtu, "1 (256 B) ..= 5 (4096 B)"));
        }
        let region = match v.u8(7) {
            0 => None,
            1 => Some(region_at(v, 34)?),
            f => return Err(v.field_error("region flag", f, "0 or 1")),
        };
        Ok(ConnectionRecord {
            qpn,
            psn,
            lid: v.u16(16),
            gid: v.array(18),
            gid_index: v.u8(5),
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
    /// Bytes of an encoded descriptor (the front of a connection's
    /// private data).
    pub const LEN: usize = 28;

    /// The descriptor's wire bytes: magic `PPRD`, version 1, then at
    /// byte 8 the address, length and rkey, big-endian.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        REGION.emit(&mut b);
        emit_region(&mut b, 8, &self.0);
        b
    }

    /// Decodes from the front of `b` (rdma_cm may pad private data with zeros).
    pub fn decode(b: &[u8]) -> Result<RegionDescriptor> {
        crate::wire::record("connection_record", b);
        let v = REGION.check(b, Len::AtLeast(Self::LEN))?;
        Ok(RegionDescriptor(region_at(&v, 8)?))
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
            (
                12,
                0x01,
                "PSN 0x1abcdef is out of range: allowed 0..=0xffffff",
            ),
        ];
        for (at, value, expected) in cases {
            let mut b = good;
            b[at] = value;
            let err = wire_error(ConnectionRecord::decode(&b).unwrap_err());
            assert!(err.contains(expected), "byte {at}={value}: {err}");
        }
        assert!(
            wire_error(ConnectionRecord::decode(&good[..63]).unwrap_err()).contains("63 bytes")
        );
        let mut zero_qpn = good;
        zero_qpn[8..12].copy_from_slice(&[0; 4]);
        assert!(ConnectionRecord::decode(&zero_qpn).is_err());
        let mut wrap = good;
        wrap[34..42].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(wire_error(ConnectionRecord::decode(&wrap).unwrap_err()).contains("wraps"));
    }

    /// The field a decode error names: its source, the wire error.
    fn wire_error(err: Error) -> String {
        match err {
            Error::Wire(wire) => wire.to_string(),
            other => panic!("not a wire error: {other:?}"),
        }
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
