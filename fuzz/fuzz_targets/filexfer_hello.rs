//! The rdma_cm private data of a connect request, as a filexfer server's
//! accept loop classifies it (`classify_hello`) and the engine's accept
//! reads the client's ring from it (`RegionDescriptor::decode`). Every
//! hello accepted is exactly what the client's encoder writes, a classic
//! client is one that sent nothing, and every refusal fits the reject
//! that carries it back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpoll::connect::RegionDescriptor;
use pinpoll_apps::filexfer::protocol::{classify_hello, join_hello, Hello, HELLO};
use pinpoll_fuzz::{region_descriptor, within_budget, REJECT_LEN};

fuzz_target!(|private: &[u8]| {
    let hello = within_budget("classify_hello", private.len(), 0, || {
        classify_hello(private)
    });
    // Only the magic, version and kind are checked: the two reserved bytes
    // after them are not (an older client may set them).
    let checked = |sent: &[u8]| {
        let hello = &private[RegionDescriptor::LEN..];
        assert_eq!(hello[..6], sent[..6], "{private:?}");
        assert_eq!(hello[8..sent.len()], sent[8..], "{private:?}");
    };
    match hello {
        Ok(Hello::Native) => checked(&HELLO),
        Ok(Hello::Join { token, stream }) => checked(&join_hello(token, stream)),
        Ok(Hello::Classic) => assert!(private.iter().all(|b| *b == 0), "{private:?}"),
        Err(why) => assert!(why.len() < REJECT_LEN, "{why}"),
    }
    region_descriptor(private);
});
