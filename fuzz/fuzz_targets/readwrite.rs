//! What a readwrite server takes from a client: its hello in the rdma_cm
//! private data (`Hello::decode`, zero-padded) and its done message
//! (`Done::decode`). What is accepted is what the client's encoder
//! writes; every refusal of a hello fits the reject that carries it back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpoll_apps::protocol::{Done, Hello};
use pinpoll_fuzz::{within_budget, REJECT_LEN};

fuzz_target!(|bytes: &[u8]| {
    let hello = within_budget("Hello::decode", bytes.len(), 0, || Hello::decode(bytes));
    match hello {
        Ok(hello) => assert_eq!(hello.encode()[..], bytes[..Hello::LEN]),
        // The server rejects with the reason and a NUL.
        Err(why) => assert!(why.to_string().len() < REJECT_LEN, "{why}"),
    }
    let done = within_budget("Done::decode", bytes.len(), 0, || Done::decode(bytes));
    if let Ok(done) = done {
        assert_eq!(done.encode()[..], bytes[..]);
    }
});
