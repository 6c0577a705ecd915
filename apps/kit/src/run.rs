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
/// Control characters are escaped (`\u{1b}`): an error often quotes what a
/// peer sent, and a peer must not drive the terminal.
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

/// `text` with its control characters escaped (`\u{1b}`): what a peer
/// sent reaches a terminal only as visible text.
pub fn escape_controls(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            escaped.extend(c.escape_debug());
        } else {
            escaped.push(c);
        }
    }
    escaped
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
