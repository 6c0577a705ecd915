//! Structure-aware property tests of the connection records a peer sends
//! (`PPCR` over the out-of-band exchange, `PPRD` in rdma_cm private data):
//! valid records with random fields round-trip; every field set out of its
//! range is an error naming it, never a panic; any mutation of a valid
//! record decodes to an error or to a record that re-encodes stably.

use pinpoll::connect::{ConnectionRecord, RegionDescriptor};
use pinpoll::RemoteSlice;
use proptest::prelude::*;

/// A region whose end does not wrap the address space.
fn region() -> impl Strategy<Value = RemoteSlice> {
    (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(addr, len, rkey)| RemoteSlice {
        addr,
        len: len.min(u64::MAX - addr),
        rkey,
    })
}

fn record() -> impl Strategy<Value = ConnectionRecord> {
    (
        1u32..=0xff_ffff,
        0u32..=0xff_ffff,
        any::<u16>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        1u8..=5,
        proptest::option::of(region()),
    )
        .prop_map(
            |(qpn, psn, lid, gid, gid_index, mtu, region)| ConnectionRecord {
                qpn,
                psn,
                lid,
                gid,
                gid_index,
                mtu,
                region,
            },
        )
}

/// Offsets of the record's fields (big-endian), as the peer sends them.
const QPN: usize = 8;
const PSN: usize = 12;
const MTU: usize = 6;
const REGION_FLAG: usize = 7;
const REGION_ADDR: usize = 34;
const REGION_LEN: usize = 42;

/// The decode error of `bytes`, its sources after it (the wire error
/// that names the field is the source).
fn error_of(bytes: &[u8]) -> String {
    match ConnectionRecord::decode(bytes) {
        Ok(r) => panic!("decoded {r:?} from an out-of-range record"),
        Err(e) => {
            assert_eq!(e.kind(), pinpoll::ErrorKind::Protocol, "{e}");
            chain(&e)
        }
    }
}

/// `e`'s message, its sources after it.
fn chain(e: &pinpoll::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn valid_records_round_trip(r in record()) {
        let bytes = r.encode();
        prop_assert_eq!(ConnectionRecord::decode(&bytes).unwrap(), r);
    }

    #[test]
    fn an_out_of_range_qpn_or_psn_is_an_error(r in record(), high in 0x100_0000u32..) {
        let mut b = r.encode();
        b[QPN..QPN + 4].copy_from_slice(&0u32.to_be_bytes());
        prop_assert!(error_of(&b).contains("QP number"));
        b[QPN..QPN + 4].copy_from_slice(&high.to_be_bytes());
        prop_assert!(error_of(&b).contains("QP number"));
        let mut b = r.encode();
        b[PSN..PSN + 4].copy_from_slice(&high.to_be_bytes());
        prop_assert!(error_of(&b).contains("PSN"));
    }

    #[test]
    fn an_out_of_range_mtu_or_flag_is_an_error(r in record(), mtu in 6u8.., flag in 2u8..) {
        let mut b = r.encode();
        b[MTU] = 0;
        prop_assert!(error_of(&b).contains("MTU code 0"));
        b[MTU] = mtu;
        let want = format!("MTU code {mtu}");
        prop_assert!(error_of(&b).contains(&want));
        let mut b = r.encode();
        b[REGION_FLAG] = flag;
        let want = format!("region flag {flag}");
        prop_assert!(error_of(&b).contains(&want));
    }

    #[test]
    fn a_region_that_wraps_is_an_error(r in record(), addr in 1u64.., rkey in any::<u32>()) {
        let r = ConnectionRecord {
            region: Some(RemoteSlice { addr, len: 0, rkey }),
            ..r
        };
        let mut b = r.encode();
        b[REGION_LEN..REGION_LEN + 8].copy_from_slice(&(u64::MAX - addr + 1).to_be_bytes());
        prop_assert!(error_of(&b).contains("wraps"));
        prop_assert_eq!(&b[REGION_ADDR..REGION_ADDR + 8], &addr.to_be_bytes()[..]);
    }

    #[test]
    fn a_wrong_magic_version_or_length_is_an_error(r in record(), at in 0usize..5, value in any::<u8>(), len in 0usize..128) {
        let mut b = r.encode();
        prop_assume!(b[at] != value);
        b[at] = value;
        let e = error_of(&b);
        prop_assert!(e.contains("magic") || e.contains("version"), "{}", e);
        let mut v = r.encode().to_vec();
        prop_assume!(len != ConnectionRecord::LEN);
        v.resize(len, 0);
        // Nothing but zeros is no record at all; any other length is named.
        let want = if len == 0 { "no PPCR header".to_owned() } else { format!("{len} bytes") };
        prop_assert!(error_of(&v).contains(&want));
    }

    #[test]
    fn any_mutation_decodes_to_an_error_or_a_stable_record(
        r in record(),
        edits in proptest::collection::vec((0usize..64, any::<u8>()), 1..8),
    ) {
        let mut b = r.encode();
        for (at, value) in edits {
            b[at] = value;
        }
        if let Ok(decoded) = ConnectionRecord::decode(&b) {
            // Bytes the format ignores (padding, a region absent) may
            // differ; what was decoded encodes to itself.
            prop_assert_eq!(ConnectionRecord::decode(&decoded.encode()).unwrap(), decoded);
        }
    }

    #[test]
    fn region_descriptors_round_trip_with_padding(s in region(), pad in 0usize..32, junk in any::<u8>()) {
        let d = RegionDescriptor(s);
        let mut b = d.encode().to_vec();
        b.resize(RegionDescriptor::LEN + pad, junk);
        prop_assert_eq!(RegionDescriptor::decode(&b).unwrap(), d);
    }

    #[test]
    fn a_bad_region_descriptor_is_an_error(
        s in region(),
        at in 0usize..5,
        value in any::<u8>(),
        short in 0usize..RegionDescriptor::LEN,
        addr in 1u64..,
    ) {
        let good = RegionDescriptor(s).encode();
        let mut b = good;
        prop_assume!(b[at] != value);
        b[at] = value;
        let e = chain(&RegionDescriptor::decode(&b).unwrap_err());
        prop_assert!(e.contains("magic") || e.contains("version"), "{}", e);
        let e = chain(&RegionDescriptor::decode(&good[..short]).unwrap_err());
        let want = if short == 0 { "no PPRD header".to_owned() } else { format!("{short} bytes") };
        prop_assert!(e.contains(&want), "{}", e);
        let wraps = RegionDescriptor(RemoteSlice { addr, len: 0, rkey: 1 }).encode();
        let mut b = wraps;
        b[16..24].copy_from_slice(&(u64::MAX - addr + 1).to_be_bytes());
        prop_assert!(chain(&RegionDescriptor::decode(&b).unwrap_err()).contains("wraps"));
    }
}
