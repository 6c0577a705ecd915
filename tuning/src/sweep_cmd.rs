//! `pinpoll-tune sweep`: the command line over [`pinpoll_tune::sweep`].

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pinpoll::EngineConfig;
use pinpoll_tune::doctor::{classify, DeviceKind};
use pinpoll_tune::facts::{self, DeviceFacts};
use pinpoll_tune::sweep::grid::Grid;
use pinpoll_tune::sweep::measure::{Outcome, Run, Workload};
use pinpoll_tune::sweep::recommend::{Choice, HostInfo};
use pinpoll_tune::sweep::runner::{find_perf, Invocation};
use pinpoll_tune::sweep::{self, Job, OutputInfo, Sweep};
use pinpoll_tune::{profile, SystemRoot};

use super::{write_stdout, SweepArgs};

fn grid_of(args: &SweepArgs) -> anyhow::Result<Grid> {
    let mut grid = Grid::from_args(&args.grid).map_err(|e| anyhow!("--grid {e}"))?;
    if let Some(file) = &args.grid_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading --grid-file {}", file.display()))?;
        let more =
            Grid::from_toml(&text).map_err(|e| anyhow!("--grid-file {}: {e}", file.display()))?;
        grid.merge(more)
            .map_err(|e| anyhow!("--grid and --grid-file: {e}"))?;
    }
    if args.grid.is_empty() && args.grid_file.is_none() {
        grid = Grid::default_grid();
    }
    Ok(grid)
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// One line of facts about the device: kind, vendor, port, limits.
fn device_facts(root: &SystemRoot, d: &DeviceFacts) -> Vec<String> {
    let mut parts = Vec::new();
    match classify(root, &d.name) {
        Ok(DeviceKind::SoftRoce { netdev, .. }) => parts.push(format!(
            "SoftRoCE (rxe) over {netdev}: figures are functional, not hardware"
        )),
        Ok(DeviceKind::Software { .. }) => parts.push("a software device".into()),
        Ok(DeviceKind::Hardware { bus_id, driver, .. }) => parts.push(format!(
            "hardware at {bus_id}{}",
            driver.map(|d| format!(", driver {d}")).unwrap_or_default()
        )),
        Err(_) => {}
    }
    if let Ok(l) = &d.limits {
        parts.push(format!(
            "vendor {:#x} part {}, max_qp_wr {}",
            l.vendor_id, l.vendor_part_id, l.max_qp_wr
        ));
    }
    if let Ok(ports) = &d.ports {
        for p in ports {
            let state = p
                .state
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or("?".into());
            let mtu = p
                .active_mtu
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or("?".into());
            parts.push(format!("port {} {state}, active MTU {mtu}", p.port));
        }
    }
    if let Ok(m) = d.max_inline_data {
        parts.push(format!("max_inline_data {m}"));
    }
    if parts.is_empty() {
        Vec::new()
    } else {
        vec![format!("{}: {}", d.name, parts.join("; "))]
    }
}

/// Today's date (UTC) as YYYY-MM-DD.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Howard Hinnant's civil_from_days.
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn describe(run: &Run) -> String {
    match &run.outcome {
        Outcome::Ok(m) if run.workload.is_latency() => format!(
            "p50 {:.2} us, p99 {:.2} us",
            m.p50_us.unwrap_or(f64::NAN),
            m.p99_us.unwrap_or(f64::NAN)
        ),
        Outcome::Ok(m) => format!("{:.2} MiB/s", m.mib_per_sec.unwrap_or(f64::NAN)),
        other => format!("{}: {}", other.status(), other.error().unwrap_or_default()),
    }
}

/// What the sweep learned about the device before measuring.
struct Target {
    /// `--device`, else `$PINPOLL_DEVICE`; `None` leaves the choice to
    /// pinpoll-perf.
    device: Option<String>,
    /// The name to report (the device chosen, or the first active one).
    name: String,
    /// Its inline limit: points beyond it are skipped.
    max_inline: Option<u32>,
    host: HostInfo,
}

pub fn run(args: SweepArgs) -> anyhow::Result<ExitCode> {
    check_args(&args)?;
    let workloads = unique(&args.workloads);
    let sizes = unique(&args.sizes);
    let grid = grid_of(&args)?;
    let perf = if args.dry_run {
        find_perf(args.perf.as_deref()).ok()
    } else {
        Some(find_perf(args.perf.as_deref()).map_err(|e| anyhow!(e))?)
    };
    let target = probe_target(&args);
    let bases = base_profiles(&args, &workloads, &target.name)?;
    let base = |w: Workload| {
        let (_, n, c) = bases
            .iter()
            .find(|b| b.0 == w)
            .expect("a base per workload");
        (n.clone(), c.clone())
    };
    let scratch = args.out.join("points");
    let sweep = Sweep::plan(
        &workloads,
        &sizes,
        grid,
        args.repeat,
        &base,
        target.max_inline,
        &scratch,
    )
    .map_err(|e| anyhow!(e))?;
    warn_about_keys(&sweep, &args.mode);
    let jobs = sweep.jobs();
    let invalid = sweep.invalid();
    for (w, p, why) in &invalid {
        eprintln!(
            "skipped: {w} point {} ({}): {why}",
            p + 1,
            sweep.points[*p].label()
        );
    }
    if args.dry_run {
        write_stdout(&dry_run_text(
            &sweep,
            jobs.len(),
            sizes.len(),
            args.repeat,
            perf.as_deref(),
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let perf = perf.expect("found above unless --dry-run");
    if jobs.is_empty() {
        return Err(anyhow!("every grid point is invalid: nothing to run"));
    }
    let runs = measure(
        &args,
        &sweep,
        &jobs,
        &perf,
        target.device.as_deref(),
        &scratch,
    );
    report(
        &args,
        &sweep,
        &workloads,
        &runs,
        invalid.len(),
        &target.host,
    )
}

/// Writes the outputs into `--out` and says what the sweep found; exit 1
/// when a workload has no recommendation.
fn report(
    args: &SweepArgs,
    sweep: &Sweep,
    workloads: &[Workload],
    runs: &[Run],
    invalid: usize,
    host: &HostInfo,
) -> anyhow::Result<ExitCode> {
    let summaries = sweep.summarize(runs);
    let choices = sweep.recommend(&summaries);
    let date = today();
    let written = sweep::write_outputs(
        &args.out,
        sweep,
        runs,
        &summaries,
        &choices,
        &OutputInfo {
            host,
            iterations: Some(args.iterations),
            mode: &args.mode,
            date: &date,
        },
    )
    .map_err(|e| anyhow!(e))?;
    let mut text = outcome_text(sweep, workloads, runs, invalid, &choices);
    text.push_str("wrote:\n");
    for p in &written {
        text.push_str(&format!("  {}\n", p.display()));
    }
    write_stdout(&text)?;
    Ok(if choices.len() == workloads.len() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: some workloads have no recommendation (see {})",
            args.out.join("runs.csv").display()
        );
        ExitCode::from(1)
    })
}

/// The ranges of the flags clap cannot check by itself.
fn check_args(args: &SweepArgs) -> anyhow::Result<()> {
    if !args.timeout.is_finite() || args.timeout <= 0.0 {
        return Err(anyhow!(
            "--timeout {}: give a positive number of seconds",
            args.timeout
        ));
    }
    if let Some(s) = args.sizes.iter().find(|s| **s == 0 || **s > 1 << 23) {
        return Err(anyhow!(
            "--sizes {s} is out of range: give 1..=8388608 bytes"
        ));
    }
    if args.iterations < 5 {
        return Err(anyhow!(
            "--iterations: give at least 5 (pinpoll-perf's minimum)"
        ));
    }
    Ok(())
}

/// `items` without repeats, in their first order.
fn unique<T: PartialEq + Copy>(items: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for item in items {
        if !out.contains(item) {
            out.push(*item);
        }
    }
    out
}

/// The device to sweep on and the host it sits in, from verbs.
fn probe_target(args: &SweepArgs) -> Target {
    let device = args.device.clone().or_else(|| {
        std::env::var("PINPOLL_DEVICE")
            .ok()
            .filter(|d| !d.is_empty())
    });
    let root = SystemRoot::host();
    let inventory = facts::gather_verbs(&root, device.as_deref());
    let dev_facts = inventory.devices.iter().find(|d| {
        device.as_deref().map_or_else(
            || {
                d.ports.as_ref().is_ok_and(|ps| {
                    ps.iter()
                        .any(|p| p.state.as_ref().is_ok_and(|s| s.is_active()))
                })
            },
            |name| d.name == name,
        )
    });
    let max_inline = dev_facts.and_then(|d| d.max_inline_data.clone().ok());
    let name = device
        .clone()
        .or_else(|| dev_facts.map(|d| d.name.clone()))
        .unwrap_or_default();
    let host = HostInfo {
        hostname: read_trimmed("/proc/sys/kernel/hostname"),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        device: if name.is_empty() {
            "(pinpoll-perf's first active device)".into()
        } else {
            name.clone()
        },
        device_facts: dev_facts
            .map(|d| device_facts(&root, d))
            .unwrap_or_default(),
    };
    Target {
        device,
        name,
        max_inline,
        host,
    }
}

/// Each workload's base profile: `--base-profile`, else softroce on rxe,
/// else the workload's own.
fn base_profiles(
    args: &SweepArgs,
    workloads: &[Workload],
    device_name: &str,
) -> anyhow::Result<Vec<(Workload, String, EngineConfig)>> {
    let mut bases = Vec::new();
    for &w in workloads {
        let name = args.base_profile.clone().unwrap_or_else(|| {
            if device_name.starts_with("rxe") {
                "softroce".into()
            } else {
                w.default_profile().into()
            }
        });
        let cfg = EngineConfig::load(&name)
            .map_err(|e| anyhow!("--base-profile: {}", profile::load_error(&e)))?;
        bases.push((w, name, cfg));
    }
    Ok(bases)
}

/// Keys that pinpoll-perf cannot vary in this sweep.
fn warn_about_keys(sweep: &Sweep, mode: &str) {
    let keys = sweep.grid.keys();
    if keys.contains(&"idle") && mode == "direct" {
        eprintln!("warning: idle is the engine worker's policy: it has no effect in --mode direct (use --mode engine)");
    }
    if keys.contains(&"slot_size") {
        eprintln!("warning: pinpoll-perf sizes slots to the message, so slot_size has no effect (runs.csv shows conn_slot_size)");
    }
}

/// `--dry-run`'s listing: every point of every workload, and the count of
/// runs a real sweep would make.
fn dry_run_text(
    sweep: &Sweep,
    jobs: usize,
    sizes: usize,
    repeat: u32,
    perf: Option<&std::path::Path>,
) -> String {
    let mut text = String::new();
    for prep in &sweep.prepared {
        text.push_str(&format!(
            "{} (base profile {}):\n",
            prep.workload, prep.base_name
        ));
        for (p, c) in sweep.points.iter().zip(&prep.configs) {
            text.push_str(&format!(
                "  point {:>3}  {:<48} {}\n",
                p.index + 1,
                p.label(),
                match c {
                    Ok((path, _)) => format!("ok  {}", path.display()),
                    Err(e) => format!("invalid: {e}"),
                }
            ));
        }
    }
    text.push_str(&format!(
        "{jobs} runs: {} valid points x {sizes} sizes x {repeat} repeats; pinpoll-perf: {}\n",
        sweep
            .prepared
            .iter()
            .map(|p| p.configs.iter().filter(|c| c.is_ok()).count())
            .sum::<usize>(),
        perf.map_or("not found".into(), |p| p.display().to_string())
    ));
    text
}

/// A progress bar on stderr when it is a terminal (hidden otherwise).
fn progress_bar(len: usize, terminal: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(len as u64),
        if terminal {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:32}] {pos}/{len} ETA {eta} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Runs every job through pinpoll-perf, one line per run on stderr.
fn measure(
    args: &SweepArgs,
    sweep: &Sweep,
    jobs: &[Job],
    perf: &std::path::Path,
    device: Option<&str>,
    scratch: &std::path::Path,
) -> Vec<Run> {
    let terminal = std::io::stderr().is_terminal();
    let bar = progress_bar(jobs.len(), terminal);
    let total = jobs.len();
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut done = 0usize;
    let mut runner = |job: &Job| {
        bar.set_message(format!(
            "{} {} B {}",
            job.workload,
            job.size,
            sweep.points[job.point].label()
        ));
        let scratch_file = scratch.join(format!("run-{}", std::process::id()));
        Invocation {
            perf,
            workload: job.workload,
            size: job.size,
            iterations: Some(args.iterations),
            device,
            profile: &job.profile,
            signal_interval: job.workload.is_latency().then_some(job.signal_interval),
            mode: &args.mode,
            timeout,
            scratch: &scratch_file,
        }
        .run()
    };
    let mut progress = |job: &Job, run: &Run| {
        done += 1;
        let line = format!(
            "[{done}/{total}] {} {} B point {} ({}) repeat {}: {}",
            job.workload,
            job.size,
            job.point + 1,
            sweep.points[job.point].label(),
            job.repeat,
            describe(run)
        );
        if terminal {
            bar.println(line);
        } else {
            eprintln!("{line}");
        }
        bar.inc(1);
    };
    let runs = sweep.run(&mut runner, &mut progress);
    bar.finish_and_clear();
    runs
}

/// The closing report: runs measured, and each workload's recommendation
/// with its medians.
fn outcome_text(
    sweep: &Sweep,
    workloads: &[Workload],
    runs: &[Run],
    invalid: usize,
    choices: &[Choice],
) -> String {
    let ok = runs
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ok(_)))
        .count();
    let mut text = format!(
        "sweep: {ok} of {} runs measured, {invalid} point(s) skipped as invalid\n",
        runs.len(),
    );
    for w in workloads {
        match choices.iter().find(|c| c.workload == *w) {
            Some(c) => {
                text.push_str(&format!(
                    "{w}: recommended {}\n",
                    sweep.points[c.point].label()
                ));
                for (size, m) in &c.medians {
                    text.push_str(&format!(
                        "  {size} B: {}\n",
                        describe(&Run {
                            workload: *w,
                            point: c.point,
                            size: *size,
                            repeat: 0,
                            outcome: Outcome::Ok(m.clone()),
                        })
                    ));
                }
            }
            None => text.push_str(&format!(
                "{w}: no point measured at every size: no recommendation\n"
            )),
        }
    }
    text
}
