//! The charts of `pinpoll-tune sweep`: one per workload, a panel per
//! swept key, the best point of each of its values against that value.

use crate::sweep::grid::{Grid, Point, Value};
use crate::sweep::measure::{Measurement, Summary, Workload};

use super::{Dash, Panel, Series, XAxis, YScale};

/// Whether median `a` beats `b`: lower p50 for latency, higher MiB/s
/// for bandwidth.
fn better(workload: Workload, a: &Measurement, b: &Measurement) -> bool {
    if workload.is_latency() {
        a.p50_us.unwrap_or(f64::MAX) < b.p50_us.unwrap_or(f64::MAX)
    } else {
        a.mib_per_sec.unwrap_or(0.0) > b.mib_per_sec.unwrap_or(0.0)
    }
}

/// For each of `values` of `key` (`None`: any point), the best of
/// `medians` among the points with that value.
fn best_per_value<'a>(
    workload: Workload,
    key: &str,
    values: &[Option<&Value>],
    medians: &[(&Point, &'a Measurement)],
) -> Vec<Option<&'a Measurement>> {
    values
        .iter()
        .map(|v| {
            medians
                .iter()
                .filter(|(p, _)| v.is_none() || p.get(key) == *v)
                .map(|(_, m)| *m)
                .fold(None, |acc: Option<&Measurement>, m| match acc {
                    Some(a) if !better(workload, m, a) => Some(a),
                    _ => Some(m),
                })
        })
        .collect()
}

/// The lines of one message size over a key's values: p50 (solid) and
/// p99 (dashed), or MiB/s.
fn size_series(
    workload: Workload,
    size: usize,
    colour: usize,
    best: &[Option<&Measurement>],
) -> Vec<Series> {
    let line = |name: String, dash: Dash, get: fn(&Measurement) -> Option<f64>| Series {
        name,
        colour,
        dash,
        points: best
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.and_then(get).map(|v| (i, v)))
            .collect(),
    };
    if workload.is_latency() {
        vec![
            line(format!("p50 {size} B"), Dash::Solid, |m| m.p50_us),
            line(format!("p99 {size} B"), Dash::Dashed, |m| m.p99_us),
        ]
    } else {
        vec![line(format!("MiB/s {size} B"), Dash::Solid, |m| {
            m.mib_per_sec
        })]
    }
}

/// The panels of one workload: for each swept key, each of its values and
/// each message size, the best point with that value (lowest median p50,
/// or highest median MiB/s). Latency panels plot its median p50 (solid)
/// and p99 (dashed); bandwidth panels its median MiB/s.
pub fn workload_panels(
    workload: Workload,
    grid: &Grid,
    points: &[Point],
    summaries: &[Summary],
    sizes: &[usize],
) -> Vec<Panel> {
    let medians = |size: usize| -> Vec<(&Point, &Measurement)> {
        summaries
            .iter()
            .filter(|s| s.workload == workload && s.size == size)
            .filter_map(|s| s.median.as_ref().map(|m| (&points[s.point], m)))
            .collect()
    };
    let axes: Vec<(String, Vec<Option<&Value>>)> = if grid.axes.is_empty() {
        vec![("base profile".into(), vec![None])]
    } else {
        grid.axes
            .iter()
            .map(|(k, vs)| (k.clone(), vs.iter().map(Some).collect()))
            .collect()
    };
    axes.iter()
        .map(|(key, values)| Panel {
            caption: String::new(),
            x_label: key.clone(),
            x: XAxis::Categories(
                values
                    .iter()
                    .map(|v| v.map_or("base".to_owned(), ToString::to_string))
                    .collect(),
            ),
            y_label: if workload.is_latency() {
                "latency [µs]".into()
            } else {
                "bandwidth [MiB/s]".into()
            },
            y_scale: YScale::Auto,
            series: sizes
                .iter()
                .enumerate()
                .flat_map(|(colour, &size)| {
                    let best = best_per_value(workload, key, values, &medians(size));
                    size_series(workload, size, colour, &best)
                })
                .collect(),
        })
        .collect()
}
