//! Figures, as measured and as printed: perftest-style text tables and a
//! JSON document with every figure and the configuration used.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::plan::{Kind, WireConfig};

/// Latency samples of one size: one per iteration, in nanoseconds of a
/// full round trip.
#[derive(Debug)]
pub struct Samples {
    hist: Histogram<u64>,
}

impl Samples {
    /// Room for round trips up to an hour at 3 significant digits; sized
    /// up front so recording never allocates.
    pub fn new() -> Samples {
        let mut hist = Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("static histogram bounds are valid");
        hist.auto(false);
        Samples { hist }
    }

    /// Records one round trip.
    #[inline]
    pub fn record(&mut self, round_trip: Duration) {
        let ns = (round_trip.as_nanos() as u64).clamp(1, self.hist.high());
        // In range by the clamp: cannot fail.
        let _ = self.hist.record(ns);
    }

    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// The summary, scaled by `factor` (0.5 for half round trips).
    pub fn summary(&self, factor: f64) -> Latency {
        let us = |ns: f64| ns * factor / 1000.0;
        let q = |quantile: f64| us(self.hist.value_at_quantile(quantile) as f64);
        Latency {
            measure: if factor < 1.0 {
                "half_round_trip"
            } else {
                "round_trip"
            },
            unit: "usec",
            samples: self.hist.len(),
            min: us(self.hist.min() as f64),
            p50: q(0.5),
            mean: us(self.hist.mean()),
            p99: q(0.99),
            p99_9: q(0.999),
            p99_99: q(0.9999),
            max: us(self.hist.max() as f64),
            stdev: us(self.hist.stdev()),
        }
    }
}

impl Default for Samples {
    fn default() -> Self {
        Samples::new()
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// `half_round_trip` (write, send: as perftest reports them) or
    /// `round_trip` (read).
    pub measure: &'static str,
    pub unit: &'static str,
    pub samples: u64,
    pub min: f64,
    /// perftest's "typical".
    pub p50: f64,
    pub mean: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub p99_99: f64,
    pub max: f64,
    pub stdev: f64,
}

/// Bandwidth of one size, measured on the client from the first post to
/// the completion of the last operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bandwidth {
    pub seconds: f64,
    /// 10^9 bits per second.
    pub gbps: f64,
    /// 2^20 bytes per second (perftest's MB/sec).
    pub mib_per_sec: f64,
    /// 10^6 messages per second.
    pub mpps: f64,
}

impl Bandwidth {
    pub fn new(bytes: usize, ops: u64, elapsed: Duration) -> Bandwidth {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let total = bytes as f64 * ops as f64;
        Bandwidth {
            seconds,
            gbps: total * 8.0 / seconds / 1e9,
            mib_per_sec: total / seconds / f64::from(1u32 << 20),
            mpps: ops as f64 / seconds / 1e6,
        }
    }
}

/// Every measured round trip as the clock counted it (`--raw-samples`):
/// the samples percentiles are computed from elsewhere, as perftest's
/// `-C -U` prints its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RawSamples {
    /// `ticks`: TSC cycles on x86_64 (perftest's `get_cycles`),
    /// nanoseconds elsewhere.
    pub unit: &'static str,
    /// The clock's scale, measured before the first sample.
    pub ns_per_tick: f64,
    /// Full round trips (never halved), in measuring order; the warm-up's
    /// are not among them (`--warmup 0` keeps every one).
    pub round_trip_ticks: Vec<u64>,
}

/// Work requests and doorbells of the client's connection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Doorbells {
    pub posted: u64,
    pub doorbells: u64,
    pub per_op: f64,
}

impl Doorbells {
    pub fn new(stats: &pinpoll::datapath::Stats) -> Doorbells {
        Doorbells {
            posted: stats.posted,
            doorbells: stats.doorbells,
            per_op: if stats.posted == 0 {
                0.0
            } else {
                stats.doorbells as f64 / stats.posted as f64
            },
        }
    }
}

/// The figures of one message size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    pub bytes: usize,
    pub iterations: u64,
    pub warmup: u64,
    /// Whether this size was posted inline.
    pub inline: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
    pub work_requests: Doorbells,
    /// Turns of the client's busy-waits that found nothing, over the
    /// whole run (warm-up included): timing, not work. (The instruction
    /// counts of `scripts/count-instructions.sh` find their waiting from
    /// the code's own loops, the same way for perftest, which counts
    /// nothing.)
    pub wait_turns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_samples: Option<RawSamples>,
    /// The configuration both sides used for this size.
    pub connection: WireConfig,
}

/// The run's configuration, as given and as resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunInfo {
    pub test: &'static str,
    pub role: &'static str,
    pub mode: &'static str,
    /// `loopback`, `rdma_cm` or `tcp-exchange`.
    pub transport: &'static str,
    pub device: Option<String>,
    pub host: Option<String>,
    pub port: u16,
    pub profile: String,
    pub hugepages: bool,
    pub iterations: u64,
    pub warmup: u64,
    pub sizes: Vec<usize>,
    pub tx_depth: Option<u32>,
    pub post_list: Option<u32>,
    pub cq_mod: Option<u32>,
    pub inline_size: Option<u32>,
    pub gid_index: Option<u32>,
    /// `--await-sends`: every send signaled and its completion awaited.
    pub await_sends: bool,
    pub report_gbits: bool,
    /// The CPU the measuring thread ran on (engine mode: the application thread).
    pub client_core: Option<usize>,
    /// Engine mode: the worker's core.
    pub worker_core: Option<usize>,
    /// Loopback: the server thread's core.
    pub server_core: Option<usize>,
    pub timeout_secs: f64,
}

/// The whole JSON document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub version: &'static str,
    pub config: RunInfo,
    pub results: Vec<Point>,
}

impl Report {
    pub fn new(config: RunInfo) -> Report {
        Report {
            tool: "pinpoll-perf",
            version: env!("CARGO_PKG_VERSION"),
            config,
            results: Vec::new(),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }
}

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's banner, with the configuration.
pub fn header(kind: Kind, info: &RunInfo) -> String {
    let mut s = String::new();
    s.push_str(RULE);
    s.push('\n');
    s.push_str(&format!(
        "                    {} (pinpoll-perf, {} mode)\n",
        kind.title(),
        info.mode
    ));
    s.push_str(&format!(
        " Device: {}  Transport: {}  Profile: {}  Huge pages: {}\n",
        info.device.as_deref().unwrap_or("(first active)"),
        info.transport,
        info.profile,
        if info.hugepages { "2 MiB" } else { "off" }
    ));
    let core = |c: Option<usize>| c.map_or("unpinned".to_owned(), |c| c.to_string());
    s.push_str(&format!(
        " Cores: client {}  worker {}  server {}\n",
        core(info.client_core),
        if info.mode == "engine" {
            core(info.worker_core)
        } else {
            "-".into()
        },
        core(info.server_core)
    ));
    if kind.is_latency() {
        s.push_str(&format!(
            " Latency: {} in microseconds; {} warm-up iterations not counted\n",
            if kind.reports_half_round_trip() {
                "HALF a round trip (as perftest reports WRITE and SEND latency)"
            } else {
                "a FULL round trip (as perftest reports READ latency)"
            },
            info.warmup
        ));
        s.push_str(if info.await_sends {
            " Sends: every one signaled and its completion awaited (--await-sends, as perftest)\n"
        } else {
            " Sends: one in the signal interval signaled, none awaited\n"
        });
    } else {
        s.push_str(" Bandwidth: measured on the client, first post to last completion\n");
    }
    s.push_str(RULE);
    s
}

/// The column heads of the result lines.
pub fn columns(kind: Kind, gbits: bool) -> String {
    if kind.is_latency() {
        format!(
            " {:<8} {:<12} {:>12} {:>12} {:>12} {:>12} {:>14} {:>15} {:>12} {:>9}",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_p50[usec]",
            "t_avg[usec]",
            "t_p99[usec]",
            "t_p99.9[usec]",
            "t_p99.99[usec]",
            "t_max[usec]",
            "bells/op"
        )
    } else {
        format!(
            " {:<8} {:<12} {:>20} {:>14} {:>9} {:>9}",
            "#bytes",
            "#iterations",
            if gbits {
                "BW average[Gb/sec]"
            } else {
                "BW average[MiB/sec]"
            },
            "MsgRate[Mpps]",
            "bells/op",
            "inline"
        )
    }
}

/// One result line.
pub fn line(p: &Point, gbits: bool) -> String {
    if let Some(l) = &p.latency {
        format!(
            " {:<8} {:<12} {:>12.2} {:>12.2} {:>12.2} {:>12.2} {:>14.2} {:>15.2} {:>12.2} {:>9.3}",
            p.bytes,
            p.iterations,
            l.min,
            l.p50,
            l.mean,
            l.p99,
            l.p99_9,
            l.p99_99,
            l.max,
            p.work_requests.per_op
        )
    } else if let Some(b) = &p.bandwidth {
        format!(
            " {:<8} {:<12} {:>20.2} {:>14.6} {:>9.3} {:>9}",
            p.bytes,
            p.iterations,
            if gbits { b.gbps } else { b.mib_per_sec },
            b.mpps,
            p.work_requests.per_op,
            if p.inline { "yes" } else { "no" }
        )
    } else {
        format!(" {:<8} {:<12} (no figures)", p.bytes, p.iterations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ordered_and_halved_when_asked() {
        let mut s = Samples::new();
        for ns in 1..=10_000u64 {
            s.record(Duration::from_nanos(ns * 10));
        }
        let full = s.summary(1.0);
        assert_eq!(full.samples, 10_000);
        assert!(full.min <= full.p50 && full.p50 <= full.p99 && full.p99 <= full.p99_9);
        assert!(full.p99_9 <= full.p99_99 && full.p99_99 <= full.max);
        let half = s.summary(0.5);
        assert_eq!(half.measure, "half_round_trip");
        assert!((half.p50 * 2.0 - full.p50).abs() < 1e-9);
        assert!((full.p50 - 50.0).abs() < 0.1, "{}", full.p50);
    }

    #[test]
    fn bandwidth_units() {
        let b = Bandwidth::new(1 << 20, 1000, Duration::from_secs(1));
        assert!((b.mib_per_sec - 1000.0).abs() < 1e-9);
        assert!((b.gbps - 8.388608).abs() < 1e-9);
        assert!((b.mpps - 0.001).abs() < 1e-12);
    }
}
