//! The command line: perftest's flags where they mean the same thing,
//! plus ours, checked into [`Settings`] before anything touches a device.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::plan::{check_await_sends, Kind, Mode, Overrides, MAX_ITERS, MAX_SIZE, MIN_ITERS};

/// perftest's default port.
pub const DEFAULT_PORT: u16 = 18515;

#[derive(Debug, Parser)]
#[command(
    name = "pinpoll-perf",
    version,
    about = "perftest-style latency and bandwidth tests of pinpoll",
    long_about = "perftest-style latency and bandwidth tests of pinpoll.\n\n\
        Run one side without HOST (the server: it waits for one client and follows the \
        client's parameters) and the other with HOST (the client: it measures and reports), \
        or both sides in one process with --loopback. Connections use rdma_cm unless --oob \
        asks for perftest's TCP exchange.\n\n\
        Examples:\n  \
        pinpoll-perf write-lat --loopback -d rxe0 -s 8\n  \
        pinpoll-perf write-bw                       # server\n  \
        pinpoll-perf write-bw 169.254.0.1 -s 65536  # client"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// RDMA WRITE ping-pong latency (half a round trip; each side spins on
    /// the last byte of the peer's write, as ib_write_lat does).
    #[command(name = "write-lat")]
    WriteLat(PerfArgs),
    /// SEND/RECV ping-pong latency (half a round trip, as ib_send_lat).
    #[command(name = "send-lat")]
    SendLat(PerfArgs),
    /// RDMA READ latency (a full round trip, as ib_read_lat).
    #[command(name = "read-lat")]
    ReadLat(PerfArgs),
    /// RDMA WRITE bandwidth and message rate (as ib_write_bw).
    #[command(name = "write-bw")]
    WriteBw(PerfArgs),
    /// SEND bandwidth and message rate (as ib_send_bw).
    #[command(name = "send-bw")]
    SendBw(PerfArgs),
    /// RDMA READ bandwidth and message rate (as ib_read_bw).
    #[command(name = "read-bw")]
    ReadBw(PerfArgs),
}

impl Command {
    pub fn kind(&self) -> Kind {
        match self {
            Command::WriteLat(_) => Kind::WriteLat,
            Command::SendLat(_) => Kind::SendLat,
            Command::ReadLat(_) => Kind::ReadLat,
            Command::WriteBw(_) => Kind::WriteBw,
            Command::SendBw(_) => Kind::SendBw,
            Command::ReadBw(_) => Kind::ReadBw,
        }
    }

    pub fn args(&self) -> &PerfArgs {
        match self {
            Command::WriteLat(a)
            | Command::SendLat(a)
            | Command::ReadLat(a)
            | Command::WriteBw(a)
            | Command::SendBw(a)
            | Command::ReadBw(a) => a,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct PerfArgs {
    /// The server to connect to (IPv4, or IPv6 with %interface for
    /// link-local). Without HOST (and without --loopback) this side is
    /// the server.
    pub host: Option<String>,

    /// RDMA device, e.g. rxe0 (perftest's -d). Used by --oob and
    /// --loopback, which open the device themselves; rdma_cm picks the
    /// device that owns the address. Default: $PINPOLL_DEVICE, else the
    /// first device with an active port.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub device: Option<String>,

    /// Port to listen on (server) or connect to (client): rdma_cm's port,
    /// or with --oob the TCP port of the exchange.
    #[arg(short = 'p', long, value_name = "PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,

    /// Message size in bytes, 1..=8388608 (latency default 2, bandwidth
    /// default 65536, as perftest).
    #[arg(short = 's', long, value_name = "BYTES")]
    pub size: Option<usize>,

    /// Measured iterations (at least 5; latency default 1000, bandwidth
    /// default 5000, as perftest).
    #[arg(short = 'n', long = "iters", value_name = "N")]
    pub iters: Option<u64>,

    /// Run every size from 2 to 2^23 bytes, doubling (perftest's -a).
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    pub all: bool,

    /// Send-queue depth in work requests (perftest's --tx-depth).
    /// Default: the profile's send_queue_depth.
    #[arg(short = 't', long = "tx-depth", value_name = "DEPTH")]
    pub tx_depth: Option<u32>,

    /// Work requests posted per doorbell (perftest's --post_list; our
    /// batch_size). Default: the profile's.
    #[arg(short = 'l', long = "post_list", value_name = "N")]
    pub post_list: Option<u32>,

    /// One signaled completion per this many sends (perftest's --cq-mod;
    /// our signal_interval). Default: 16 for latency tests (1 with
    /// --await-sends), the profile's for bandwidth tests. (perftest's
    /// latency tests signal every send: their tx depth of 1 caps -Q at 1,
    /// and ib_write_lat signals every WRITE whatever -Q says.)
    #[arg(short = 'Q', long = "cq-mod", value_name = "N")]
    pub cq_mod: Option<u32>,

    /// Largest payload posted inline, 0 to never inline (perftest's
    /// --inline_size). Default: the profile's inline_threshold. The
    /// device may refuse a large value when the queue pair is created.
    #[arg(short = 'I', long = "inline_size", value_name = "BYTES")]
    pub inline_size: Option<u32>,

    /// Latency tests: signal every send and busy-wait for its completion
    /// before going on, on both sides, and wait for a SEND's answer by
    /// spinning alone (never yielding nor napping), as perftest's latency
    /// tests do (implies -Q 1; direct mode). Without it a send is signaled
    /// once in -Q and never waited for.
    #[arg(long = "await-sends")]
    pub await_sends: bool,

    /// GID index of the port to route by (perftest's -x). Default: the
    /// profile's, else the first RoCE v2 entry. Each side applies its
    /// own (--loopback: both sides).
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u32>,

    /// Latency tests, with --json: every measured round trip's duration
    /// in ticks of the clock (TSC cycles on x86_64, as perftest's -C -U),
    /// in measuring order, with the clock's nanoseconds per tick. At most
    /// 1000000 iterations.
    #[arg(long = "raw-samples", requires = "json")]
    pub raw_samples: bool,

    /// Report bandwidth in Gb/s (10^9 bit/s) instead of MiB/s. The JSON
    /// output always has both.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,

    /// Who posts on the client: `direct` (the measuring thread owns the
    /// connection) or `engine` (a pinned pinpoll::Engine worker owns it).
    /// The server is always direct.
    #[arg(long, value_enum, default_value_t = Mode::Direct)]
    pub mode: Mode,

    /// Core of the busy thread that owns the connection: the measuring
    /// thread in direct mode, the worker in engine mode. With --loopback
    /// the default is core 1 (core 0 is the server's); otherwise unpinned.
    #[arg(long, value_name = "N")]
    pub core: Option<usize>,

    /// Engine mode: core of the measuring (application) thread. With
    /// --loopback the default is core 2 when the machine has 3 or more,
    /// else unpinned.
    #[arg(long, value_name = "N")]
    pub app_core: Option<usize>,

    /// --loopback: core of the server thread (default 0).
    #[arg(long, value_name = "N")]
    pub server_core: Option<usize>,

    /// Tuning profile: a built-in name (latency, throughput, softroce) or a path to a .toml
    /// file (default: `latency` for latency tests, `throughput` for
    /// bandwidth tests). Flags above override its keys. On the server it
    /// sets what the client may ask for (see --max-registered) and what
    /// does not travel (port, GID index, heartbeats).
    #[arg(long, value_name = "NAME|PATH")]
    pub profile: Option<String>,

    /// Server: the most memory one client's data connection may register
    /// (its four rings; 64K, 512M, 2G are binary units). A client asking
    /// for more is refused and told why. Default: the most the server's
    /// --profile registers for this test at any message size (112 MiB
    /// with the default profiles).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub max_registered: Option<u64>,

    /// Put the rings on 2 MiB huge pages (needs reserved pages,
    /// /proc/sys/vm/nr_hugepages).
    #[arg(long)]
    pub hugepages: bool,

    /// Print one JSON document with every figure and the configuration
    /// used, instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Run the server and the client in this process, on two pinned
    /// threads, connected by the TCP exchange over 127.0.0.1.
    #[arg(long, conflicts_with = "host")]
    pub loopback: bool,

    /// Connect by perftest's out-of-band TCP exchange instead of rdma_cm
    /// (works where the RDMA netdev has no IP address).
    #[arg(long)]
    pub oob: bool,

    /// Server: local address to listen on (default: every address).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,

    /// Latency: iterations run before measuring and not counted (default
    /// a tenth of -n, 10..=1000). Bandwidth: operations streamed before
    /// the timed run (default 0, as perftest).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,

    /// Bound in seconds on every wait: connecting, each completion, the
    /// server waiting for its client (a client silent that long is given
    /// up, and the server waits for the next).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub timeout: f64,

    /// Server: the longest one client may hold the server (which serves
    /// one at a time), all its sizes together; then it is told "session
    /// limit reached" and the next client is served. A client also asks
    /// for at most 32 sizes per session (-a asks 23).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_MAX_SESSION_SECS)]
    pub max_session: u64,
}

/// Which side this process plays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Server,
    Client { host: String },
    Loopback,
}

/// How the connection is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    RdmaCm,
    Tcp,
}

impl Transport {
    pub fn name(self, role: &Role) -> &'static str {
        match (role, self) {
            (Role::Loopback, _) => "loopback (TCP exchange on 127.0.0.1)",
            (_, Transport::RdmaCm) => "rdma_cm",
            (_, Transport::Tcp) => "tcp-exchange",
        }
    }
}

/// The command line, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub kind: Kind,
    pub role: Role,
    pub transport: Transport,
    pub device: Option<String>,
    pub port: u16,
    pub bind: Option<String>,
    pub sizes: Vec<usize>,
    pub iters: u64,
    pub warmup: u64,
    pub mode: Mode,
    pub overrides: Overrides,
    pub profile: String,
    pub report_gbits: bool,
    pub json: bool,
    pub core: Option<usize>,
    pub app_core: Option<usize>,
    pub server_core: Option<usize>,
    pub timeout: Duration,
    /// Server: `--max-registered`, if given.
    pub max_registered: Option<u64>,
    /// Server: `--max-session`, the longest one client holds the server.
    pub max_session: Duration,
    /// `--await-sends`: every send signaled and awaited.
    pub await_sends: bool,
    /// `--raw-samples`: every round trip's ticks in the JSON report.
    pub raw_samples: bool,
}

/// `--max-session`'s default: an hour.
pub const DEFAULT_MAX_SESSION_SECS: u64 = 3600;

/// Longest `--max-session`: a week.
pub const MAX_SESSION_SECS: u64 = 7 * 86_400;

/// Most iterations `--raw-samples` prints (per size).
pub const MAX_RAW_SAMPLES: u64 = 1_000_000;

/// perftest's -a sizes: 2, 4, ... 2^23.
pub fn all_sizes() -> Vec<usize> {
    (1..=23).map(|e| 1usize << e).collect()
}

impl Settings {
    /// Checks the flags of `kind`; `cores` is how many cores this process
    /// may use. The error is one line, for `error: ...`.
    pub fn from_args(kind: Kind, a: &PerfArgs, cores: usize) -> Result<Settings, String> {
        let role = role_of(a)?;
        // Under a millisecond would become a zero Duration: every wait
        // would fail at once, naming something else.
        if !a.timeout.is_finite() || a.timeout < 0.001 || a.timeout > 86_400.0 {
            return Err(format!(
                "--timeout {} is out of range: give 0.001 <= SECONDS <= 86400",
                a.timeout
            ));
        }
        if !(1..=MAX_SESSION_SECS).contains(&a.max_session) {
            return Err(format!(
                "--max-session {} is out of range: give 1 <= SECONDS <= {MAX_SESSION_SECS}",
                a.max_session
            ));
        }
        check_role_flags(a, &role)?;
        let sizes = sizes_of(kind, a)?;
        let (iters, warmup) = iterations_of(kind, a)?;
        check_queue_flags(a)?;
        check_sample_flags(kind, a, iters)?;
        let (core, app_core, server_core) = cores_of(a, &role, cores)?;
        let device = a.device.clone().or_else(|| {
            std::env::var("PINPOLL_DEVICE")
                .ok()
                .filter(|d| !d.is_empty())
        });
        Ok(Settings {
            kind,
            transport: if a.oob || role == Role::Loopback {
                Transport::Tcp
            } else {
                Transport::RdmaCm
            },
            role,
            device,
            port: a.port,
            bind: a.bind.clone(),
            sizes,
            iters,
            warmup,
            mode: a.mode,
            overrides: Overrides {
                tx_depth: a.tx_depth,
                post_list: a.post_list,
                // Every send awaited is every send signaled.
                cq_mod: a.cq_mod.or(a.await_sends.then_some(1)),
                inline_size: a.inline_size,
                gid_index: a.gid_index,
                hugepages: a.hugepages,
                timeout: Some(Duration::from_secs_f64(a.timeout)),
            },
            profile: a
                .profile
                .clone()
                .unwrap_or_else(|| kind.default_profile().to_owned()),
            report_gbits: a.report_gbits,
            json: a.json,
            core,
            app_core,
            server_core,
            timeout: Duration::from_secs_f64(a.timeout),
            max_registered: a.max_registered,
            max_session: Duration::from_secs(a.max_session),
            await_sends: a.await_sends,
            raw_samples: a.raw_samples,
        })
    }
}

/// Client (a HOST), server (none) or both in this process (`--loopback`).
fn role_of(a: &PerfArgs) -> Result<Role, String> {
    match (&a.host, a.loopback) {
        (Some(h), false) => Ok(Role::Client { host: h.clone() }),
        (None, true) => Ok(Role::Loopback),
        (None, false) => Ok(Role::Server),
        (Some(_), true) => Err("--loopback takes no HOST".into()),
    }
}

/// The server follows the client's parameters, so it takes none of them;
/// `--bind` and `--max-registered` are the server's alone.
fn check_role_flags(a: &PerfArgs, role: &Role) -> Result<(), String> {
    if *role != Role::Server {
        if a.bind.is_some() {
            return Err("--bind is for the server (run without HOST)".into());
        }
        if a.max_registered.is_some() {
            return Err("--max-registered is for the server (run without HOST)".into());
        }
        if a.max_session != DEFAULT_MAX_SESSION_SECS {
            return Err("--max-session is for the server (run without HOST)".into());
        }
        return Ok(());
    }
    let given: Vec<&str> = [
        (a.size.is_some(), "-s"),
        (a.iters.is_some(), "-n"),
        (a.all, "-a"),
        (a.tx_depth.is_some(), "-t"),
        (a.post_list.is_some(), "-l"),
        (a.cq_mod.is_some(), "-Q"),
        (a.inline_size.is_some(), "-I"),
        (a.mode != Mode::Direct, "--mode"),
        (a.hugepages, "--hugepages"),
        (a.warmup.is_some(), "--warmup"),
        (a.app_core.is_some(), "--app-core"),
        (a.server_core.is_some(), "--server-core"),
        (a.report_gbits, "--report_gbits"),
        (a.await_sends, "--await-sends"),
        (a.raw_samples, "--raw-samples"),
    ]
    .into_iter()
    .filter_map(|(set, flag)| set.then_some(flag))
    .collect();
    match given.as_slice() {
        [] => Ok(()),
        [one] => Err(format!("{one} is {SERVER_FOLLOWS}")),
        many => Err(format!("{} are {SERVER_FOLLOWS}", many.join(", "))),
    }
}

const SERVER_FOLLOWS: &str = "chosen by the client: the server follows the client's parameters (give them to the client, or use --loopback)";

/// The message sizes: `-a`'s, else `-s`, else the kind's default.
fn sizes_of(kind: Kind, a: &PerfArgs) -> Result<Vec<usize>, String> {
    let sizes = if a.all {
        all_sizes()
    } else {
        vec![a.size.unwrap_or(kind.default_size())]
    };
    match sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
        Some(s) => Err(format!("-s {s} is out of range: give 1..={MAX_SIZE} bytes")),
        None => Ok(sizes),
    }
}

/// `-n` and `--warmup` (a tenth of the iterations for latency, within
/// 10..=1000; none for bandwidth).
fn iterations_of(kind: Kind, a: &PerfArgs) -> Result<(u64, u64), String> {
    let iters = a.iters.unwrap_or(kind.default_iters());
    if iters < MIN_ITERS {
        return Err(format!(
            "-n {iters} is too small: give at least {MIN_ITERS} iterations"
        ));
    }
    if iters > MAX_ITERS {
        return Err(format!("-n {iters} is too large: give at most {MAX_ITERS}"));
    }
    let warmup = a.warmup.unwrap_or(if kind.is_latency() {
        (iters / 10).clamp(10, 1000)
    } else {
        0
    });
    if warmup > MAX_ITERS {
        return Err(format!(
            "--warmup {warmup} is too large: give at most {MAX_ITERS}"
        ));
    }
    Ok((iters, warmup))
}

/// `-t`, `-l`, `-Q` and `-I` within what a queue pair takes.
fn check_queue_flags(a: &PerfArgs) -> Result<(), String> {
    for (flag, v) in [("-t", a.tx_depth), ("-l", a.post_list), ("-Q", a.cq_mod)] {
        if v == Some(0) {
            return Err(format!("{flag} 0 is out of range: give at least 1"));
        }
    }
    if a.tx_depth.is_some_and(|t| t > 1 << 16) {
        return Err("-t is out of range: give 1..=65536".into());
    }
    if a.inline_size.is_some_and(|i| i > 4096) {
        return Err("-I is out of range: give 0..=4096 bytes".into());
    }
    Ok(())
}

/// `--await-sends` where it can be done, `--raw-samples` where there are
/// samples and not too many.
fn check_sample_flags(kind: Kind, a: &PerfArgs, iters: u64) -> Result<(), String> {
    let signal_interval = a.cq_mod.unwrap_or(1);
    check_await_sends(a.await_sends, kind, a.mode, signal_interval)?;
    if a.raw_samples && !kind.is_latency() {
        return Err(format!(
            "--raw-samples is for latency tests, not {}",
            kind.name()
        ));
    }
    if a.raw_samples && iters > MAX_RAW_SAMPLES {
        return Err(format!(
            "--raw-samples prints every sample: give -n {MAX_RAW_SAMPLES} or fewer (got {iters})"
        ));
    }
    Ok(())
}

/// (core, app core, server core).
type Cores = (Option<usize>, Option<usize>, Option<usize>);

/// The cores, checked against the `cores` this process may use;
/// `--loopback` puts the server on 0, the measuring thread on 1 and, in
/// engine mode with three or more cores, the application on 2.
fn cores_of(a: &PerfArgs, role: &Role, cores: usize) -> Result<Cores, String> {
    let check_core = |flag: &str, c: Option<usize>| -> Result<(), String> {
        match c {
            Some(c) if c >= cores => Err(format!(
                "{flag} {c} does not exist: this process may use cores 0..={}",
                cores.saturating_sub(1)
            )),
            _ => Ok(()),
        }
    };
    check_core("--core", a.core)?;
    check_core("--app-core", a.app_core)?;
    check_core("--server-core", a.server_core)?;
    if a.app_core.is_some() && a.mode != Mode::Engine {
        return Err("--app-core is for --mode engine".into());
    }
    if a.server_core.is_some() && *role != Role::Loopback {
        return Err("--server-core is for --loopback (a server process uses --core)".into());
    }
    let (mut core, mut app_core, mut server_core) = (a.core, a.app_core, a.server_core);
    if *role == Role::Loopback {
        server_core = server_core.or(Some(0));
        core = core.or(Some(if cores > 1 { 1 } else { 0 }));
        if a.mode == Mode::Engine && app_core.is_none() && cores >= 3 {
            app_core = Some(2);
        }
    }
    Ok((core, app_core, server_core))
}

/// A `--max-registered` value: a positive number of bytes, optionally
/// with a binary unit (K, M, G, T, also written KiB, MiB...).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => {
            return Err(format!(
                "{text:?} is not a number of bytes (e.g. 1048576, 64K, 512M, 2G)"
            ))
        }
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number of bytes (e.g. 1048576, 64K, 512M, 2G)"))?;
    match n.checked_mul(1 << shift) {
        Some(0) => Err(format!("{text:?}: give more than 0 bytes")),
        Some(bytes) => Ok(bytes),
        None => Err(format!("{text:?} is too large")),
    }
}
