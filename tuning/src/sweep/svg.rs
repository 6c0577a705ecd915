//! SVG line charts, written by hand: one file per workload, one panel per
//! swept key, the figures against that key's values.

use std::fmt::Write as _;

use super::grid::{Grid, Point};
use super::measure::{Measurement, Summary, Workload};

/// One line of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// Colour index (series of one message size share a colour).
    pub colour: usize,
    pub dashed: bool,
    /// (x category index, value); categories without a value are gaps.
    pub points: Vec<(usize, f64)>,
}

/// One chart: categories along x, a figure along y.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub x_label: String,
    pub categories: Vec<String>,
    pub y_label: String,
    pub series: Vec<Series>,
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

/// Text for SVG content and attributes.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Round tick values spanning [lo, hi]: steps of 1, 2 or 5 x 10^k.
pub fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo, lo + 1.0) };
    let raw = (hi - lo) / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).floor() * step;
    let mut out = Vec::new();
    let mut v = first;
    while v <= hi + step * 1e-9 {
        out.push(v);
        v += step;
    }
    if out.last().is_some_and(|l| *l < hi) {
        out.push(v);
    }
    out
}

fn tick_label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

const W: f64 = 720.0;
const PANEL_H: f64 = 300.0;
const TOP: f64 = 56.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
/// Values spanning more than this ratio get a logarithmic y axis.
const LOG_RATIO: f64 = 50.0;

fn panel(out: &mut String, p: &Panel, y0: f64) {
    let (x0, x1) = (LEFT, W - RIGHT);
    let (top, bottom) = (y0 + 20.0, y0 + PANEL_H - 50.0);
    let values: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, v)| *v))
        .filter(|v| v.is_finite())
        .collect();
    let hi = values.iter().copied().fold(0.0f64, f64::max);
    let lo = values
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::MAX, f64::min);
    // Tails on a shared machine can be 100x the median: a log axis keeps
    // both readable.
    let log = hi > 0.0 && lo < f64::MAX && hi / lo > LOG_RATIO;
    let ticks = if log {
        let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (a..=b.max(a + 1)).map(|e| 10f64.powi(e)).collect()
    } else {
        ticks(0.0, if hi > 0.0 { hi * 1.05 } else { 1.0 })
    };
    let y_min = if log { ticks[0] } else { 0.0 };
    let y_max = *ticks.last().unwrap_or(&1.0);
    let y = |v: f64| {
        let f = if log {
            (v.max(y_min).log10() - y_min.log10()) / (y_max.log10() - y_min.log10())
        } else {
            (v - y_min) / (y_max - y_min)
        };
        bottom - f * (bottom - top)
    };
    let y_label = if log {
        format!("{} (log scale)", p.y_label)
    } else {
        p.y_label.clone()
    };
    let n = p.categories.len().max(1);
    let x = |i: usize| {
        if n == 1 {
            (x0 + x1) / 2.0
        } else {
            x0 + 20.0 + (x1 - x0 - 40.0) * i as f64 / (n - 1) as f64
        }
    };
    let _ = writeln!(
        out,
        "<g class=\"panel\" data-key=\"{}\">",
        escape(&p.x_label)
    );
    let _ = writeln!(
        out,
        "<rect x=\"{x0}\" y=\"{top}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>",
        x1 - x0,
        bottom - top
    );
    for t in &ticks {
        let ty = y(*t);
        let _ = writeln!(
            out,
            "<line x1=\"{x0}\" y1=\"{ty:.1}\" x2=\"{x1}\" y2=\"{ty:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
            x0 - 6.0,
            ty + 4.0,
            tick_label(*t)
        );
    }
    for (i, c) in p.categories.iter().enumerate() {
        let tx = x(i);
        let _ = writeln!(
            out,
            "<line x1=\"{tx:.1}\" y1=\"{bottom}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#444\"/><text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
            bottom + 5.0,
            bottom + 18.0,
            escape(c)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
        (x0 + x1) / 2.0,
        bottom + 38.0,
        escape(&p.x_label)
    );
    let _ = writeln!(
        out,
        "<text x=\"18\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 18 {:.1})\">{}</text>",
        (top + bottom) / 2.0,
        (top + bottom) / 2.0,
        escape(&y_label)
    );
    for (k, s) in p.series.iter().enumerate() {
        let colour = COLOURS[s.colour % COLOURS.len()];
        let dash = if s.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let coords: Vec<String> = s
            .points
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, v)| format!("{:.1},{:.1}", x(*i), y(*v)))
            .collect();
        let _ = writeln!(
            out,
            "<polyline class=\"series\" data-series=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"{dash}/>",
            escape(&s.name),
            coords.join(" ")
        );
        for c in &coords {
            let (cx, cy) = c.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                out,
                "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"3\" fill=\"{colour}\"/>"
            );
        }
        let ly = top + 10.0 + 18.0 * k as f64;
        let _ = writeln!(
            out,
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>",
            x1 + 12.0,
            x1 + 36.0,
            x1 + 42.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    let _ = writeln!(out, "</g>");
}

/// A whole chart: a title, a subtitle, and the panels stacked.
pub fn chart(title: &str, subtitle: &str, panels: &[Panel]) -> String {
    let h = TOP + PANEL_H * panels.len().max(1) as f64;
    let mut out = String::new();
    let _ = writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" font-family=\"sans-serif\">"
    );
    let _ = writeln!(out, "<title>{}</title>", escape(title));
    let _ = writeln!(out, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>",
        escape(title)
    );
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"42\" font-size=\"11\" fill=\"#555\">{}</text>",
        escape(subtitle)
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, TOP + PANEL_H * i as f64);
    }
    out.push_str("</svg>\n");
    out
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
    let axes: Vec<(String, Vec<Option<&super::grid::Value>>)> = if grid.axes.is_empty() {
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
                        dashed: false,
                        points: collect(|m| m.p50_us),
                    });
                    series.push(Series {
                        name: format!("p99 {size} B"),
                        colour: si,
                        dashed: true,
                        points: collect(|m| m.p99_us),
                    });
                } else {
                    series.push(Series {
                        name: format!("MiB/s {size} B"),
                        colour: si,
                        dashed: false,
                        points: collect(|m| m.mib_per_sec),
                    });
                }
            }
            Panel {
                x_label: key.clone(),
                categories: values
                    .iter()
                    .map(|v| v.map_or("base".to_owned(), ToString::to_string))
                    .collect(),
                y_label: if lat {
                    "latency [usec], median of repeats".into()
                } else {
                    "bandwidth [MiB/s], median of repeats".into()
                },
                series,
            }
        })
        .collect()
}
