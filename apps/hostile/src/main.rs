//! `pinpoll-hostile`: what an attacker sends a `filexfer serve`, one
//! attack per run, each checking that the server answered as SECURITY.md
//! says it must (a refusal, a bounded wait) and printing one summary line.
//! For the fault suite (scripts/fault/hostile.sh): it never stores
//! anything and runs only against the server it is pointed at.
#![forbid(unsafe_code)]

mod attacks;
mod raw;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "pinpoll-hostile", version, about)]
struct Cli {
    /// The server's address (an address of its RDMA netdev).
    host: String,
    /// The server's rdma_cm port.
    #[arg(long, default_value_t = pinpoll_apps::filexfer::DEFAULT_PORT)]
    port: u16,
    /// Bound in seconds on every wait for the server.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
    #[command(subcommand)]
    attack: Attack,
}

#[derive(Debug, Subcommand)]
enum Attack {
    /// Connect requests whose private data is no hello; each must be
    /// rejected.
    BadHellos {
        #[arg(long, default_value_t = 2000)]
        count: usize,
        /// Connecting threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
    /// Transfers of 2 streams whose join (with the valid token) never
    /// completes its handshake; the server must fail each transfer.
    StalledJoins {
        #[arg(long, default_value_t = 1)]
        count: usize,
    },
    /// Joins with guessed tokens; each must be rejected.
    GuessedTokens {
        #[arg(long, default_value_t = 200)]
        count: usize,
    },
    /// Native hellos that never complete their handshake, held for
    /// --hold seconds each, one after another.
    HalfOpen {
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[arg(long, default_value_t = 15)]
        hold: u64,
    },
    /// A Start announcing SIZE bytes (the server's free space), then
    /// nothing; the server must refuse it before reserving anything.
    Announce {
        #[arg(long)]
        size: u64,
    },
    /// A real transfer of SIZE bytes at RATE bytes/s (just above the
    /// server's --min-rate); it must be stored.
    Trickle {
        #[arg(long)]
        size: u64,
        #[arg(long)]
        rate: u64,
    },
}

fn main() -> ExitCode {
    pinpoll_appkit::main(|_: &Cli| Some("warn"), run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let addr: SocketAddr = pinpoll::connect::parse_socket_addr(&cli.host, cli.port)?;
    let target = attacks::Target {
        addr,
        timeout: Duration::from_secs(cli.timeout),
    };
    let summary = match cli.attack {
        Attack::BadHellos { count, threads } => attacks::bad_hellos(&target, count, threads)?,
        Attack::StalledJoins { count } => attacks::stalled_joins(&target, count)?,
        Attack::GuessedTokens { count } => attacks::guessed_tokens(&target, count)?,
        Attack::HalfOpen { count, hold } => {
            attacks::half_open(&target, count, Duration::from_secs(hold))?
        }
        Attack::Announce { size } => attacks::announce(&target, size)?,
        Attack::Trickle { size, rate } => attacks::trickle(&target, size, rate)?,
    };
    println!("{summary}");
    Ok(())
}
