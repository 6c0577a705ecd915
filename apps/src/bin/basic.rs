//! `basic`: the classic rdma_cm SEND/RECV example.
//!
//! The client connects to the server over rdma_cm; each side sends one text
//! message (`message from client pid N` / `message from server pid N`) with
//! a SEND, receives the other's into a receive it posted before the
//! connection existed, prints it, and disconnects. The server then serves
//! the next client.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pinpoll::{Access, Endpoint, MemoryRegion, PageSize, Posted, RegionOp, WcOpcode};
use pinpoll_apps::appkit::logging::level;
use pinpoll_apps::cli::{CommonArgs, ServerArgs, MAX_MESSAGE};
use pinpoll_apps::output::{printable, Output};
use pinpoll_apps::session::{self, Client};

const DEFAULT_PORT: u16 = 7471;

/// Swap one text message each way with SEND/RECV over an rdma_cm
/// connection.
#[derive(Debug, Parser)]
#[command(
    name = "basic",
    version,
    after_help = "Examples:\n  basic server\n  basic client 169.254.0.1\n  basic client fe80::5054:ff:fe50:1%rxenet0 --port 7471\n\n\
                  Logs go to stderr (RUST_LOG=debug for more). Exit status: 0 on success, \
                  1 on a failure (one `error: ...` line on stderr), 2 on a bad command line."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// rdma_cm port to listen on (server; 0 picks a free one) or to connect
    /// to (client).
    #[arg(short, long, value_name = "PORT", default_value_t = DEFAULT_PORT, global = true)]
    port: u16,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve clients one at a time: receive each one's message, send ours,
    /// disconnect; until SIGINT/SIGTERM or --count clients.
    Server(ServerArgs),
    /// Connect to a server, swap messages with it, disconnect.
    Client {
        /// The server's IP address: IPv4, or IPv6 (link-local with
        /// %interface, e.g. fe80::1%rxenet0). It must be reachable through an
        /// RDMA device (not 127.0.0.1 on SoftRoCE).
        host: String,
    },
}

fn main() -> ExitCode {
    pinpoll_apps::run::main(|cli: &Cli| Some(level(cli.common.quiet)), run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let out = Output::new(cli.common.quiet);
    match &cli.command {
        Command::Server(args) => {
            // What each client gets registered: a locked-memory limit that
            // cannot take it is a start-up error, not a refusal of every
            // client later.
            let page = PageSize::Base.bytes();
            let per_client = MAX_MESSAGE.div_ceil(page) * page + page;
            pinpoll::memory::check_memlock(per_client as u64)
                .context("registering a client's buffers")?;
            session::serve(args, &cli.common, cli.port, out, |mut req, out| {
                let message = format!("message from server pid {}", std::process::id());
                let buffers = match Buffers::prepare(req.endpoint(), message.as_bytes()) {
                    Ok(b) => b,
                    Err(err) => return Err(session::refuse(req, err)),
                };
                let ep = req.accept(&[]).context("accepting")?;
                exchange(ep, buffers, cli.common.timeout, out)
            })
        }
        Command::Client { host } => {
            let message = format!("message from client pid {}", std::process::id());
            let mut client = Client::resolve(host, cli.port, &cli.common)?;
            let buffers = Buffers::prepare(client.endpoint(), message.as_bytes())?;
            let addr = client.addr();
            let ep = client.connect(&[])?;
            out.progress(format_args!("connected to {addr} on {}", ep.device_name()))?;
            exchange(ep, buffers, cli.common.timeout, &out)
        }
    }
}

/// A receive buffer (the NIC writes it: LOCAL_WRITE), posted, and our
/// message (only read by the NIC: no access flags), registered on one
/// connection's PD.
struct Buffers {
    recv: Posted,
    send: MemoryRegion,
}

impl Buffers {
    /// Registers both and posts the receive, before the connection exists,
    /// so the peer's message always finds it.
    fn prepare(ep: &mut Endpoint, message: &[u8]) -> anyhow::Result<Buffers> {
        let recv = ep
            .register(MAX_MESSAGE, PageSize::Base, Access::LOCAL_WRITE)
            .context("registering the receive buffer")?;
        let mut send = ep
            .register(message.len(), PageSize::Base, Access::LOCAL_READ)
            .context("registering the message")?;
        send.as_mut_slice().copy_from_slice(message);
        let recv = ep.post_recv(Some(recv)).context("posting the receive")?;
        Ok(Buffers { recv, send })
    }
}

/// Sends ours, receives theirs, prints it, disconnects.
fn exchange(
    mut ep: Endpoint,
    buffers: Buffers,
    timeout: Duration,
    out: &Output,
) -> anyhow::Result<()> {
    let len = buffers.send.len();
    let sent = ep
        .post(buffers.send, len, RegionOp::Send)
        .context("sending our message")?;
    session::complete(
        &mut ep,
        sent,
        timeout,
        WcOpcode::SEND,
        "our message to be delivered",
    )?;
    let got = session::complete(
        &mut ep,
        buffers.recv,
        timeout,
        WcOpcode::RECV,
        "the peer's message",
    )?;
    let recv = got.region.context("the receive gave no buffer back")?;
    let text = recv
        .as_slice()
        .get(..got.done.byte_len as usize)
        .context("the received length exceeds the receive buffer")?;
    out.data(format_args!("{}", printable(text)))?;
    session::disconnect(ep)
}
