//! `pinpoll-perf`: see `pinpoll-perf --help`.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use pinpoll_perf::{available_cores, session, Cli, Settings};

fn fail(code: u8, message: &str) -> ExitCode {
    let message = message.trim();
    let message = message.strip_prefix("error: ").unwrap_or(message);
    eprintln!("error: {message}");
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    return ExitCode::SUCCESS;
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                | ErrorKind::MissingSubcommand => {
                    return fail(
                        2,
                        "pinpoll-perf requires a subcommand: write-lat, send-lat, read-lat, \
                         write-bw, send-bw or read-bw (see pinpoll-perf --help)",
                    );
                }
                _ => {}
            }
            // clap's message, on one line, without its usage block.
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
            return fail(2, &format!("{first} (see pinpoll-perf --help)"));
        }
    };
    let kind = cli.command.kind();
    let settings = match Settings::from_args(kind, cli.command.args(), available_cores()) {
        Ok(s) => s,
        Err(e) => return fail(2, &e),
    };
    let mut out = std::io::stdout().lock();
    let mut emit = |line: &str| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    match session::run(&settings, &mut emit) {
        Ok(report) => {
            if settings.json {
                println!("{}", report.to_json());
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, &format!("{e:#}")),
    }
}
