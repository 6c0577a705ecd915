//! The engine's connection records: the out-of-band exchange's 64-byte
//! `PPCR` record (`ConnectionRecord::decode`, read whole off the TCP
//! stream) and the `PPRD` region descriptor (`RegionDescriptor::decode`,
//! in rdma_cm private data and readwrite's first message). A record
//! accepted holds every field in the range the QP's transitions take and
//! re-encodes to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpoll::connect::ConnectionRecord;
use pinpoll_fuzz::{region_descriptor, within_budget};

/// Bytes of a record the decoder reads: the header, the fields, and the
/// region after them when the flag says there is one. The rest is
/// reserved, and not checked.
fn read_len(r: &ConnectionRecord) -> usize {
    if r.region.is_some() {
        54
    } else {
        34
    }
}

fuzz_target!(|bytes: &[u8]| {
    let record = within_budget("ConnectionRecord::decode", bytes.len(), 0, || {
        ConnectionRecord::decode(bytes)
    });
    if let Ok(r) = record {
        assert_eq!(bytes.len(), ConnectionRecord::LEN);
        assert!((1..=0xff_ffff).contains(&r.qpn), "{r:?}");
        assert!(r.psn <= 0xff_ffff, "{r:?}");
        assert!((1..=5).contains(&r.mtu), "{r:?}");
        if let Some(region) = r.region {
            assert!(region.addr.checked_add(region.len).is_some(), "{r:?}");
        }
        let encoded = r.encode();
        assert_eq!(encoded[..read_len(&r)], bytes[..read_len(&r)]);
        assert_eq!(ConnectionRecord::decode(&encoded).ok(), Some(r));
    }
    region_descriptor(bytes);
});
