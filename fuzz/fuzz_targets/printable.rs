//! What the programs print of a peer's bytes (`output::printable`: the
//! text a basic or readwrite peer sent, a file name a client chose): no
//! control or format character reaches the terminal, so a peer can
//! neither forge lines, drive it nor reorder what it shows (U+202E), and
//! nothing is lost — the escapes undo to exactly
//! the bytes received.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpoll_apps::output::printable;
use pinpoll_apps::run::needs_escape;
use pinpoll_fuzz::within_budget;

/// The bytes `shown` stands for: `printable` undone.
fn unescape(shown: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut chars = shown.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            continue;
        }
        let escaped = match chars.next() {
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                bytes.push(u8::from_str_radix(&hex, 16).expect("\\xNN"));
                continue;
            }
            Some('u') => {
                let hex: String = chars.by_ref().skip(1).take_while(|c| *c != '}').collect();
                char::from_u32(u32::from_str_radix(&hex, 16).expect("\\u{N}")).expect("a char")
            }
            Some('n') => '\n',
            Some('r') => '\r',
            Some('t') => '\t',
            Some('0') => '\0',
            Some('\\') => '\\',
            other => panic!("{other:?} after a backslash in {shown:?}"),
        };
        bytes.extend_from_slice(escaped.encode_utf8(&mut [0; 4]).as_bytes());
    }
    bytes
}

fuzz_target!(|bytes: &[u8]| {
    let shown = within_budget("printable", bytes.len(), 12, || printable(bytes));
    assert!(!shown.chars().any(needs_escape), "{shown:?}");
    assert_eq!(unescape(&shown), bytes, "{shown:?}");
    if let Ok(text) = std::str::from_utf8(bytes) {
        if !text.contains(|c: char| needs_escape(c) || c == '\\') {
            assert_eq!(shown, text, "plain text is shown as it is");
        }
    }
});
