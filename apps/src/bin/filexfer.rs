//! `filexfer`: a pipelined, checksummed, durable file transfer over RDMA.
//!
//! `filexfer serve` receives files into `--dir`; `filexfer send HOST FILE`
//! sends one. The protocol and its guarantees are described in
//! `pinpoll_apps::filexfer`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pinpoll::EngineConfig;
use pinpoll_apps::cli::{parse_timeout, CommonArgs};
use pinpoll_apps::filexfer::chunk_pool::default_threads;
use pinpoll_apps::filexfer::client::{self, SendOptions};
use pinpoll_apps::filexfer::protocol::MAX_STREAMS;
use pinpoll_apps::filexfer::server::{self, ServeOptions};
use pinpoll_apps::filexfer::space;
use pinpoll_apps::filexfer::DEFAULT_PORT;
use pinpoll_apps::output::Output;

/// Send files over RDMA: pipelined RDMA WRITE_WITH_IMM into the server's
/// ring of chunk slots, each chunk checked against its BLAKE3 chaining
/// value, the values merged into the file's BLAKE3 digest (what `b3sum`
/// prints), and a file that appears under its name on the server only once
/// it is verified and on disk.
#[derive(Debug, Parser)]
#[command(
    name = "filexfer",
    version,
    after_help = "Examples:\n  filexfer serve --dir /srv/incoming\n  filexfer send 169.254.0.1 ./big.iso\n  filexfer send fe80::5054:ff:fe50:1%rxenet0 notes.txt --port 12346\n\n\
                  File names: the last component of FILE, sent as is; 1 to 255 bytes of UTF-8 \
                  (names that are not UTF-8 are refused), not `.` or `..`, no `/` or NUL, not \
                  starting with `.filexfer-`.\n\
                  Logs go to stderr (RUST_LOG=debug for more). Exit status: 0 on success, \
                  1 on a failure (one `error: ...` line on stderr per failure), 2 on a bad command line."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// rdma_cm port to listen on (serve; 0 picks a free one) or to connect
    /// to (send).
    #[arg(short, long, value_name = "PORT", default_value_t = DEFAULT_PORT, global = true)]
    port: u16,

    /// Back the registered buffers with 2 MiB huge pages (fails with the
    /// fix if none are reserved: see /proc/sys/vm/nr_hugepages).
    #[arg(long, global = true)]
    hugepages: bool,

    /// Pin the busy-polling threads to these CPU cores, a comma-separated
    /// list: stream S (see --streams) to the list's entry S modulo its
    /// length (serve: the accept loop and each transfer's first stream to
    /// the first).
    #[arg(long, value_name = "N[,N...]", global = true, value_delimiter = ',')]
    core: Vec<usize>,

    /// Tuning profile for the transport: the QP's ACK timeout, retry
    /// count and RNR retry count of a profile in tuning/profiles/ (e.g.
    /// `softroce`, whose longer ACK timeout spares a stalling SoftRoCE
    /// guest spurious retransmissions) or of a .toml file. Its other keys
    /// do not apply: the chunk geometry is the protocol's, and --timeout
    /// bounds the waits and heartbeats.
    #[arg(long, value_name = "NAME", global = true)]
    profile: Option<String>,

    /// Threads hashing the chunks beside the busy-polling thread (send:
    /// reading and hashing the file ahead; serve: checking and writing
    /// each transfer's chunks). Default: the cores left after the polling
    /// thread, at least 1.
    #[arg(long, value_name = "N", global = true, value_parser = clap::value_parser!(u32).range(1..=256))]
    verify_threads: Option<u32>,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Receive files into --dir: each client on its own thread, up to
    /// --max-clients at once; until SIGINT/SIGTERM or --count transfers.
    /// Clients of the classic rdma-file-transfer example are served too.
    Serve {
        /// Directory the files are written into (it must exist and be
        /// writable). Nothing is ever written outside it.
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: PathBuf,
        /// Local address to listen on. The default `::` listens on every
        /// RDMA device, for IPv6 and IPv4 clients alike.
        #[arg(long, value_name = "ADDR", default_value = "::")]
        bind: String,
        /// Transfers served at once; a client beyond that is rejected with
        /// "server busy".
        #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
        max_clients: u32,
        /// Exit after this many transfers (successful or not; busy
        /// rejections and failed handshakes do not count); exit status 0
        /// only if all succeeded.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// Replace an existing regular file of the same name (never a
        /// symbolic link or a directory). Without it an existing name is
        /// refused.
        #[arg(long)]
        overwrite: bool,
        /// The largest file accepted, in bytes: a native client declaring
        /// more is refused at its Start, before anything is reserved; a
        /// classic client (no size in advance) is cut off once it sends
        /// more. Default: 64 GiB.
        #[arg(long, value_name = "BYTES", default_value_t = space::DEFAULT_MAX_SIZE, value_parser = clap::value_parser!(u64).range(1..))]
        max_size: u64,
        /// The free space every transfer must leave in --dir's file
        /// system, in bytes: a file that would leave less is refused
        /// before any data moves (classic: cut off). Default: a twentieth
        /// of the file system, at most 1 GiB.
        #[arg(long, value_name = "BYTES")]
        min_free: Option<u64>,
        /// The slowest a transfer may be, in bytes per second over any 10 s
        /// once its chunks flow: a slower one is ended with an error and
        /// its temporary file removed, so a trickling client cannot hold a
        /// slot and its reservation. 0: no bound.
        #[arg(long, value_name = "BYTES_PER_S", default_value_t = 65536)]
        min_rate: u64,
        /// The longest a transfer may take once its chunks flow, in
        /// seconds; a longer one is ended like a slow one. 0: no bound.
        #[arg(long, value_name = "SECONDS", default_value_t = 86400)]
        deadline: u64,
    },
    /// Send FILE to a filexfer server; exit 0 once the server has it
    /// verified, fsynced and in place.
    Send {
        /// The server's IP address: IPv4, or IPv6 (link-local with
        /// %interface). It must be reachable through an RDMA device (not
        /// 127.0.0.1 on SoftRoCE).
        host: String,
        /// The file to send; the server stores it under its last path
        /// component.
        file: PathBuf,
        /// Talk to a server of the classic rdma-file-transfer example (no
        /// checksums: integrity rests on the link's own CRCs).
        #[arg(long)]
        classic: bool,
        /// Connect first, then wait up to SECONDS for FILE to appear (e.g.
        /// renamed into place by the job that writes it) and send it at
        /// once. Heartbeats watch the idle connection meanwhile: a server
        /// that dies or leaves ends the wait with an error. The server
        /// drops a client that stays silent past its own --timeout, so
        /// keep SECONDS below that.
        #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, conflicts_with = "classic")]
        wait_for_file: Option<Duration>,
        /// Queue pairs to stripe the file across, each driven by its own
        /// polling thread (pinned with --core); the server reassembles and
        /// verifies them as one file.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_STREAMS)), conflicts_with = "classic")]
        streams: u16,
    },
}

fn main() -> ExitCode {
    pinpoll_apps::run::main(|cli: &Cli| Some(log_filter(cli.common.quiet)), run)
}

/// Logging as every pinpoll program does it, except that the engine's
/// warning about a connection that did not drain at close is left out:
/// filexfer closes only after the outcome is settled, and a failure says
/// so in its `error:` line. RUST_LOG overrides.
fn log_filter(quiet: bool) -> &'static str {
    if quiet {
        "error"
    } else {
        "warn,pinpoll::datapath=error"
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let out = Output::new(cli.common.quiet);
    let profile = cli
        .profile
        .as_deref()
        .map(EngineConfig::load)
        .transpose()
        .context("--profile")?;
    let verify_threads = cli
        .verify_threads
        .map_or_else(default_threads, |n| n as usize);
    match cli.command {
        Command::Serve {
            dir,
            bind,
            max_clients,
            count,
            overwrite,
            max_size,
            min_free,
            min_rate,
            deadline,
        } => server::serve(
            &ServeOptions {
                dir,
                bind,
                port: cli.port,
                hugepages: cli.hugepages,
                max_clients: max_clients as usize,
                count,
                overwrite,
                cores: cli.core.clone(),
                verify_threads,
                max_size,
                min_free,
                min_rate,
                deadline: Duration::from_secs(deadline),
                profile,
            },
            &cli.common,
            out,
        ),
        Command::Send {
            host,
            file,
            classic,
            wait_for_file,
            streams,
        } => client::send(
            &SendOptions {
                host,
                file,
                port: cli.port,
                hugepages: cli.hugepages,
                cores: cli.core,
                streams,
                classic,
                wait_for_file,
                verify_threads,
                profile,
            },
            &cli.common,
            out,
        ),
    }
}
