//! filexfer's control messages (`Msg::decode`), as either side receives
//! them: every accepted message is exactly the encoding of what was
//! decoded, and holds the bounds the protocol states.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpoll_apps::filexfer::name::MAX_NAME;
use pinpoll_apps::filexfer::protocol::{credit, Msg, MAX_FAIL, MAX_STREAMS};
use pinpoll_fuzz::within_budget;

fuzz_target!(|bytes: &[u8]| {
    let decoded = within_budget("Msg::decode", bytes.len(), 1, || Msg::decode(bytes));
    let msg = match decoded {
        Ok(msg) => msg,
        Err(err) => {
            assert!(err.to_string().len() <= MAX_FAIL, "{err}");
            return;
        }
    };
    match &msg {
        Msg::Start { streams, name, .. } => {
            assert!((1..=MAX_STREAMS).contains(streams), "{msg:?}");
            assert!((1..=MAX_NAME).contains(&name.len()), "{msg:?}");
        }
        Msg::Fail { message, .. } => assert!(message.len() <= MAX_FAIL, "{msg:?}"),
        Msg::Credit { count } => assert_eq!(credit(*count)[..], bytes[..]),
        _ => {}
    }
    assert_eq!(
        msg.encode(),
        bytes,
        "{msg:?} does not encode back to its bytes"
    );
});
