//! `pinpoll-perf`: see `pinpoll-perf --help`.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::ExitCode;

use pinpoll_appkit::usage;
use pinpoll_perf::{available_cores, session, Cli, Settings};

/// pinpoll-perf logs nothing: its stdout is the report, and its stderr
/// carries only the one line of a failure.
fn main() -> ExitCode {
    pinpoll_appkit::main(|_: &Cli| None, run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let kind = cli.command.kind();
    let settings = Settings::from_args(kind, cli.command.args(), available_cores())
        .map_err(|e| usage(anyhow::Error::msg(e)))?;
    let mut out = std::io::stdout().lock();
    let mut emit = |line: &str| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let report = session::run(&settings, &mut emit)?;
    if settings.json {
        println!("{}", report.to_json());
    }
    Ok(())
}
