//! The sweep's CSV files: `runs.csv` (every run: point x size x repeat)
//! and `medians.csv` (one row per point and size, medians of the repeats).

use super::grid::Point;
use super::measure::{Measurement, Run, Summary, METRICS};
use crate::sweep::measure::Connection;

/// One CSV field, quoted when it holds a comma, quote or line break.
pub fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

fn line(fields: &[String]) -> String {
    let mut s = fields
        .iter()
        .map(|f| field(f))
        .collect::<Vec<_>>()
        .join(",");
    s.push('\n');
    s
}

fn figures(m: Option<&Measurement>) -> Vec<String> {
    let mut out: Vec<String> = METRICS
        .iter()
        .map(|(_, get)| m.and_then(get).map_or(String::new(), |v| format!("{v}")))
        .collect();
    let conn = m.and_then(|m| m.connection);
    out.extend(
        conn.map(|c| c.values().map(|v| v.to_string()).to_vec())
            .unwrap_or_else(|| vec![String::new(); Connection::COLUMNS.len()]),
    );
    out
}

fn head(keys: &[&str], middle: &[&str]) -> String {
    let mut h: Vec<String> = ["workload", "size", "point"].map(String::from).to_vec();
    h.extend(keys.iter().map(|k| k.to_string()));
    h.extend(middle.iter().map(|k| k.to_string()));
    h.extend(METRICS.iter().map(|(n, _)| n.to_string()));
    h.extend(Connection::COLUMNS.iter().map(|c| c.to_string()));
    h.push("error".into());
    line(&h)
}

fn settings(point: &Point, keys: &[&str]) -> Vec<String> {
    keys.iter()
        .map(|k| point.get(k).map_or(String::new(), ToString::to_string))
        .collect()
}

/// `runs.csv`: a header, then one row per run. `keys` are the swept keys
/// (one column each); `point` is 1-based.
pub fn runs_csv(keys: &[&str], points: &[Point], runs: &[Run]) -> String {
    let mut out = head(keys, &["repeat", "status"]);
    for r in runs {
        let mut row = vec![
            r.workload.name().to_owned(),
            r.size.to_string(),
            (r.point + 1).to_string(),
        ];
        row.extend(settings(&points[r.point], keys));
        row.push(r.repeat.to_string());
        row.push(r.outcome.status().to_owned());
        row.extend(figures(r.outcome.measurement()));
        row.push(r.outcome.error().unwrap_or_default());
        out.push_str(&line(&row));
    }
    out
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
) -> String {
    let mut out = head(keys, &["status", "ok_runs", "runs", "recommended"]);
    for s in summaries {
        let mut row = vec![
            s.workload.name().to_owned(),
            s.size.to_string(),
            (s.point + 1).to_string(),
        ];
        row.extend(settings(&points[s.point], keys));
        row.push(s.status().to_owned());
        row.push(s.ok.to_string());
        row.push(s.runs.to_string());
        row.push(if chosen(s) { "yes" } else { "" }.to_owned());
        row.extend(figures(s.median.as_ref()));
        row.push(s.error.clone().unwrap_or_default());
        out.push_str(&line(&row));
    }
    out
}

/// Splits one CSV line into fields (for tests and readers of our files).
pub fn split(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match (ch, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}
