//! Picking the best grid point of a workload from the medians, and writing
//! it down as a commented profile.

use std::collections::BTreeSet;

use pinpoll::EngineConfig;

use super::grid::Point;
use super::measure::{Measurement, Summary, Workload};
use crate::profile;

/// Scores within this fraction of the best are a tie (repeat medians on a
/// shared machine do not resolve finer), broken by the tail.
pub const TIE_BAND: f64 = 0.01;

/// The best point of a workload, and the evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub workload: Workload,
    pub point: usize,
    /// Every complete point, best first: (point, score, tie-break score).
    /// A score is the point's figure over the best figure at each size,
    /// averaged over sizes, oriented so that 1.0 is best and higher is
    /// worse (latency: p50 / best p50; bandwidth: best MiB/s / MiB/s).
    pub ranking: Vec<(usize, f64, f64)>,
    /// The chosen point's medians, by size.
    pub medians: Vec<(usize, Measurement)>,
    /// The best median at each size over all complete points.
    pub best: Vec<(usize, f64)>,
}

/// The figure a workload is judged on (lower is better after orientation).
fn primary(w: Workload, m: &Measurement) -> Option<f64> {
    if w.is_latency() {
        m.p50_us
    } else {
        m.mib_per_sec
    }
}

/// Picks the best point of `workload` over `sizes`: for latency the lowest
/// median p50 (tie-break: median p99), for bandwidth the highest median
/// MiB/s (tie-break: fewer doorbells per operation). Only points measured
/// at every size compete; `None` when there are none.
pub fn recommend(workload: Workload, summaries: &[Summary], sizes: &[usize]) -> Option<Choice> {
    let mine: Vec<&Summary> = summaries
        .iter()
        .filter(|s| s.workload == workload && s.median.is_some())
        .collect();
    let mut points: BTreeSet<usize> = mine.iter().map(|s| s.point).collect();
    let at = |point: usize, size: usize| {
        mine.iter()
            .find(|s| s.point == point && s.size == size)
            .and_then(|s| s.median.as_ref())
    };
    points.retain(|&p| {
        sizes.iter().all(|&s| {
            at(p, s)
                .and_then(|m| primary(workload, m))
                .is_some_and(|v| v > 0.0)
        })
    });
    if points.is_empty() {
        return None;
    }
    let lat = workload.is_latency();
    let best_of = |get: &dyn Fn(&Measurement) -> Option<f64>, size: usize, low: bool| {
        points
            .iter()
            .filter_map(|&p| at(p, size).and_then(get))
            .filter(|v| *v > 0.0)
            .fold(None, |acc: Option<f64>, v| {
                Some(match acc {
                    None => v,
                    Some(a) if low => a.min(v),
                    Some(a) => a.max(v),
                })
            })
    };
    let tie_get = |m: &Measurement| if lat { m.p99_us } else { m.doorbells_per_op };
    let best: Vec<(usize, f64)> = sizes
        .iter()
        .map(|&s| (s, best_of(&|m| primary(workload, m), s, lat).unwrap_or(1.0)))
        .collect();
    let mut ranking: Vec<(usize, f64, f64)> = points
        .iter()
        .map(|&p| {
            let mut score = 0.0;
            let mut tie = 0.0;
            for &(s, b) in &best {
                let m = at(p, s).expect("complete point");
                let v = primary(workload, m).expect("complete point");
                score += if lat { v / b } else { b / v };
                // The tie-break is lower-is-better for both orientations.
                let tb = best_of(&tie_get, s, true).unwrap_or(1.0);
                tie += tie_get(m)
                    .filter(|t| *t > 0.0)
                    .map_or(f64::MAX / 8.0, |t| t / tb);
            }
            let n = best.len().max(1) as f64;
            (p, score / n, tie / n)
        })
        .collect();
    let chosen = choose(&mut ranking);
    Some(Choice {
        workload,
        point: chosen,
        medians: sizes
            .iter()
            .map(|&s| (s, at(chosen, s).expect("complete point").clone()))
            .collect(),
        ranking,
        best,
    })
}

/// Ranks the (point, score, tie-break) rows by score and picks, among the
/// points within [`TIE_BAND`] of the best score, the one with the best
/// tie-break; the chosen row moves first, the rest stay in score order.
fn choose(ranking: &mut Vec<(usize, f64, f64)>) -> usize {
    ranking.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let top = ranking[0].1;
    let chosen = ranking
        .iter()
        .filter(|r| r.1 <= top * (1.0 + TIE_BAND))
        .min_by(|a, b| a.2.total_cmp(&b.2).then(a.0.cmp(&b.0)))
        .expect("at least the top point")
        .0;
    let pos = ranking.iter().position(|r| r.0 == chosen).expect("ranked");
    let c = ranking.remove(pos);
    ranking.insert(0, c);
    chosen
}

/// What is known about the measured host, for the profile's header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel: String,
    pub cpus: usize,
    /// The RDMA device the sweep ran on.
    pub device: String,
    /// One line of device facts (kind, vendor, MTU, max inline).
    pub device_facts: Vec<String>,
}

/// How the sweep ran, for the profile's header.
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence<'a> {
    pub base_profile: &'a str,
    pub points: &'a [Point],
    pub sizes: &'a [usize],
    pub repeat: u32,
    pub iterations: Option<u64>,
    pub mode: &'a str,
    pub date: &'a str,
}

fn describe(w: Workload, m: &Measurement) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    if w.is_latency() {
        format!("p50 {} us, p99 {} us", f(m.p50_us), f(m.p99_us))
    } else {
        format!(
            "{} MiB/s, {} Mpps",
            f(m.mib_per_sec),
            m.mpps.map_or("-".into(), |v| format!("{v:.4}"))
        )
    }
}

/// The recommended profile: a comment header naming the host, the sweep
/// and the evidence, then every key of `config` (the chosen point on the
/// base profile), each commented with where its value comes from. Loads
/// back with [`EngineConfig::load`].
pub fn profile_toml(
    choice: &Choice,
    config: &EngineConfig,
    host: &HostInfo,
    ev: &Evidence<'_>,
) -> String {
    let mut out = String::new();
    let mut c = |line: &str| {
        out.push_str(line.trim_end());
        out.push('\n');
    };
    profile_header(&mut c, choice, host, ev);
    c("");
    profile_keys(&mut c, &ev.points[choice.point], config, ev);
    out
}

/// The comment header: host, device, sweep, objective, the chosen point
/// and its figures, the ranking.
fn profile_header(c: &mut impl FnMut(&str), choice: &Choice, host: &HostInfo, ev: &Evidence<'_>) {
    let w = choice.workload;
    let point = &ev.points[choice.point];
    let sizes: Vec<String> = ev.sizes.iter().map(|s| format!("{s} B")).collect();
    c(&format!(
        "# recommended ({w}): measured by `pinpoll-tune sweep` on {}, device {}{}.",
        if host.hostname.is_empty() {
            "this host"
        } else {
            &host.hostname
        },
        host.device,
        if ev.date.is_empty() {
            String::new()
        } else {
            format!(", {}", ev.date)
        }
    ));
    if !host.kernel.is_empty() || host.cpus > 0 {
        c(&format!(
            "# Host: Linux {}, {} CPUs.",
            host.kernel, host.cpus
        ));
    }
    for fact in &host.device_facts {
        c(&format!("# Device: {fact}"));
    }
    c(&format!(
        "# Sweep: {} on base profile `{}`, {} grid points x sizes {} x {} repeats, iterations {}, {} mode.",
        w,
        ev.base_profile,
        ev.points.len(),
        sizes.join(", "),
        ev.repeat,
        ev.iterations.map_or("pinpoll-perf's default".to_owned(), |n| n.to_string()),
        ev.mode
    ));
    c(&format!(
        "# Objective: {}, each median over the repeats, relative to the best point at each size, averaged over sizes; within {}% counts as a tie, broken by {}.",
        if w.is_latency() {
            "the lowest median p50 latency"
        } else {
            "the highest median bandwidth"
        },
        TIE_BAND * 100.0,
        if w.is_latency() { "median p99" } else { "fewer doorbells per operation" }
    ));
    c(&format!(
        "# Chosen: {} (point {} of {}):",
        point.label(),
        point.index + 1,
        ev.points.len()
    ));
    for ((size, m), (_, best)) in choice.medians.iter().zip(&choice.best) {
        c(&format!(
            "#   {size} B: {} (best of all points at this size: {best:.2} {})",
            describe(w, m),
            if w.is_latency() { "us" } else { "MiB/s" }
        ));
    }
    if choice.ranking.len() > 1 {
        c("# Ranking (score 1.00 = best at every size; higher is worse):");
        for (p, score, _) in choice.ranking.iter().take(5) {
            c(&format!("#   {score:.3}  {}", ev.points[*p].label()));
        }
    }
    c("# pinpoll-perf sizes slots to the message (slot_size, slot_count) and");
    c("# keeps the receive queue small for one-sided tests: those keys are the");
    c("# base profile's unless swept. Check: `pinpoll-tune profile check FILE`.");
}

/// Every key of `config`, commented with where its value comes from.
fn profile_keys(c: &mut impl FnMut(&str), point: &Point, config: &EngineConfig, ev: &Evidence<'_>) {
    let swept: BTreeSet<&str> = point.settings.iter().map(|(k, _)| k.as_str()).collect();
    let keys = profile::effective_keys(config);
    let width = keys
        .iter()
        .map(|(k, v)| k.len() + v.len() + 3)
        .max()
        .unwrap_or(0);
    for (key, value) in &keys {
        let line = format!("{key} = {value}");
        let why = if swept.contains(key) {
            let mut values: Vec<String> = Vec::new();
            for v in ev.points.iter().filter_map(|p| p.get(key)) {
                let v = v.to_string();
                if !values.contains(&v) {
                    values.push(v);
                }
            }
            format!("swept over {}: measured best", values.join(", "))
        } else if *key == "cq_depth" {
            "at least max(send_queue_depth, recv_queue_depth)".to_owned()
        } else {
            format!("from the base profile {}", ev.base_profile)
        };
        c(&format!("{line:<width$}  # {why}"));
    }
}
