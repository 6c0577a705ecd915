//! `pinpoll-tune`: check engine profiles, check a host for busy-poll
//! RDMA (`doctor`), measure a parameter grid to recommend a profile
//! (`sweep`), and draw the benchmark comparison (`plot`).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context as _};
use clap::{Parser, Subcommand};
use pinpoll::EngineConfig;
use pinpoll_tune::cpulist::{self, CpuSet};
use pinpoll_tune::doctor::{self, CoresFrom, Inputs, Status};
use pinpoll_tune::plot::benchmarks::ComparisonSummary;
use pinpoll_tune::sweep::measure::Workload;
use pinpoll_tune::{facts, profile, SystemRoot};

#[derive(Debug, Parser)]
#[command(
    name = "pinpoll-tune",
    version,
    about = "Tuning kit of pinpoll: check engine profiles, check a host for busy-poll RDMA, sweep engine parameters, plot benchmarks",
    after_help = "Exit status: 0 success; 1 a doctor check failed, `profile check` found the profile invalid,\nor a sweep workload has no point measured at every size; 2 bad usage (including a doctor\n--profile that does not load, and a sweep that cannot start: no pinpoll-perf, a bad grid; a plot\nwhose summary cannot be read, or lacks a field).\nLogs: RUST_LOG=debug shows the verbs queries the doctor makes (stderr)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect this host for busy-poll RDMA and print check, status, finding and fix
    ///
    /// Checks: RDMA devices (hardware or SoftRoCE), port state, active vs max
    /// MTU, link layer and GID; whether the profile fits the device, and how
    /// many of its connections the device holds at once (by max_qp, max_cq,
    /// max_mr, max_pd) and what shared receive queues it offers; 2 MiB and
    /// 1 GiB huge pages; the locked-memory limit; transparent huge pages; the
    /// worker cores, their frequency governor and C-states; isolcpus,
    /// nohz_full and rcu_nocbs; NUMA locality of the NIC; its IRQ affinity.
    /// Every finding is read from sysfs, procfs or verbs; what cannot be read
    /// is reported as "warn: cannot read X: reason". Exits 1 when any check
    /// fails.
    Doctor(DoctorArgs),
    /// Engine profiles (the built-in ones, or a .toml file)
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Measure pinpoll-perf workloads over a grid of engine parameters and
    /// message sizes, and recommend a profile for this host
    ///
    /// Every grid point is a profile (the base profile with the point's
    /// keys) run as `pinpoll-perf WORKLOAD --loopback -s SIZE --profile
    /// POINT.toml --json`, --repeat times (repeats outermost, so a noisy
    /// spell hits every point alike); figures are medians of the repeats.
    /// Invalid combinations (the engine's relations, the device's inline
    /// limit) are skipped and reported. Writes into --out: runs.csv (every
    /// run), medians.csv (one row per point and size), WORKLOAD.svg (median
    /// p50/p99 or bandwidth against each swept key), and
    /// recommended-WORKLOAD.toml / recommended.toml: latency workloads
    /// minimize median p50 (tie-break p99), bandwidth workloads maximize
    /// median MiB/s.
    Sweep(SweepArgs),
    /// Draw the benchmark comparison (docs/benchmarks.svg) from the
    /// summary.json of `scripts/compare-perftest.sh --sweep`
    ///
    /// Two panels against message size: RDMA WRITE latency p50, p99 and
    /// p99.9 (half round trip, µs), and RDMA WRITE bandwidth (Gb/s),
    /// pinpoll-perf against perftest, both on log scales. Reads `rounds`,
    /// `sweep.write_lat[].{bytes, pinpoll, perftest}.{p50, p99, p99_9}` and
    /// `sweep.write_bw[].{bytes, pinpoll, perftest}`; a null figure (a point
    /// whose every round failed) is left out of its line. A missing or
    /// mistyped field is an error that names it.
    Plot(PlotArgs),
}

#[derive(Debug, clap::Args)]
struct PlotArgs {
    /// The summary.json of a compare-perftest run
    /// (target/compare-perftest/<run>/summary.json)
    #[arg(value_name = "SUMMARY.json")]
    summary: PathBuf,
    /// Where to write the SVG [default: benchmarks.svg beside SUMMARY.json]
    #[arg(short = 'o', long, value_name = "OUT.svg")]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct SweepArgs {
    /// pinpoll-perf workloads, comma-separated: write-lat, send-lat,
    /// read-lat, write-bw, send-bw, read-bw. The first one's
    /// recommendation is also written as recommended.toml
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "write-lat,write-bw"
    )]
    workloads: Vec<Workload>,
    /// Message sizes in bytes, comma-separated
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "64,4096"
    )]
    sizes: Vec<usize>,
    /// Keys to sweep and their values: KEY=V1,V2,... (one or more; keys:
    /// batch_size, signal_interval, inline_threshold, send_queue_depth,
    /// recv_queue_depth, cq_depth, slot_size, slot_count, idle,
    /// backoff_spins, hugepages) [default: batch_size=1,16
    /// signal_interval=1,16 unless --grid-file is given]
    #[arg(long, value_name = "KEY=V1,V2", num_args = 1..)]
    grid: Vec<String>,
    /// A TOML grid file: KEY = [V1, V2, ...] per line (combined with --grid)
    #[arg(long, value_name = "FILE")]
    grid_file: Option<PathBuf>,
    /// Runs per point and size; the figures are their medians
    #[arg(long, value_name = "N", default_value_t = 3)]
    repeat: u32,
    /// pinpoll-perf iterations per run (-n). The default keeps the default
    /// grid to a few minutes on rxe in the TCG guest; raise it on hardware
    /// (pinpoll-perf's own defaults are 1000 for latency, 5000 for bandwidth)
    #[arg(short = 'n', long, value_name = "N", default_value_t = 200)]
    iterations: u64,
    /// Directory for the CSV, SVG and recommended profiles (created)
    #[arg(long, value_name = "DIR", default_value = "pinpoll-sweep")]
    out: PathBuf,
    /// Profile every point starts from: a built-in profile name (latency, throughput, softroce) or a
    /// path [default: softroce on an rxe device, else pinpoll-perf's
    /// default for the workload: latency or throughput]
    #[arg(long, value_name = "NAME|FILE")]
    base_profile: Option<String>,
    /// RDMA device [default: $PINPOLL_DEVICE, else pinpoll-perf's choice]
    #[arg(short = 'd', long, value_name = "DEV")]
    device: Option<String>,
    /// pinpoll-perf's --mode: direct, or engine (a pinned worker owns the
    /// connection; `idle` only matters there)
    #[arg(long, value_name = "MODE", default_value = "direct", value_parser = ["direct", "engine"])]
    mode: String,
    /// Kill a pinpoll-perf run that takes longer than this (seconds)
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    timeout: f64,
    /// The pinpoll-perf binary [default: next to pinpoll-tune, else in PATH]
    #[arg(long, value_name = "PATH")]
    perf: Option<PathBuf>,
    /// List the grid points (and which are invalid) without running anything
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, clap::Args)]
struct DoctorArgs {
    /// Profile whose needs are checked (huge pages, locked memory, device
    /// limits, its `core`): a built-in profile name (latency, throughput, softroce) or a path to a .toml
    /// file [default: the engine's defaults]
    #[arg(long, value_name = "NAME|FILE")]
    profile: Option<String>,
    /// Cores the busy-poll worker(s) will be pinned to, in the kernel's list
    /// syntax (`2`, `2,3`, `2-5`); the NUMA, IRQ, governor, C-state and
    /// isolation checks look at these [default: the profile's `core`, else
    /// none]
    #[arg(long, value_name = "LIST", value_parser = parse_cores)]
    cores: Option<CpuSet>,
    /// Examine only this RDMA device [default: every device]
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// Print one JSON object (status, summary, checks, devices, huge pages,
    /// memlock) instead of the table; the exit status is the same
    #[arg(long)]
    json: bool,
    /// For testing: read /sys and /proc under DIR instead of /. Verbs
    /// queries are skipped unless DIR is /, so device facts then come from
    /// DIR's sysfs alone
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
}

#[derive(Debug, Subcommand)]
enum ProfileCommand {
    /// Validate a profile and print its effective configuration (every key,
    /// defaults included, in the profile format)
    Check {
        /// A built-in profile name (latency, throughput,
        /// softroce; also $PINPOLL_PROFILE_DIR) or a path to a .toml file
        #[arg(value_name = "NAME|FILE")]
        profile: String,
    },
}

fn parse_cores(text: &str) -> Result<CpuSet, String> {
    let set = cpulist::parse(text)?;
    if set.is_empty() {
        return Err("an empty core list".into());
    }
    Ok(set)
}

/// Every failure of pinpoll-tune that is not a check's verdict is bad
/// usage (exit status 2): a root, profile, grid or summary it cannot use.
fn main() -> ExitCode {
    pinpoll_appkit::main(
        |_: &Cli| Some("warn"),
        |cli: Cli| {
            match cli.command {
                Command::Doctor(args) => doctor_cmd(args),
                Command::Profile(ProfileCommand::Check { profile }) => profile_check(&profile),
                Command::Sweep(args) => sweep_cmd::run(args),
                Command::Plot(args) => plot_cmd(&args),
            }
            .map_err(pinpoll_appkit::usage)
        },
    )
}

fn doctor_cmd(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let root = SystemRoot::new(&args.root);
    if !root.dir().is_dir() {
        return Err(anyhow!("--root {}: not a directory", args.root.display()));
    }
    let config = match &args.profile {
        Some(p) => EngineConfig::load(p).map_err(|e| anyhow!(profile::load_error(&e)))?,
        None => EngineConfig::default(),
    };
    let (cores, cores_from) = match (args.cores, config.core) {
        (Some(c), _) => (c, CoresFrom::Flag),
        (None, Some(c)) => (CpuSet::from([c]), CoresFrom::Profile),
        (None, None) => (CpuSet::new(), CoresFrom::None),
    };
    let inventory = if root.is_host() {
        facts::gather_verbs(&root, args.device.as_deref())
    } else {
        facts::gather_sysfs(
            &root,
            args.device.as_deref(),
            &format!(
                "verbs queries are skipped with --root {} (device facts come from its sysfs)",
                args.root.display()
            ),
        )
    };
    let inputs = Inputs {
        root: &root,
        inventory: &inventory,
        config: &config,
        profile: args.profile.clone(),
        device: args.device.clone(),
        cores,
        cores_from,
    };
    let report = doctor::run(&inputs);
    let text = if args.json {
        let mut t = serde_json::to_string_pretty(&report.to_json()).context("encoding JSON")?;
        t.push('\n');
        t
    } else {
        report.to_table()
    };
    write_stdout(&text)?;
    Ok(if report.status() == Status::Fail {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn profile_check(name: &str) -> anyhow::Result<ExitCode> {
    match profile::check(name) {
        Ok(checked) => {
            let from = match &checked.source {
                Some(source) => format!(" ({source})"),
                None => String::new(),
            };
            write_stdout(&format!(
                "# profile {}{from}: valid. Effective configuration:\n{}",
                checked.name,
                profile::effective_toml(&checked.config, &checked.set_keys)
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn plot_cmd(args: &PlotArgs) -> anyhow::Result<ExitCode> {
    let input = args.summary.display();
    let text =
        std::fs::read_to_string(&args.summary).with_context(|| format!("cannot read {input}"))?;
    let summary = ComparisonSummary::from_json(&text).with_context(|| format!("{input}"))?;
    let svg = summary.chart().with_context(|| format!("{input}"))?;
    let out = args.out.clone().unwrap_or_else(|| {
        args.summary
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("benchmarks.svg")
    });
    std::fs::write(&out, svg).with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}

mod sweep_cmd;

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}
