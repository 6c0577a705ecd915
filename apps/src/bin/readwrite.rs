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
use pinpoll::{
    Access, Endpoint, MemoryRegion, PageSize, Posted, RegionOp, RemoteSlice, SharedRegion, WcOpcode,
};
use pinpoll_apps::appkit::logging::level;
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
    pinpoll_apps::run::main(|cli: &Cli| Some(level(cli.common.quiet)), run)
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
    /// The region the client writes into or reads from.
    region: Exposed,
    /// The receive for the client's done message (LOCAL_WRITE), posted.
    recv: Posted,
    /// The region's descriptor, to send (no access flags: the NIC only
    /// reads it).
    descriptor: MemoryRegion,
}

/// The server's region: one the client writes into (never borrowed, only
/// copied out of), or one it only reads.
enum Exposed {
    Written(SharedRegion),
    Read(MemoryRegion),
}

impl Exposed {
    fn len(&self) -> usize {
        match self {
            Exposed::Written(r) => r.len(),
            Exposed::Read(r) => r.len(),
        }
    }

    fn access(&self) -> Access {
        match self {
            Exposed::Written(r) => r.access(),
            Exposed::Read(r) => r.access(),
        }
    }

    fn remote(&self) -> pinpoll::Result<RemoteSlice> {
        match self {
            Exposed::Written(r) => r.remote(0..r.len()),
            Exposed::Read(r) => r.remote(0..r.len()),
        }
    }
}

impl ServerSide {
    /// Registers the region with the fewest rights `mode` needs (filled with
    /// `message` for a reader), and posts the receive for the done message,
    /// before the connection exists.
    fn prepare(ep: &mut Endpoint, mode: Mode, message: &[u8]) -> anyhow::Result<ServerSide> {
        let access = mode.region_access();
        let region = match mode {
            Mode::Write => ep
                .register_shared(
                    WRITE_REGION,
                    PageSize::Base,
                    access.contains(Access::REMOTE_READ),
                )
                .map(Exposed::Written),
            Mode::Read => ep
                .register(message.len(), PageSize::Base, access)
                .map(|mut r| {
                    r.as_mut_slice().copy_from_slice(message);
                    Exposed::Read(r)
                }),
        }
        .with_context(|| format!("registering the region for {mode} mode"))?;
        tracing::debug!(len = region.len(), access = %region.access(), %mode, "region registered");
        let recv = ep
            .register(CONTROL_RECV, PageSize::Base, Access::LOCAL_WRITE)
            .context("registering the receive buffer")?;
        let mut descriptor = ep
            .register(RegionDescriptor::LEN, PageSize::Base, Access::LOCAL_READ)
            .context("registering the descriptor buffer")?;
        descriptor
            .as_mut_slice()
            .copy_from_slice(&RegionDescriptor(region.remote()?).encode());
        let recv = ep.post_recv(Some(recv)).context("posting the receive")?;
        Ok(ServerSide {
            region,
            recv,
            descriptor,
        })
    }

    /// Sends the descriptor, waits for "done", prints what a writer wrote.
    fn serve(self, mut ep: Endpoint, timeout: Duration, out: &Output) -> anyhow::Result<()> {
        let sent = ep
            .post(self.descriptor, RegionDescriptor::LEN, RegionOp::Send)
            .context("sending the region descriptor")?;
        session::complete(
            &mut ep,
            sent,
            timeout,
            WcOpcode::SEND,
            "the region descriptor to be delivered",
        )?;
        let got = session::complete(
            &mut ep,
            self.recv,
            timeout,
            WcOpcode::RECV,
            "the client's done message",
        )?;
        let recv = got.region.context("the receive gave no buffer back")?;
        let done = Done::decode(&recv.as_slice()[..got.done.byte_len as usize])
            .context("the client's done message")?;
        let len = done.len as usize;
        ensure!(
            len <= self.region.len(),
            "the client says it moved {len} bytes; the region has {}",
            self.region.len()
        );
        match &self.region {
            Exposed::Written(region) => {
                // A copy: the client could still write the region.
                let mut written = vec![0; len];
                region.copy_to(0, &mut written)?;
                out.data(format_args!("{}", printable(&written)))?
            }
            Exposed::Read(_) => out.progress(format_args!("client read {len} bytes"))?,
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
    let done = ep
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
    let recv = ep.post_recv(Some(recv)).context("posting the receive")?;
    let addr = client.addr();
    let mut ep = client.connect(&Hello { mode }.encode())?;
    out.progress(format_args!("connected to {addr} on {}", ep.device_name()))?;
    let remote = server_region(&mut ep, recv, timeout)?;
    out.progress(format_args!(
        "server region: {} bytes at {:#x}, rkey {:#x}",
        remote.len, remote.addr, remote.rkey
    ))?;
    let moved = match (mode, source) {
        (Mode::Write, Some(source)) => write_message(&mut ep, source, remote, timeout, out)?,
        _ => read_message(&mut ep, remote, timeout, out)?,
    };
    send_done(&mut ep, done, moved, timeout)?;
    session::disconnect(ep)
}

/// The server's region, from the descriptor it SENDs first.
fn server_region(
    ep: &mut Endpoint,
    recv: Posted,
    timeout: Duration,
) -> anyhow::Result<RemoteSlice> {
    let got = session::complete(
        ep,
        recv,
        timeout,
        WcOpcode::RECV,
        "the server's region descriptor",
    )?;
    let recv = got.region.context("the receive gave no buffer back")?;
    let bytes = &recv.as_slice()[..got.done.byte_len as usize];
    ensure!(
        bytes.len() == RegionDescriptor::LEN,
        "the server's region descriptor has {} bytes, expected {}",
        bytes.len(),
        RegionDescriptor::LEN
    );
    Ok(RegionDescriptor::decode(bytes)
        .context("the server's region descriptor")?
        .0)
}

/// RDMA-WRITEs `source` to the front of the server's region; returns the
/// bytes written.
fn write_message(
    ep: &mut Endpoint,
    source: MemoryRegion,
    remote: RemoteSlice,
    timeout: Duration,
    out: &Output,
) -> anyhow::Result<usize> {
    let len = source.len();
    let target = remote
        .sub(0, len as u64)
        .context("the message does not fit the server's region")?;
    let write = RegionOp::Write {
        remote: target,
        imm: None,
    };
    let posted = ep
        .post(source, len, write)
        .context("posting the RDMA WRITE")?;
    session::complete(ep, posted, timeout, WcOpcode::RDMA_WRITE, "the RDMA WRITE")?;
    out.progress(format_args!("wrote {len} bytes into the server's region"))?;
    Ok(len)
}

/// RDMA-READs the whole server region and prints it; returns the bytes read.
fn read_message(
    ep: &mut Endpoint,
    remote: RemoteSlice,
    timeout: Duration,
    out: &Output,
) -> anyhow::Result<usize> {
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
    let posted = ep
        .post(target, len, RegionOp::Read { remote })
        .context("posting the RDMA READ")?;
    let read = session::complete(ep, posted, timeout, WcOpcode::RDMA_READ, "the RDMA READ")?;
    let target = read.region.context("the RDMA READ gave no buffer back")?;
    out.data(format_args!("{}", printable(target.as_slice())))?;
    Ok(len)
}

/// SENDs the done message: the client has finished with the region,
/// having moved `moved` bytes.
fn send_done(
    ep: &mut Endpoint,
    mut done: MemoryRegion,
    moved: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    done.as_mut_slice().copy_from_slice(
        &Done {
            len: u32::try_from(moved).context("byte count")?,
        }
        .encode(),
    );
    let sent = ep
        .post(done, Done::LEN, RegionOp::Send)
        .context("sending the done message")?;
    session::complete(
        ep,
        sent,
        timeout,
        WcOpcode::SEND,
        "the done message to be delivered",
    )?;
    Ok(())
}
