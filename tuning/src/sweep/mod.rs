//! `pinpoll-tune sweep`: run `pinpoll-perf` workloads over a grid of
//! engine parameters and message sizes, repeat every point, and keep the
//! medians; write them as CSV, plot them as SVG, and recommend a profile.
//!
//! - [`grid`] — the keys swept and the configuration of every point.
//! - [`measure`] — one run's figures (from `pinpoll-perf --json`) and the
//!   medians of repeats.
//! - [`runner`] — finding and running `pinpoll-perf`, with a timeout.
//! - [`recommend`] — the best point of a workload, as a commented profile.
//! - [`csv`] — the CSV files; the charts are drawn by [`crate::plot::sweep`].
//!
//! Everything but [`runner`] is pure, so the sweep itself runs in tests
//! with a fake `pinpoll-perf` ([`Sweep::run`] takes the runner).

pub mod csv;
pub mod grid;
pub mod measure;
pub mod recommend;
pub mod runner;

use std::path::{Path, PathBuf};

use pinpoll::EngineConfig;

use crate::plot;

use grid::{Grid, Point};
use measure::{Outcome, Run, Summary, Workload};
use recommend::{Choice, Evidence, HostInfo};

/// A workload's base profile and the configuration of each point on it.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub workload: Workload,
    pub base_name: String,
    pub base: EngineConfig,
    /// Per point: the profile file and configuration, or why it is skipped.
    pub configs: Vec<Result<(PathBuf, EngineConfig), String>>,
}

/// One run to make.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub workload: Workload,
    pub point: usize,
    pub size: usize,
    pub repeat: u32,
    pub profile: PathBuf,
    /// The point's signal_interval, passed as `-Q` to latency tests.
    pub signal_interval: u32,
}

/// A planned sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub workloads: Vec<Workload>,
    pub sizes: Vec<usize>,
    pub grid: Grid,
    pub points: Vec<Point>,
    pub repeat: u32,
    pub prepared: Vec<Prepared>,
}

impl Sweep {
    /// Expands the grid over each workload's base profile (`base` names it
    /// and gives its configuration) and writes a profile file per valid
    /// point into `scratch`. Invalid points are kept with their reason.
    pub fn plan(
        workloads: &[Workload],
        sizes: &[usize],
        grid: Grid,
        repeat: u32,
        base: &dyn Fn(Workload) -> (String, EngineConfig),
        max_inline: Option<u32>,
        scratch: &Path,
    ) -> Result<Sweep, String> {
        if workloads.is_empty() {
            return Err("no workloads".into());
        }
        if sizes.is_empty() {
            return Err("no message sizes".into());
        }
        if repeat == 0 {
            return Err("--repeat 0: give at least 1".into());
        }
        std::fs::create_dir_all(scratch)
            .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
        let points = grid.points();
        let mut prepared = Vec::new();
        for &w in workloads {
            let (base_name, base) = base(w);
            let configs = points
                .iter()
                .map(|p| {
                    let (table, cfg) = grid::point_config(&base, p, max_inline)?;
                    let path = scratch.join(format!("{}-point{}.toml", w.name(), p.index + 1));
                    let text = toml::to_string(&table).map_err(|e| e.to_string())?;
                    std::fs::write(&path, text)
                        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    Ok((path, cfg))
                })
                .collect();
            prepared.push(Prepared {
                workload: w,
                base_name,
                base,
                configs,
            });
        }
        Ok(Sweep {
            workloads: workloads.to_vec(),
            sizes: sizes.to_vec(),
            grid,
            points,
            repeat,
            prepared,
        })
    }

    fn prepared(&self, w: Workload) -> &Prepared {
        self.prepared
            .iter()
            .find(|p| p.workload == w)
            .expect("every workload is prepared")
    }

    /// Skipped points: (workload, point, reason).
    pub fn invalid(&self) -> Vec<(Workload, usize, String)> {
        self.prepared
            .iter()
            .flat_map(|p| {
                p.configs
                    .iter()
                    .enumerate()
                    .filter_map(move |(i, c)| c.as_ref().err().map(|e| (p.workload, i, e.clone())))
            })
            .collect()
    }

    /// Every run, repeats outermost: a noisy spell of the machine then
    /// lands on one repeat of every point, not on every repeat of one.
    pub fn jobs(&self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for repeat in 1..=self.repeat {
            for &w in &self.workloads {
                let prep = self.prepared(w);
                for (point, c) in prep.configs.iter().enumerate() {
                    let Ok((profile, cfg)) = c else { continue };
                    for &size in &self.sizes {
                        jobs.push(Job {
                            workload: w,
                            point,
                            size,
                            repeat,
                            profile: profile.clone(),
                            signal_interval: cfg.signal_interval,
                        });
                    }
                }
            }
        }
        jobs
    }

    /// Runs every job through `runner`, calling `progress` after each.
    pub fn run(
        &self,
        runner: &mut dyn FnMut(&Job) -> Outcome,
        progress: &mut dyn FnMut(&Job, &Run),
    ) -> Vec<Run> {
        let mut runs = Vec::new();
        for job in self.jobs() {
            let run = Run {
                workload: job.workload,
                point: job.point,
                size: job.size,
                repeat: job.repeat,
                outcome: runner(&job),
            };
            progress(&job, &run);
            runs.push(run);
        }
        runs
    }

    pub fn summarize(&self, runs: &[Run]) -> Vec<Summary> {
        measure::summarize(
            runs,
            &self.workloads,
            self.points.len(),
            &self.sizes,
            &self.invalid(),
        )
    }

    /// The recommendation of each workload that has a complete point.
    pub fn recommend(&self, summaries: &[Summary]) -> Vec<Choice> {
        self.workloads
            .iter()
            .filter_map(|&w| recommend::recommend(w, summaries, &self.sizes))
            .collect()
    }
}

/// What [`write_outputs`] needs beyond the sweep and its runs.
pub struct OutputInfo<'a> {
    pub host: &'a HostInfo,
    pub iterations: Option<u64>,
    pub mode: &'a str,
    pub date: &'a str,
}

/// Writes into `dir`: `runs.csv`, `medians.csv`, `<workload>.svg` per
/// workload, `recommended-<workload>.toml` per workload with a
/// recommendation and `recommended.toml` (the first of those). Returns
/// the files written.
pub fn write_outputs(
    dir: &Path,
    sweep: &Sweep,
    runs: &[Run],
    summaries: &[Summary],
    choices: &[Choice],
    info: &OutputInfo<'_>,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut write = |name: &str, text: &str| -> Result<(), String> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let keys = sweep.grid.keys();
    write("runs.csv", &csv::runs_csv(&keys, &sweep.points, runs)?)?;
    let chosen = |s: &Summary| {
        choices
            .iter()
            .any(|c| c.workload == s.workload && c.point == s.point)
    };
    write(
        "medians.csv",
        &csv::medians_csv(&keys, &sweep.points, summaries, &chosen)?,
    )?;
    for &w in &sweep.workloads {
        let panels =
            plot::sweep::workload_panels(w, &sweep.grid, &sweep.points, summaries, &sweep.sizes);
        let prep = sweep.prepared(w);
        let title = format!(
            "pinpoll-tune sweep: {w} on {}",
            if info.host.device.is_empty() {
                "?"
            } else {
                &info.host.device
            }
        );
        let subtitle = format!(
            "base profile {}; medians of {} per point; each point: the best grid point with that value{}",
            prep.base_name,
            if sweep.repeat == 1 { "1 run".to_owned() } else { format!("{} runs", sweep.repeat) },
            if w.is_latency() { " (lowest p50)" } else { " (highest MiB/s)" }
        );
        let svg = plot::stacked(&title, &subtitle, &panels)
            .map_err(|e| format!("{}.svg: {e}", w.name()))?;
        write(&format!("{}.svg", w.name()), &svg)?;
    }
    let mut first = true;
    for choice in choices {
        let prep = sweep.prepared(choice.workload);
        let Ok((_, config)) = &prep.configs[choice.point] else {
            continue;
        };
        let ev = Evidence {
            base_profile: &prep.base_name,
            points: &sweep.points,
            sizes: &sweep.sizes,
            repeat: sweep.repeat,
            iterations: info.iterations,
            mode: info.mode,
            date: info.date,
        };
        let text = recommend::profile_toml(choice, config, info.host, &ev);
        write(
            &format!("recommended-{}.toml", choice.workload.name()),
            &text,
        )?;
        if first {
            write("recommended.toml", &text)?;
            first = false;
        }
    }
    Ok(written)
}
