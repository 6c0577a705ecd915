//! `readwrite`: the classic RDMA WRITE / RDMA READ example.
//!
//! The client connects over rdma_cm, naming its mode in the connect private
//! data (see `pinpoll_apps::protocol`). The server registers one region
//! with exactly the access that mode needs and SENDs its descriptor
//! (address, length, rkey). In `write` mode the client RDMA-WRITEs its
//! message into that region; in `read` mode it RDMA-READs the server's
//! message from it and prints it. Then the client SENDs "done" with the
//! byte count, the server (in write mode) prints what landed in its region,
//! and both disconnect.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use clap::{Parser, Subcommand};
use pinpoll::connect::RegionDescriptor;
use pinpoll::{Access, Endpoint, MemoryRegion, PageSize, SendFlags, WcOpcode};
use pinpoll_apps::cli::{parse_message, CommonArgs, ServerArgs, MAX_MESSAGE};
use pinpoll_apps::output::{printable, Output};
use pinpoll_apps::protocol::{Done, Hello, Mode};
use pinpoll_apps::session::{self, Client};

const DEFAULT_PORT: u16 = 7472;
/// The size of the server's region in write mode: the longest message.
const WRITE_REGION: usize = MAX_MESSAGE;
/// Receive buffers for control messages (descriptor, done): larger than
/// either, so a peer's oversized message is an error we name, not a
/// length error in the NIC.
const CONTROL_RECV: usize = 64;

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_WRITE: u64 = 3;
const WR_READ: u64 = 4;

/// RDMA WRITE into, or RDMA READ from, a peer's memory region, after
/// swapping region descriptors with SEND/RECV over an rdma_cm connection.
#[derive(Debug, Parser)]
#[command(
    name = "readwrite",
    version,
    after_help = "Examples:\n  readwrite server\n  readwrite client write 169.254.0.1 --message 'hello, region'\n  readwrite client read fe80::5054:ff:fe50:1%rxenet0\n\n\
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
    /// Serve clients one at a time: expose a region for the mode each one
    /// asks for, print what a writer wrote, disconnect; until SIGINT/SIGTERM
    /// or --count clients.
    Server {
        #[command(flatten)]
        args: ServerArgs,
        /// What a client in read mode reads (1 to 4096 bytes) [default:
        /// "message from server pid N"].
        #[arg(long, value_name = "TEXT", value_parser = parse_message)]
        message: Option<String>,
    },
    /// Connect to a server and write into, or read from, its region.
    Client {
        /// What to do to the server's region.
        #[arg(value_enum)]
        mode: Mode,
        /// The server's IP address: IPv4, or IPv6 (link-local with
        /// %interface, e.g. fe80::1%rxenet0). It must be reachable through an
        /// RDMA device (not 127.0.0.1 on SoftRoCE).
        host: String,
        /// What write mode writes (1 to 4096 bytes) [default: "message from
        /// client pid N"]. Not for read mode.
        #[arg(long, value_name = "TEXT", value_parser = parse_message)]
        message: Option<String>,
    },
}

fn main() -> ExitCode {
    pinpoll_apps::run::main(|cli: &Cli| cli.common.quiet, run)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let out = Output::new(cli.common.quiet);
    let timeout = cli.common.timeout;
    match &cli.command {
        Command::Server { args, message } => {
            let message = message
                .clone()
                .unwrap_or_else(|| format!("message from server pid {}", std::process::id()));
            session::serve(args, &cli.common, cli.port, out, |mut req, out| {
                let mode = match Hello::decode(req.private_data()) {
                    Ok(hello) => hello.mode,
                    Err(err) => return Err(session::refuse(req, err.into())),
                };
                let side = match ServerSide::prepare(req.endpoint(), mode, message.as_bytes()) {
                    Ok(side) => side,
                    Err(err) => return Err(session::refuse(req, err)),
                };
                out.progress(format_args!(
                    "mode {mode}: exposing {} bytes with access {}",
                    side.region.len(),
                    side.region.access()
                ))?;
                let ep = req.accept(&[]).context("accepting")?;
                side.serve(ep, timeout, out)
            })
        }
        Command::Client {
            mode,
            host,
            message,
        } => {
            let message = match (mode, message) {
                (Mode::Write, Some(m)) => m.clone(),
                (Mode::Write, None) => format!("message from client pid {}", std::process::id()),
                (Mode::Read, Some(_)) => bail!(
                    "--message is for write mode; in read mode the client prints the server's message"
                ),
                (Mode::Read, None) => String::new(),
            };
            client(*mode, host, cli.port, &cli.common, message.as_bytes(), &out)
        }
    }
}

/// One connection's memory on the server.
struct ServerSide {
    mode: Mode,
    /// The region the client writes into or reads from.
    region: MemoryRegion,
    /// Receives the client's done message (LOCAL_WRITE).
    recv: MemoryRegion,
    /// The region's descriptor, to send (no access flags: the NIC only
    /// reads it).
    descriptor: MemoryRegion,
}

impl ServerSide {
    /// Registers the region with the fewest rights `mode` needs (filled with
    /// `message` for a reader), and posts the receive for the done message,
    /// before the connection exists.
    fn prepare(ep: &mut Endpoint, mode: Mode, message: &[u8]) -> anyhow::Result<ServerSide> {
        let len = match mode {
            Mode::Write => WRITE_REGION,
            Mode::Read => message.len(),
        };
        let mut region = ep
            .register(len, PageSize::Base, mode.region_access())
            .with_context(|| format!("registering the region for {mode} mode"))?;
        if mode == Mode::Read {
            region.as_mut_slice().copy_from_slice(message);
        }
        tracing::debug!(?region, %mode, "region registered");
        let recv = ep
            .register(CONTROL_RECV, PageSize::Base, Access::LOCAL_WRITE)
            .context("registering the receive buffer")?;
        let mut descriptor = ep
            .register(RegionDescriptor::LEN, PageSize::Base, Access::LOCAL_READ)
            .context("registering the descriptor buffer")?;
        descriptor
            .as_mut_slice()
            .copy_from_slice(&RegionDescriptor(region.remote(0..len)?).encode());
        ep.qp()
            .post_recv(WR_RECV, Some(recv.slice(0..CONTROL_RECV)?))
            .context("posting the receive")?;
        Ok(ServerSide {
            mode,
            region,
            recv,
            descriptor,
        })
    }

    /// Sends the descriptor, waits for "done", prints what a writer wrote.
    fn serve(self, mut ep: Endpoint, timeout: Duration, out: &Output) -> anyhow::Result<()> {
        ep.qp()
            .post_send(
                WR_SEND,
                self.descriptor.slice(0..RegionDescriptor::LEN)?,
                SendFlags::SIGNALED,
            )
            .context("sending the region descriptor")?;
        session::wait_send(
            &mut ep,
            timeout,
            WR_SEND,
            WcOpcode::SEND,
            "the region descriptor to be delivered",
        )?;
        let got = session::wait_recv(&mut ep, timeout, WR_RECV, "the client's done message")?;
        let done = Done::decode(&self.recv.as_slice()[..got.byte_len as usize])
            .context("the client's done message")?;
        let len = done.len as usize;
        ensure!(
            len <= self.region.len(),
            "the client says it moved {len} bytes; the region has {}",
            self.region.len()
        );
        match self.mode {
            Mode::Write => out.data(format_args!(
                "{}",
                printable(&self.region.as_slice()[..len])
            ))?,
            Mode::Read => out.progress(format_args!("client read {len} bytes"))?,
        }
        session::disconnect(ep)
    }
}

fn client(
    mode: Mode,
    host: &str,
    port: u16,
    common: &CommonArgs,
    message: &[u8],
    out: &Output,
) -> anyhow::Result<()> {
    let timeout = common.timeout;
    let mut client = Client::resolve(host, port, common)?;
    let ep = client.endpoint();
    let recv = ep
        .register(CONTROL_RECV, PageSize::Base, Access::LOCAL_WRITE)
        .context("registering the receive buffer")?;
    let mut done = ep
        .register(Done::LEN, PageSize::Base, Access::LOCAL_READ)
        .context("registering the done buffer")?;
    // Write mode's source: the NIC only reads it.
    let source = match mode {
        Mode::Write => {
            let mut mr = ep
                .register(message.len(), PageSize::Base, Access::LOCAL_READ)
                .context("registering the message")?;
            mr.as_mut_slice().copy_from_slice(message);
            Some(mr)
        }
        Mode::Read => None,
    };
    ep.qp()
        .post_recv(WR_RECV, Some(recv.slice(0..CONTROL_RECV)?))
        .context("posting the receive")?;
    let addr = client.addr();
    let mut ep = client.connect(&Hello { mode }.encode())?;
    out.progress(format_args!("connected to {addr} on {}", ep.device_name()))?;

    let got = session::wait_recv(&mut ep, timeout, WR_RECV, "the server's region descriptor")?;
    let bytes = &recv.as_slice()[..got.byte_len as usize];
    ensure!(
        bytes.len() == RegionDescriptor::LEN,
        "the server's region descriptor has {} bytes, expected {}",
        bytes.len(),
        RegionDescriptor::LEN
    );
    let remote = RegionDescriptor::decode(bytes)
        .context("the server's region descriptor")?
        .0;
    out.progress(format_args!(
        "server region: {} bytes at {:#x}, rkey {:#x}",
        remote.len, remote.addr, remote.rkey
    ))?;

    let moved = match (mode, &source) {
        (Mode::Write, Some(source)) => {
            let target = remote
                .sub(0, source.len() as u64)
                .context("the message does not fit the server's region")?;
            ep.qp()
                .post_write(
                    WR_WRITE,
                    source.slice(0..source.len())?,
                    target,
                    None,
                    SendFlags::SIGNALED,
                )
                .context("posting the RDMA WRITE")?;
            session::wait_send(
                &mut ep,
                timeout,
                WR_WRITE,
                WcOpcode::RDMA_WRITE,
                "the RDMA WRITE",
            )?;
            out.progress(format_args!(
                "wrote {} bytes into the server's region",
                source.len()
            ))?;
            source.len()
        }
        _ => {
            let len = usize::try_from(remote.len).unwrap_or(usize::MAX);
            ensure!(
                (1..=MAX_MESSAGE).contains(&len),
                "the server's region has {} bytes; this client reads 1 to {MAX_MESSAGE}",
                remote.len
            );
            // The READ's target: the NIC writes it.
            let target = ep
                .register(len, PageSize::Base, Access::LOCAL_WRITE)
                .context("registering the read buffer")?;
            ep.qp()
                .post_read(WR_READ, target.slice(0..len)?, remote, true)
                .context("posting the RDMA READ")?;
            session::wait_send(
                &mut ep,
                timeout,
                WR_READ,
                WcOpcode::RDMA_READ,
                "the RDMA READ",
            )?;
            out.data(format_args!("{}", printable(target.as_slice())))?;
            len
        }
    };

    done.as_mut_slice().copy_from_slice(
        &Done {
            len: u32::try_from(moved).context("byte count")?,
        }
        .encode(),
    );
    ep.qp()
        .post_send(WR_SEND, done.slice(0..Done::LEN)?, SendFlags::SIGNALED)
        .context("sending the done message")?;
    session::wait_send(
        &mut ep,
        timeout,
        WR_SEND,
        WcOpcode::SEND,
        "the done message to be delivered",
    )?;
    session::disconnect(ep)
}
