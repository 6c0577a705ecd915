//! Axis scales: where a value sits along an axis, which values get a tick
//! and how a tick reads. Log axes are linear axes over log10 (or log2 for
//! message sizes) of the values, so that plotters sees one coordinate type.

use super::{XAxis, YScale};

/// Values spanning more than this ratio get a logarithmic y axis: tails
/// on a shared machine can be 100x the median, and a log axis keeps both
/// readable.
pub const LOG_RATIO: f64 = 50.0;

/// A log y axis with more ticks than this labels only the decades.
const MAX_LOG_TICKS: usize = 10;

/// How a value maps onto the axis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Map {
    Linear,
    Log10,
    Log2,
}

impl Map {
    pub fn apply(self, v: f64) -> f64 {
        match self {
            Map::Linear => v,
            Map::Log10 => v.log10(),
            Map::Log2 => v.log2(),
        }
    }

    /// Whether `v` can be placed at all (log axes take positive values).
    pub fn accepts(self, v: f64) -> bool {
        v.is_finite() && (self == Map::Linear || v > 0.0)
    }
}

/// One axis, in axis units (after [`Map::apply`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub map: Map,
    pub lo: f64,
    pub hi: f64,
    /// Labelled ticks (with a grid line): position and text.
    pub ticks: Vec<(f64, String)>,
    /// Unlabelled grid lines.
    pub minor: Vec<f64>,
}

impl Axis {
    /// The label of the tick nearest `pos` (plotters asks by position).
    pub fn label_at(&self, pos: f64) -> String {
        self.ticks
            .iter()
            .min_by(|a, b| (a.0 - pos).abs().total_cmp(&(b.0 - pos).abs()))
            .map(|(_, label)| label.clone())
            .unwrap_or_default()
    }

    pub fn is_log(&self) -> bool {
        self.map != Map::Linear
    }
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

/// A tick's text: the shortest decimal that shows the value (float noise
/// from stepping is rounded away at nine places).
pub fn tick_label(v: f64) -> String {
    let text = format!("{v:.9}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

/// A message size as the axis shows it: 64, 4K, 1M.
pub fn size_label(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.trailing_zeros() >= 20 {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.trailing_zeros() >= 10 {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// The 1-2-5 values of every decade from 10^lo to 10^hi.
fn one_two_five(lo: i32, hi: i32) -> Vec<f64> {
    (lo..=hi)
        .flat_map(|e| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(e)))
        .collect()
}

/// A log10 axis from the largest 1-2-5 value at or below `lo` to the
/// smallest above it and at or above `hi` (positive, `lo <= hi`), ticks
/// at each 1-2-5 value, or only at the decades when that is too many.
fn log_axis(lo: f64, hi: f64) -> Axis {
    // Float noise in log10 must not push a value out of its own decade.
    let slack = 1e-9;
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    // 10^a <= lo and 10^b >= hi, so both ends are found.
    let candidates = one_two_five(a, b);
    let first = candidates
        .iter()
        .copied()
        .filter(|c| *c <= lo * (1.0 + slack))
        .fold(candidates[0], f64::max);
    let last = candidates
        .iter()
        .copied()
        .find(|c| *c >= hi * (1.0 - slack) && *c > first)
        .unwrap_or(first * 10.0);
    let within: Vec<f64> = candidates
        .iter()
        .copied()
        .filter(|c| *c >= first && *c <= last)
        .collect();
    let (labelled, minor): (Vec<f64>, Vec<f64>) = if within.len() <= MAX_LOG_TICKS {
        (within, Vec::new())
    } else {
        // Many decades: labels at the decades, 2 and 5 as grid lines only.
        let decades: Vec<f64> = (a..=b).map(|e| 10f64.powi(e)).collect();
        within.into_iter().partition(|c| decades.contains(c))
    };
    let pos = |v: &f64| v.log10();
    Axis {
        map: Map::Log10,
        lo: pos(&first),
        hi: pos(&last),
        ticks: labelled.iter().map(|v| (pos(v), tick_label(*v))).collect(),
        minor: minor.iter().map(pos).collect(),
    }
}

/// The y axis for `values` (non-finite ones ignored): a log axis when
/// asked for or when they span more than [`LOG_RATIO`], else a linear one
/// from zero to a round value above the largest.
pub fn y_axis(values: &[f64], scale: YScale) -> Axis {
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let hi = finite.clone().fold(0.0f64, f64::max);
    let lo = finite.filter(|v| *v > 0.0).fold(f64::MAX, f64::min);
    let has_positive = lo < f64::MAX;
    let log = has_positive
        && match scale {
            YScale::Log => true,
            YScale::Auto => hi / lo > LOG_RATIO,
        };
    if log {
        return log_axis(lo, hi);
    }
    let ticks = ticks(0.0, if hi > 0.0 { hi * 1.05 } else { 1.0 });
    Axis {
        map: Map::Linear,
        lo: 0.0,
        hi: *ticks.last().unwrap_or(&1.0),
        ticks: ticks.iter().map(|v| (*v, tick_label(*v))).collect(),
        minor: Vec::new(),
    }
}

/// The x axis: evenly spaced categories, or message sizes on a log2
/// scale. Either way the first and last ticks sit inside the frame, so
/// their labels are never cut by its edge.
pub fn x_axis(x: &XAxis) -> Axis {
    match x {
        XAxis::Categories(names) => {
            let n = names.len();
            let (lo, hi) = if n <= 1 {
                (-1.0, 1.0)
            } else {
                (-0.3, (n - 1) as f64 + 0.3)
            };
            Axis {
                map: Map::Linear,
                lo,
                hi,
                ticks: names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| (i as f64, name.clone()))
                    .collect(),
                minor: Vec::new(),
            }
        }
        XAxis::Bytes(sizes) => {
            let positions = sizes.iter().map(|s| (*s as f64).log2());
            let lo = positions.clone().fold(f64::MAX, f64::min);
            let hi = positions.fold(f64::MIN, f64::max);
            let (lo, hi) = if lo <= hi { (lo, hi) } else { (0.0, 1.0) };
            // Doublings of room either side of the first and last size.
            let pad = ((hi - lo) * 0.05).max(0.4);
            Axis {
                map: Map::Log2,
                lo: lo - pad,
                hi: hi + pad,
                ticks: sizes
                    .iter()
                    .map(|s| ((*s as f64).log2(), size_label(*s)))
                    .collect(),
                minor: Vec::new(),
            }
        }
    }
}
