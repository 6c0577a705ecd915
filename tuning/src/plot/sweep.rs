//! The charts of `pinpoll-tune sweep`: one per workload, a panel per
//! swept key, the best point of each of its values against that value.

use crate::sweep::grid::{Grid, Point, Value};
use crate::sweep::measure::{Measurement, Summary, Workload};

use super::{Dash, Panel, Series, XAxis, YScale};

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
    let lat = workload.is_latency();
    let medians = |size: usize| -> Vec<(&Point, &Measurement)> {
        summaries
            .iter()
            .filter(|s| s.workload == workload && s.size == size)
            .filter_map(|s| s.median.as_ref().map(|m| (&points[s.point], m)))
            .collect()
    };
    let better = |a: &Measurement, b: &Measurement| -> bool {
        if lat {
            a.p50_us.unwrap_or(f64::MAX) < b.p50_us.unwrap_or(f64::MAX)
        } else {
            a.mib_per_sec.unwrap_or(0.0) > b.mib_per_sec.unwrap_or(0.0)
        }
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
        .map(|(key, values)| {
            let mut series = Vec::new();
            for (si, &size) in sizes.iter().enumerate() {
                let all = medians(size);
                let best: Vec<Option<&Measurement>> = values
                    .iter()
                    .map(|v| {
                        all.iter()
                            .filter(|(p, _)| v.is_none() || p.get(key) == *v)
                            .map(|(_, m)| *m)
                            .fold(None, |acc: Option<&Measurement>, m| match acc {
                                Some(a) if !better(m, a) => Some(a),
                                _ => Some(m),
                            })
                    })
                    .collect();
                let collect = |get: fn(&Measurement) -> Option<f64>| -> Vec<(usize, f64)> {
                    best.iter()
                        .enumerate()
                        .filter_map(|(i, m)| m.and_then(get).map(|v| (i, v)))
                        .collect()
                };
                if lat {
                    series.push(Series {
                        name: format!("p50 {size} B"),
                        colour: si,
                        dash: Dash::Solid,
                        points: collect(|m| m.p50_us),
                    });
                    series.push(Series {
                        name: format!("p99 {size} B"),
                        colour: si,
                        dash: Dash::Dashed,
                        points: collect(|m| m.p99_us),
                    });
                } else {
                    series.push(Series {
                        name: format!("MiB/s {size} B"),
                        colour: si,
                        dash: Dash::Solid,
                        points: collect(|m| m.mib_per_sec),
                    });
                }
            }
            Panel {
                caption: String::new(),
                x_label: key.clone(),
                x: XAxis::Categories(
                    values
                        .iter()
                        .map(|v| v.map_or("base".to_owned(), ToString::to_string))
                        .collect(),
                ),
                y_label: if lat {
                    "latency [µs]".into()
                } else {
                    "bandwidth [MiB/s]".into()
                },
                y_scale: YScale::Auto,
                series,
            }
        })
        .collect()
}
