//! Structure-aware property tests of the messages the apps take from a
//! peer: readwrite's `PPRW` hello (in rdma_cm private data) and `PPDN`
//! done message, and classic filexfer's 24-byte control messages. Valid
//! messages with random fields round-trip; each out-of-range field is an
//! error that names it; no input panics. (filexfer's own protocol has its
//! property tests beside its decoder, `apps/src/filexfer/protocol.rs`.)

use pinpoll::wire::WireError;
use pinpoll_apps::filexfer::classic;
use pinpoll_apps::protocol::{Done, Hello, Mode, VERSION};
use proptest::prelude::*;

fn mode() -> impl Strategy<Value = Mode> {
    prop::sample::select(vec![Mode::Write, Mode::Read])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn hellos_round_trip_whatever_the_padding(mode in mode(), pad in 0usize..50, junk in any::<u8>()) {
        let mut b = Hello { mode }.encode().to_vec();
        b.resize(Hello::LEN + pad, junk);
        prop_assert_eq!(Hello::decode(&b), Ok(Hello { mode }));
    }

    #[test]
    fn each_bad_hello_field_is_its_own_error(
        mode in mode(),
        magic_at in 0usize..4,
        magic in any::<u8>(),
        version in any::<u8>(),
        code in any::<u8>(),
        short in 1usize..Hello::LEN,
    ) {
        let good = Hello { mode }.encode();
        let mut b = good;
        prop_assume!(b[magic_at] != magic);
        b[magic_at] = magic;
        let ok = matches!(Hello::decode(&b), Err(WireError::Magic { .. }));
        prop_assert!(ok);
        let mut b = good;
        b[4] = version;
        if version != VERSION {
            let ok = matches!(Hello::decode(&b), Err(WireError::Version { got, .. }) if got == version);
            prop_assert!(ok);
        }
        let mut b = good;
        b[5] = code;
        match Mode::from_code(code) {
            Some(m) => prop_assert_eq!(Hello::decode(&b), Ok(Hello { mode: m })),
            None => {
                let err = Hello::decode(&b).unwrap_err();
                let ok = matches!(err, WireError::Field { field: "mode", .. });
                prop_assert!(ok, "{}", err);
                let want = format!("mode {code} is out of range");
                prop_assert!(err.to_string().contains(&want), "{}", err);
            }
        }
        let ok = matches!(Hello::decode(&good[..short]), Err(WireError::Length { got, .. }) if got == short);
        prop_assert!(ok);
        let ok = matches!(Hello::decode(&[0u8; 56]), Err(WireError::Absent { .. }));
        prop_assert!(ok);
    }

    #[test]
    fn no_hello_bytes_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(h) = Hello::decode(&bytes) {
            prop_assert_eq!(&h.encode()[..], &bytes[..Hello::LEN]);
        }
    }

    #[test]
    fn dones_round_trip_and_bad_ones_are_errors(
        len in any::<u32>(),
        at in 0usize..4,
        value in any::<u8>(),
        size in 0usize..32,
    ) {
        let good = Done { len }.encode();
        prop_assert_eq!(Done::decode(&good).unwrap(), Done { len });
        let mut b = good;
        prop_assume!(b[at] != value);
        b[at] = value;
        let ok = matches!(Done::decode(&b), Err(WireError::Magic { .. }));
        prop_assert!(ok);
        if size != Done::LEN {
            let mut v = good.to_vec();
            v.resize(size, 0);
            let err = Done::decode(&v).unwrap_err();
            let ok = match err {
                WireError::Length { got, .. } => got == size,
                WireError::Absent { .. } => size == 0,
                _ => false,
            };
            prop_assert!(ok,
                "{}",
                err);
        }
    }

    #[test]
    fn classic_messages_round_trip_and_other_lengths_are_errors(
        id in any::<i32>(),
        addr in any::<u64>(),
        rkey in any::<u32>(),
        size in 0usize..64,
    ) {
        let b = classic::encode(id, addr, rkey);
        prop_assert_eq!(classic::decode(&b).unwrap(), (id, addr, rkey));
        if size != classic::MSG_LEN {
            let mut v = b.to_vec();
            v.resize(size, 0);
            let e = classic::decode(&v).unwrap_err().to_string();
            let want = format!("{size} bytes");
            prop_assert!(e.contains(&want), "{}", e);
        }
    }
}
