//! The shape of every `main`: parse the command line, set up logging, run,
//! and report. Any failure is exactly one line on stderr, `error: ` and the
//! error's causes joined by `: `, with exit status 1 (2 for a bad command
//! line or a failure marked [`usage`]); help and version print and exit 0.
//! No panic, no backtrace.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;

use crate::logging::init_logging;

/// A failure already reported on stderr (the server prints one line per
/// failed client as it happens): exit 1 without another line.
#[derive(Debug)]
pub struct AlreadyReported;

impl std::fmt::Display for AlreadyReported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the failure was already reported")
    }
}

impl std::error::Error for AlreadyReported {}

/// A failure that is the user's (a bad value the command line parser could
/// not catch): exit status 2, as for a bad command line. Attach it with
/// [`usage`]; it adds nothing to the error line.
#[derive(Debug)]
pub struct BadUsage;

impl std::fmt::Display for BadUsage {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

/// Marks `err` as bad usage: `main` exits with status 2.
pub fn usage(err: impl Into<anyhow::Error>) -> anyhow::Error {
    err.into().context(BadUsage)
}

/// What a program's body returns on success: nothing (exit 0) or its own
/// exit status.
pub trait Success {
    fn exit_code(self) -> ExitCode;
}

impl Success for () {
    fn exit_code(self) -> ExitCode {
        ExitCode::SUCCESS
    }
}

impl Success for ExitCode {
    fn exit_code(self) -> ExitCode {
        self
    }
}

/// Parses `C` from the command line, installs the stderr logger with the
/// filter `log_filter` finds (none: the program logs nothing), then runs
/// `body`. An error is one `error: ` line and exit status 1, or 2 when it
/// is marked [`usage`]; an [`AlreadyReported`] one exits 1 silently.
pub fn main<C: Parser, S: Success>(
    log_filter: impl FnOnce(&C) -> Option<&'static str>,
    body: impl FnOnce(C) -> anyhow::Result<S>,
) -> ExitCode {
    let cli = match C::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error::<C>(&err),
    };
    if let Some(filter) = log_filter(&cli) {
        init_logging(filter);
    }
    match body(cli) {
        Ok(done) => done.exit_code(),
        Err(err) if err.downcast_ref::<AlreadyReported>().is_some() => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {}", error_line(&err));
            if err.downcast_ref::<BadUsage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn usage_error<C: Parser>(err: &clap::Error) -> ExitCode {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Help goes to stdout; if even that fails there is nothing to say.
            let _ = err.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            // A bare `basic`: clap would print the whole help to stderr.
            let cmd = C::command();
            let names: Vec<&str> = cmd
                .get_subcommands()
                .map(|s| s.get_name())
                .filter(|n| *n != "help")
                .collect();
            eprintln!(
                "error: {} requires a subcommand; no subcommand given: use one of {} (see --help)",
                cmd.get_name(),
                names.join(", ")
            );
            ExitCode::from(2)
        }
        _ => {
            eprintln!("error: {}", clap_line(&err.to_string()));
            ExitCode::from(2)
        }
    }
}

/// clap's multi-line message (error, details, usage, a tip) as one line:
/// the error and its details, and a pointer to `--help`.
pub fn clap_line(text: &str) -> String {
    let mut parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.starts_with("tip:"))
        .collect();
    if let Some(first) = parts.first_mut() {
        *first = first.strip_prefix("error: ").unwrap_or(first);
    }
    let mut line = String::new();
    for part in parts {
        if !line.is_empty() {
            // "...not provided:" / "[possible values: ...]" continue the line.
            line.push_str(if line.ends_with(':') || part.starts_with('[') {
                " "
            } else {
                "; "
            });
        }
        line.push_str(part);
    }
    line.push_str(" (see --help)");
    line
}

/// An error and its causes joined by `: `, on one line. A cause whose text
/// the line already holds (an error that displays its source) is skipped.
/// Control and format characters are escaped (`\u{1b}`, `\u{202e}`): an
/// error often quotes what a peer sent, and a peer must not drive the
/// terminal nor reorder what it shows.
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let text = escape_controls(&text);
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// `text` with every character that could drive or mislead a terminal
/// escaped ([`push_shown`]), and a backslash doubled (so a peer's literal
/// `\u{202e}` never reads as an escaped U+202E): what a peer sent reaches
/// a terminal only as visible text, in the order it was sent.
pub fn escape_controls(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\\' {
            escaped.push_str("\\\\");
        } else {
            push_shown(&mut escaped, c);
        }
    }
    escaped
}

/// Appends `c` to `out` as a terminal should show a peer's text: control
/// characters (C0, DEL, C1) as `\n`, `\u{1b}`..., and format characters
/// ([`is_format`]: bidi overrides and isolates, zero-width characters, the
/// BOM) and the other invisibles ([`is_invisible`]: line and paragraph
/// separators, fillers, variation selectors) as `\u{202e}`..., since they
/// reorder, break or hide what is around them; everything else as it is. Every program's printing of peer text goes
/// through here (the error line, `output::printable`, pinpoll-perf).
pub fn push_shown(out: &mut String, c: char) {
    if c.is_control() {
        out.extend(c.escape_debug());
    } else if is_format(c) || is_invisible(c) {
        out.extend(c.escape_unicode());
    } else {
        out.push(c);
    }
}

/// Whether `c` must be escaped before a terminal sees it ([`push_shown`]).
pub fn needs_escape(c: char) -> bool {
    c.is_control() || is_format(c) || is_invisible(c)
}

/// Whether `c` is, outside Cf, a line break a viewer honours (U+2028 LINE
/// and U+2029 PARAGRAPH SEPARATOR, Zl/Zp) or default-ignorable and so
/// shown as nothing: the combining grapheme joiner, the Hangul fillers,
/// the Khmer inherent vowels, the Mongolian and the other variation
/// selectors. A peer could forge a line or hide in a name with them.
pub fn is_invisible(c: char) -> bool {
    const HIDDEN: &[(u32, u32)] = &[
        (0x034F, 0x034F),
        (0x115F, 0x1160),
        (0x17B4, 0x17B5),
        (0x180B, 0x180F),
        (0x2028, 0x2029),
        (0x3164, 0x3164),
        (0xFE00, 0xFE0F),
        (0xFFA0, 0xFFA0),
        (0xE0100, 0xE01EF),
    ];
    let c = u32::from(c);
    HIDDEN
        .iter()
        .any(|&(first, last)| (first..=last).contains(&c))
}

/// Whether `c` is of Unicode general category Cf (format), as of Unicode
/// 15.1 (std does not expose categories). These are invisible and act on
/// the text around them: U+202A..U+202E (embeddings, overrides),
/// U+2066..U+2069 (isolates), U+200E/U+200F and U+061C (marks) reorder
/// what a terminal shows; U+200B..U+200D, U+2060.., U+FEFF hide in a name.
pub fn is_format(c: char) -> bool {
    const CF: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x0600, 0x0605),
        (0x061C, 0x061C),
        (0x06DD, 0x06DD),
        (0x070F, 0x070F),
        (0x0890, 0x0891),
        (0x08E2, 0x08E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    let c = u32::from(c);
    CF.iter().any(|&(first, last)| (first..=last).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_join_on_one_line_without_repeats() {
        let io = std::io::Error::from_raw_os_error(19);
        let err = anyhow::Error::new(pinpoll::Error::Cm {
            op: "rdma_bind_addr",
            source: io,
        })
        .context("listening on [::]:7471");
        let line = error_line(&err);
        assert!(
            line.starts_with("listening on [::]:7471: rdma_cm: rdma_bind_addr failed: "),
            "{line}"
        );
        assert!(!line.contains('\n'));

        // pinpoll::Error::Completion displays its source: said once.
        let wc = pinpoll::WcError {
            wr_id: 3,
            opcode: Some(pinpoll::WcOpcode::RDMA_WRITE),
            status: pinpoll::WcStatus::REM_ACCESS_ERR,
            vendor_err: 0,
        };
        let err = anyhow::Error::new(pinpoll::Error::from(wc)).context("writing");
        let line = error_line(&err);
        assert_eq!(line.matches("REM_ACCESS_ERR (").count(), 1, "{line}");
        assert!(line.starts_with("writing: work request 3 (RDMA_WRITE) failed"));
    }

    #[test]
    fn a_peer_s_text_cannot_drive_the_terminal() {
        let err = anyhow::anyhow!("\u{1b}[2J\u{1b}]0;owned\u{7}evil\u{9b}31m")
            .context("the server refused f.bin");
        let line = error_line(&err);
        assert_eq!(
            line,
            "the server refused f.bin: \\u{1b}[2J\\u{1b}]0;owned\\u{7}evil\\u{9b}31m"
        );
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }

    /// U+202E (RIGHT-TO-LEFT OVERRIDE) in a server's `Fail` text would
    /// make a terminal show what follows it backwards: "fdp.exe" reads as
    /// "exe.pdf". Every format character (bidi controls, zero-width ones,
    /// the BOM) is shown as an escape instead.
    #[test]
    fn a_peer_s_bidi_and_invisible_format_characters_are_escaped() {
        let err = anyhow::anyhow!("refused \u{202e}fdp.exe\u{202c} for you")
            .context("the server refused f.bin");
        assert_eq!(
            error_line(&err),
            "the server refused f.bin: refused \\u{202e}fdp.exe\\u{202c} for you"
        );
        for c in [
            '\u{202e}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{200e}',
            '\u{200f}',
            '\u{061c}',
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{feff}',
            '\u{00ad}',
            '\u{e0041}',
        ] {
            let shown = escape_controls(&format!("a{c}b"));
            assert_eq!(shown, format!("a\\u{{{:x}}}b", u32::from(c)), "{c:?}");
        }
        assert_eq!(escape_controls("héllo — wörld"), "héllo — wörld");
    }

    /// LINE and PARAGRAPH SEPARATOR break lines in editors and log
    /// viewers, and the default-ignorable fillers and selectors (not Cf)
    /// are invisible, so they could forge a line or hide in a name.
    #[test]
    fn separators_and_invisible_fillers_are_escaped() {
        for c in [
            '\u{2028}',
            '\u{2029}',
            '\u{034f}',
            '\u{115f}',
            '\u{1160}',
            '\u{3164}',
            '\u{ffa0}',
            '\u{17b4}',
            '\u{17b5}',
            '\u{180b}',
            '\u{180d}',
            '\u{180f}',
            '\u{fe00}',
            '\u{fe0f}',
            '\u{e0100}',
            '\u{e01ef}',
        ] {
            let shown = escape_controls(&format!("a{c}b"));
            assert_eq!(shown, format!("a\\u{{{:x}}}b", u32::from(c)), "{c:?}");
            assert!(needs_escape(c), "{c:?}");
        }
        assert_eq!(escape_controls("\u{fe10}\u{3165}"), "\u{fe10}\u{3165}");
    }

    /// A peer's literal text `\u{202e}` must not read as the escape of a
    /// real U+202E: a backslash is doubled, so every escape undoes.
    #[test]
    fn a_peer_s_literal_escape_cannot_pass_for_an_escaped_character() {
        let literal = error_line(&anyhow::anyhow!("x\\u{{202e}}y"));
        let real = error_line(&anyhow::anyhow!("x\u{202e}y"));
        assert_eq!(literal, "x\\\\u{202e}y");
        assert_eq!(real, "x\\u{202e}y");
        assert_eq!(escape_controls("a\\b"), "a\\\\b");
    }

    #[test]
    fn clap_errors_become_one_line() {
        let text = "error: invalid value 'frob' for '<MODE>'\n  [possible values: write, read]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_line(text),
            "invalid value 'frob' for '<MODE>' [possible values: write, read] (see --help)"
        );
        let text = "error: the following required arguments were not provided:\n  <HOST>\n\nUsage: basic client <HOST>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_line(text),
            "the following required arguments were not provided: <HOST> (see --help)"
        );
    }
}
