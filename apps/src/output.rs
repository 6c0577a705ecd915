//! What the programs print on stdout: progress lines, which `-q` hides, and
//! data lines (what came from the peer), which it never hides. stderr is
//! kept for errors and the log.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;

/// stdout, line by line (each line flushed at once, so a reader of a pipe
/// sees it as it happens). A closed stdout is an error, never a panic —
/// or, for a server's progress lines ([`Output::best_effort`]), a warning
/// once and nothing more.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    quiet: bool,
    best_effort: bool,
}

/// Whether a best-effort progress line already failed (warned once).
static PROGRESS_LOST: AtomicBool = AtomicBool::new(false);

impl Output {
    pub fn new(quiet: bool) -> Output {
        Output {
            quiet,
            best_effort: false,
        }
    }

    /// Progress lines that never fail: a server goes on serving when
    /// whoever read its stdout went away (a closed pipe, a full disk).
    pub fn best_effort(self) -> Output {
        Output {
            best_effort: true,
            ..self
        }
    }

    /// A line about what the program is doing, e.g. `listening on [::]:7471`.
    pub fn progress(&self, line: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
        if self.quiet {
            return Ok(());
        }
        match write_line(line) {
            Err(err) if self.best_effort => {
                if !PROGRESS_LOST.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "{}; going on without progress lines",
                        crate::run::error_line(&err)
                    );
                }
                Ok(())
            }
            written => written,
        }
    }

    /// A line of the peer's data: always printed.
    pub fn data(&self, line: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
        write_line(line)
    }
}

fn write_line(line: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

/// Bytes from the network as one printable line: valid UTF-8 as is,
/// control and format characters escaped (`\n`, `\u{1b}`, `\u{202e}`:
/// [`crate::run::push_shown`]), a backslash doubled, and bytes that are not
/// UTF-8 as `\xNN` — a peer cannot forge lines, drive the terminal or
/// reorder what it shows, and every escape undoes to the bytes received.
pub fn printable(bytes: &[u8]) -> String {
    pinpoll::wire::record("printable", bytes);
    let mut s = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                s.push_str("\\\\");
            } else {
                crate::run::push_shown(&mut s, c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(s, "\\x{b:02x}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn text_passes_and_everything_else_is_escaped() {
        assert_eq!(
            printable("message from server pid 1".as_bytes()),
            "message from server pid 1"
        );
        assert_eq!(printable("héllo — wörld".as_bytes()), "héllo — wörld");
        assert_eq!(printable(b"a\nb\x1b[2Jc\0"), "a\\nb\\u{1b}[2Jc\\0");
        assert_eq!(printable(b"\xff\xfeok\\"), "\\xff\\xfeok\\\\");
    }

    /// A client's file name `invoice\u{202e}fdp.exe` would show as
    /// "invoiceexe.pdf" on the server's terminal: the override is escaped.
    #[test]
    fn a_file_name_s_bidi_override_is_escaped() {
        assert_eq!(
            printable("invoice\u{202e}fdp.exe".as_bytes()),
            "invoice\\u{202e}fdp.exe"
        );
        assert_eq!(
            printable("\u{feff}a\u{200b}b\u{2066}c\u{2069}".as_bytes()),
            "\\u{feff}a\\u{200b}b\\u{2066}c\\u{2069}"
        );
        assert_eq!(
            printable("a\u{2028}b\u{3164}c".as_bytes()),
            "a\\u{2028}b\\u{3164}c"
        );
    }
}
