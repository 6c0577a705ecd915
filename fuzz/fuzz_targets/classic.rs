//! What a client of the classic rdma-file-transfer protocol sends: its
//! 24-byte control messages (`classic::decode`, in host byte order) and
//! the file's path it writes first (`classic::file_name`). A message is
//! accepted at exactly 24 bytes and its fields read back as encoded; a
//! name accepted is a single component that stays in the server's
//! directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpoll_apps::filexfer::classic::{self, MSG_LEN};
use pinpoll_apps::filexfer::name::{MAX_NAME, RESERVED_PREFIX};
use pinpoll_fuzz::within_budget;

fuzz_target!(|bytes: &[u8]| {
    let msg = within_budget("classic::decode", bytes.len(), 0, || classic::decode(bytes));
    assert_eq!(msg.is_ok(), bytes.len() == MSG_LEN, "{bytes:?}");
    if let Ok((id, addr, rkey)) = msg {
        // Bytes 4..8 and 20..24 are the C struct's padding, not read.
        let encoded = classic::encode(id, addr, rkey);
        assert_eq!(encoded[..4], bytes[..4]);
        assert_eq!(encoded[8..20], bytes[8..20]);
    }
    let name = within_budget("classic::file_name", bytes.len(), 0, || {
        classic::file_name(bytes)
    });
    if let Ok(name) = name {
        assert!((1..=MAX_NAME).contains(&name.len()), "{name:?}");
        assert!(!name.contains(['/', '\0']), "{name:?}");
        assert!(name != "." && name != "..", "{name:?}");
        assert!(!name.starts_with(RESERVED_PREFIX), "{name:?}");
        // The path's last component, its terminating NUL dropped.
        let path = bytes.strip_suffix(&[0]).unwrap_or(bytes);
        assert!(path.ends_with(name.as_bytes()), "{name:?} from {bytes:?}");
        let before = &path[..path.len() - name.len()];
        assert!(
            before.is_empty() || before.ends_with(b"/"),
            "{name:?} from {bytes:?}"
        );
    }
});
