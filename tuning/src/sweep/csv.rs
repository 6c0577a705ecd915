//! The sweep's CSV files: `runs.csv` (every run: point x size x repeat)
//! and `medians.csv` (one row per point and size, medians of the repeats).
//!
//! Rows are serde structs written by the `csv` crate. The swept keys
//! vary from sweep to sweep, so the header is written from the keys and
//! each row carries their values as a sequence (which `csv` flattens into
//! one field each).

use serde::{Serialize, Serializer};

use super::grid::Point;
use super::measure::{Connection, Measurement, Run, Summary, METRICS};

/// A figure as the CSV shows it: the shortest decimal that reads back
/// as the same number (`10`, `10.25`).
struct Figure(f64);

impl Serialize for Figure {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// The measured columns: every metric, then the connection the run
/// reported; empty fields where there is no figure.
#[derive(Serialize)]
struct Figures {
    metrics: Vec<Option<Figure>>,
    connection: Vec<Option<u64>>,
}

impl Figures {
    fn of(m: Option<&Measurement>) -> Figures {
        let connection = m.and_then(|m| m.connection);
        Figures {
            metrics: METRICS
                .iter()
                .map(|(_, get)| m.and_then(get).map(Figure))
                .collect(),
            connection: match connection {
                Some(c) => c.values().map(Some).to_vec(),
                None => vec![None; Connection::COLUMNS.len()],
            },
        }
    }
}

/// The first columns of both files: what was run, at which point.
#[derive(Serialize)]
struct Where<'a> {
    workload: &'a str,
    size: usize,
    /// 1-based.
    point: usize,
    /// The point's value of each swept key (empty: the base profile's).
    settings: Vec<Option<String>>,
}

impl<'a> Where<'a> {
    fn new(workload: &'a str, size: usize, point: usize, points: &[Point], keys: &[&str]) -> Self {
        Where {
            workload,
            size,
            point: point + 1,
            settings: keys
                .iter()
                .map(|k| points[point].get(k).map(ToString::to_string))
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct RunRow<'a> {
    at: Where<'a>,
    repeat: u32,
    status: &'a str,
    figures: Figures,
    error: String,
}

#[derive(Serialize)]
struct MedianRow<'a> {
    at: Where<'a>,
    status: &'a str,
    ok_runs: usize,
    runs: usize,
    recommended: &'a str,
    figures: Figures,
    error: &'a str,
}

/// The header: what and where, the keys, `middle`, the figures, `error`.
fn header(keys: &[&str], middle: &[&str]) -> Vec<String> {
    ["workload", "size", "point"]
        .iter()
        .chain(keys)
        .chain(middle)
        .chain(METRICS.iter().map(|(name, _)| name))
        .chain(Connection::COLUMNS.iter())
        .chain(["error"].iter())
        .map(|s| s.to_string())
        .collect()
}

/// The header and rows as CSV text.
fn write<R: Serialize>(
    header: Vec<String>,
    rows: impl IntoIterator<Item = R>,
) -> Result<String, String> {
    let mut out = ::csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    let failed = |e: ::csv::Error| format!("writing CSV: {e}");
    out.write_record(&header).map_err(failed)?;
    for row in rows {
        out.serialize(row).map_err(failed)?;
    }
    let bytes = out.into_inner().map_err(|e| format!("writing CSV: {e}"))?;
    String::from_utf8(bytes).map_err(|e| format!("writing CSV: {e}"))
}

/// `runs.csv`: a header, then one row per run. `keys` are the swept keys
/// (one column each); `point` is 1-based.
pub fn runs_csv(keys: &[&str], points: &[Point], runs: &[Run]) -> Result<String, String> {
    let rows = runs.iter().map(|r| RunRow {
        at: Where::new(r.workload.name(), r.size, r.point, points, keys),
        repeat: r.repeat,
        status: r.outcome.status(),
        figures: Figures::of(r.outcome.measurement()),
        error: r.outcome.error().unwrap_or_default(),
    });
    write(header(keys, &["repeat", "status"]), rows)
}

/// `medians.csv`: a header, then one row per workload, point and size,
/// the figures being medians over the runs that measured; skipped points
/// have status `invalid` and the reason. `chosen` marks the recommended
/// point of each workload.
pub fn medians_csv(
    keys: &[&str],
    points: &[Point],
    summaries: &[Summary],
    chosen: &dyn Fn(&Summary) -> bool,
) -> Result<String, String> {
    let rows = summaries.iter().map(|s| MedianRow {
        at: Where::new(s.workload.name(), s.size, s.point, points, keys),
        status: s.status(),
        ok_runs: s.ok,
        runs: s.runs,
        recommended: if chosen(s) { "yes" } else { "" },
        figures: Figures::of(s.median.as_ref()),
        error: s.error.as_deref().unwrap_or_default(),
    });
    write(
        header(keys, &["status", "ok_runs", "runs", "recommended"]),
        rows,
    )
}
