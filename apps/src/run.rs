//! The shape of every `main`: parse the command line, set up logging, run,
//! and report. Any failure is exactly one line on stderr, `error: ` and the
//! error's causes joined by `: `, with exit status 1 (2 for a bad command
//! line); help and version print and exit 0. No panic, no backtrace.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;

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

/// Parses `C` from the command line, calls `init_logging(quiet)` with the
/// quiet flag `quiet_of` finds, then runs `body`.
pub fn main<C: Parser>(
    quiet_of: impl FnOnce(&C) -> bool,
    body: impl FnOnce(C) -> anyhow::Result<()>,
) -> ExitCode {
    let cli = match C::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error::<C>(&err),
    };
    init_logging(quiet_of(&cli));
    match body(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if err.downcast_ref::<AlreadyReported>().is_none() {
                eprintln!("error: {}", error_line(&err));
            }
            ExitCode::FAILURE
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
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // A bare `basic`: clap would print the whole help to stderr.
            let cmd = C::command();
            let names: Vec<&str> = cmd
                .get_subcommands()
                .map(|s| s.get_name())
                .filter(|n| *n != "help")
                .collect();
            eprintln!(
                "error: no subcommand given: use one of {} (see --help)",
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
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
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

/// Logs (via `tracing`) go to stderr: warnings and errors by default, only
/// errors with `-q`, whatever `RUST_LOG` says when it is set.
pub fn init_logging(quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let default = if quiet { "error" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
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
