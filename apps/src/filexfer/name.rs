//! The file name a client sends: one path component, nothing else.
//!
//! Rules (checked by the client before connecting and by the server on
//! every `Start`): 1 to 255 bytes of UTF-8 (a name that is not UTF-8 is
//! refused on both sides, always); not `.` or `..`; no `/` and no NUL; and
//! not starting with `.filexfer-`, the prefix of the server's temporary
//! files. So the server joins it to `--dir` and gets a path directly in
//! that directory, never outside it.

use std::fmt;

/// The longest name, in bytes (NAME_MAX on Linux).
pub const MAX_NAME: usize = 255;
/// The prefix of the server's temporary and probe files; refused in names.
pub const RESERVED_PREFIX: &str = ".filexfer-";

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadName {
    Empty,
    TooLong(usize),
    Dot,
    DotDot,
    Slash,
    Nul,
    NotUtf8,
    Reserved,
}

impl fmt::Display for BadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadName::Empty => f.write_str("the file name is empty"),
            BadName::TooLong(n) => write!(f, "the file name is {n} bytes; at most {MAX_NAME}"),
            BadName::Dot => f.write_str("the file name \".\" is not a file"),
            BadName::DotDot => f.write_str("the file name \"..\" is not a file"),
            BadName::Slash => f.write_str("the file name contains '/': only a single path component is allowed"),
            BadName::Nul => f.write_str("the file name contains a NUL byte"),
            BadName::NotUtf8 => f.write_str("the file name is not UTF-8"),
            BadName::Reserved => write!(f, "file names starting with {RESERVED_PREFIX:?} are reserved for the server's temporary files"),
        }
    }
}

impl std::error::Error for BadName {}

/// Checks `bytes` against the rules above and returns the name.
pub fn validate(bytes: &[u8]) -> Result<&str, BadName> {
    if bytes.is_empty() {
        return Err(BadName::Empty);
    }
    if bytes.len() > MAX_NAME {
        return Err(BadName::TooLong(bytes.len()));
    }
    if bytes.contains(&0) {
        return Err(BadName::Nul);
    }
    if bytes.contains(&b'/') {
        return Err(BadName::Slash);
    }
    match bytes {
        b"." => return Err(BadName::Dot),
        b".." => return Err(BadName::DotDot),
        _ => {}
    }
    let name = std::str::from_utf8(bytes).map_err(|_| BadName::NotUtf8)?;
    if name.starts_with(RESERVED_PREFIX) {
        return Err(BadName::Reserved);
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_bad_name_is_refused_with_its_reason() {
        let long = "x".repeat(256);
        let cases: [(&[u8], BadName); 9] = [
            (b"", BadName::Empty),
            (long.as_bytes(), BadName::TooLong(256)),
            (b".", BadName::Dot),
            (b"..", BadName::DotDot),
            (b"a/b", BadName::Slash),
            (b"/etc", BadName::Slash),
            (b"../x", BadName::Slash),
            (b"a\0b", BadName::Nul),
            (b"\xff\xfe", BadName::NotUtf8),
        ];
        for (bytes, why) in cases {
            assert_eq!(validate(bytes), Err(why), "{bytes:?}");
        }
        assert_eq!(validate(b".filexfer-1-2.tmp"), Err(BadName::Reserved));
    }

    #[test]
    fn ordinary_names_pass() {
        for ok in [
            "a",
            "file.bin",
            ".hidden",
            "...",
            "héllo wörld",
            "a\\b",
            "x-.filexfer-",
        ] {
            assert_eq!(validate(ok.as_bytes()), Ok(ok));
        }
        let max = "y".repeat(255);
        assert_eq!(validate(max.as_bytes()), Ok(max.as_str()));
    }

    proptest! {
        #[test]
        fn an_accepted_name_is_one_component_inside_the_dir(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(name) = validate(&bytes) {
                let dir = std::path::Path::new("/srv/in");
                let joined = dir.join(name);
                prop_assert_eq!(joined.parent(), Some(dir));
                prop_assert_eq!(joined.file_name().map(|n| n.len()), Some(name.len()));
                prop_assert!(std::path::Path::new(name).components().count() == 1);
            }
        }
    }
}
