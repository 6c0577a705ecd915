//! What one `pinpoll-perf` run measured, and the medians of repeats.

use std::fmt;
use std::str::FromStr;

use serde_json::Value as Json;

/// The `pinpoll-perf` tests a sweep can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Workload {
    WriteLat,
    SendLat,
    ReadLat,
    WriteBw,
    SendBw,
    ReadBw,
}

impl Workload {
    pub const ALL: [Workload; 6] = [
        Workload::WriteLat,
        Workload::SendLat,
        Workload::ReadLat,
        Workload::WriteBw,
        Workload::SendBw,
        Workload::ReadBw,
    ];

    /// The `pinpoll-perf` subcommand.
    pub fn name(self) -> &'static str {
        match self {
            Workload::WriteLat => "write-lat",
            Workload::SendLat => "send-lat",
            Workload::ReadLat => "read-lat",
            Workload::WriteBw => "write-bw",
            Workload::SendBw => "send-bw",
            Workload::ReadBw => "read-bw",
        }
    }

    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Workload::WriteLat | Workload::SendLat | Workload::ReadLat
        )
    }

    /// The profile `pinpoll-perf` starts this test from by default.
    pub fn default_profile(self) -> &'static str {
        if self.is_latency() {
            "latency"
        } else {
            "throughput"
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s.trim())
            .ok_or_else(|| {
                format!(
                    "{s:?} is not a workload: give {}",
                    Workload::ALL.map(Workload::name).join(", ")
                )
            })
    }
}

/// The configuration `pinpoll-perf` actually used (its `connection`):
/// it sizes slots to the message, so these can differ from the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Connection {
    pub send_depth: u64,
    pub recv_depth: u64,
    pub batch_size: u64,
    pub signal_interval: u64,
    pub inline_threshold: u64,
    pub slot_size: u64,
    pub slot_count: u64,
}

impl Connection {
    pub const COLUMNS: [&'static str; 7] = [
        "conn_send_depth",
        "conn_recv_depth",
        "conn_batch_size",
        "conn_signal_interval",
        "conn_inline_threshold",
        "conn_slot_size",
        "conn_slot_count",
    ];

    pub fn values(&self) -> [u64; 7] {
        [
            self.send_depth,
            self.recv_depth,
            self.batch_size,
            self.signal_interval,
            self.inline_threshold,
            self.slot_size,
            self.slot_count,
        ]
    }
}

/// The figures of one run (one message size). Latency in microseconds as
/// `pinpoll-perf` reports it (half a round trip for write and send).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Measurement {
    pub min_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub mean_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p99_9_us: Option<f64>,
    pub max_us: Option<f64>,
    pub mib_per_sec: Option<f64>,
    pub gbps: Option<f64>,
    pub mpps: Option<f64>,
    pub doorbells_per_op: Option<f64>,
    pub connection: Option<Connection>,
}

type Getter = fn(&Measurement) -> Option<f64>;

/// The figures, as CSV columns.
pub const METRICS: [(&str, Getter); 10] = [
    ("min_us", |m| m.min_us),
    ("p50_us", |m| m.p50_us),
    ("mean_us", |m| m.mean_us),
    ("p99_us", |m| m.p99_us),
    ("p99_9_us", |m| m.p99_9_us),
    ("max_us", |m| m.max_us),
    ("mib_per_sec", |m| m.mib_per_sec),
    ("gbps", |m| m.gbps),
    ("mpps", |m| m.mpps),
    ("doorbells_per_op", |m| m.doorbells_per_op),
];

fn num(v: &Json, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

impl Measurement {
    /// The measurement in a `pinpoll-perf --json` document of one size.
    pub fn from_perf_json(text: &str) -> Result<Measurement, String> {
        let doc: Json = serde_json::from_str(text.trim())
            .map_err(|e| format!("pinpoll-perf printed no JSON document ({e})"))?;
        let results = doc
            .get("results")
            .and_then(Json::as_array)
            .ok_or("the pinpoll-perf JSON has no `results` array")?;
        let r = match results.as_slice() {
            [one] => one,
            [] => return Err("the pinpoll-perf JSON has no results".into()),
            many => return Err(format!("expected one result, got {}", many.len())),
        };
        let lat = |k: &str| num(r, &["latency", k]);
        let bw = |k: &str| num(r, &["bandwidth", k]);
        let c = r.get("connection");
        let conn = |k: &str| c.and_then(|c| c.get(k)).and_then(Json::as_u64);
        let m = Measurement {
            min_us: lat("min"),
            p50_us: lat("p50"),
            mean_us: lat("mean"),
            p99_us: lat("p99"),
            p99_9_us: lat("p99_9"),
            max_us: lat("max"),
            mib_per_sec: bw("mib_per_sec"),
            gbps: bw("gbps"),
            mpps: bw("mpps"),
            doorbells_per_op: num(r, &["work_requests", "per_op"]),
            connection: c.map(|_| Connection {
                send_depth: conn("send_depth").unwrap_or(0),
                recv_depth: conn("recv_depth").unwrap_or(0),
                batch_size: conn("batch_size").unwrap_or(0),
                signal_interval: conn("signal_interval").unwrap_or(0),
                inline_threshold: conn("inline_threshold").unwrap_or(0),
                slot_size: conn("slot_size").unwrap_or(0),
                slot_count: conn("slot_count").unwrap_or(0),
            }),
        };
        if m.p50_us.is_none() && m.mib_per_sec.is_none() {
            return Err(
                "the pinpoll-perf result has neither latency.p50 nor bandwidth.mib_per_sec".into(),
            );
        }
        Ok(m)
    }

    /// The median of every figure over `runs` (figures a run lacks are
    /// left out of that figure's median). The connection is the first
    /// run's: repeats of a point share it.
    pub fn median_of(runs: &[&Measurement]) -> Measurement {
        let med = |get: Getter| {
            let mut v: Vec<f64> = runs.iter().filter_map(|m| get(m)).collect();
            median(&mut v)
        };
        Measurement {
            min_us: med(|m| m.min_us),
            p50_us: med(|m| m.p50_us),
            mean_us: med(|m| m.mean_us),
            p99_us: med(|m| m.p99_us),
            p99_9_us: med(|m| m.p99_9_us),
            max_us: med(|m| m.max_us),
            mib_per_sec: med(|m| m.mib_per_sec),
            gbps: med(|m| m.gbps),
            mpps: med(|m| m.mpps),
            doorbells_per_op: med(|m| m.doorbells_per_op),
            connection: runs.iter().find_map(|m| m.connection),
        }
    }
}

/// The median: the middle value, or the mean of the two middle values of
/// an even count. NaNs are ignored; `None` when nothing is left.
pub fn median(values: &mut Vec<f64>) -> Option<f64> {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

/// How one run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ok(Measurement),
    /// `pinpoll-perf` failed: its error line.
    Failed(String),
    /// Killed after the per-run timeout (seconds).
    TimedOut(f64),
}

impl Outcome {
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Ok(_) => "ok",
            Outcome::Failed(_) => "failed",
            Outcome::TimedOut(_) => "timeout",
        }
    }

    pub fn measurement(&self) -> Option<&Measurement> {
        match self {
            Outcome::Ok(m) => Some(m),
            _ => None,
        }
    }

    pub fn error(&self) -> Option<String> {
        match self {
            Outcome::Ok(_) => None,
            Outcome::Failed(e) => Some(e.clone()),
            Outcome::TimedOut(s) => Some(format!("killed after {s} s")),
        }
    }
}

/// One run: a workload at one grid point, message size and repeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub workload: Workload,
    pub point: usize,
    pub size: usize,
    /// 1-based.
    pub repeat: u32,
    pub outcome: Outcome,
}

/// The repeats of a workload at one point and size, reduced to medians.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub workload: Workload,
    pub point: usize,
    pub size: usize,
    /// Runs that measured.
    pub ok: usize,
    /// Runs attempted (0 for a point skipped as invalid).
    pub runs: usize,
    /// Medians over the runs that measured (`None` when none did).
    pub median: Option<Measurement>,
    /// Why the point was skipped, or the last run's error when none measured.
    pub error: Option<String>,
}

impl Summary {
    pub fn status(&self) -> &'static str {
        if self.runs == 0 {
            "invalid"
        } else if self.ok == 0 {
            "failed"
        } else {
            "ok"
        }
    }
}

/// Groups `runs` by (workload, point, size) and takes medians; `invalid`
/// lists skipped points (workload, index, reason), which get one summary
/// per size.
pub fn summarize(
    runs: &[Run],
    workloads: &[Workload],
    points: usize,
    sizes: &[usize],
    invalid: &[(Workload, usize, String)],
) -> Vec<Summary> {
    let mut out = Vec::new();
    for &workload in workloads {
        for point in 0..points {
            for &size in sizes {
                if let Some((_, _, why)) = invalid
                    .iter()
                    .find(|(w, i, _)| *w == workload && *i == point)
                {
                    out.push(Summary {
                        workload,
                        point,
                        size,
                        ok: 0,
                        runs: 0,
                        median: None,
                        error: Some(why.clone()),
                    });
                    continue;
                }
                let these: Vec<&Run> = runs
                    .iter()
                    .filter(|r| r.workload == workload && r.point == point && r.size == size)
                    .collect();
                if these.is_empty() {
                    continue;
                }
                let ok: Vec<&Measurement> = these
                    .iter()
                    .filter_map(|r| r.outcome.measurement())
                    .collect();
                out.push(Summary {
                    workload,
                    point,
                    size,
                    ok: ok.len(),
                    runs: these.len(),
                    median: (!ok.is_empty()).then(|| Measurement::median_of(&ok)),
                    error: if ok.is_empty() {
                        these.iter().rev().find_map(|r| r.outcome.error())
                    } else {
                        None
                    },
                });
            }
        }
    }
    out
}
