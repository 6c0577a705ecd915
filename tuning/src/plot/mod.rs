//! Every plot of pinpoll-tune, drawn with plotters' SVG backend: the
//! sweep's charts (one per workload, a panel per swept key) and the
//! benchmark comparison of `scripts/compare-perftest.sh --sweep` (`pinpoll-tune
//! plot`).
//!
//! - [`scale`] — axes: linear or log, their ticks and tick labels.
//! - [`draw`] — plotters: panels, legends, whole charts as SVG text.
//! - [`sweep`] — the panels of one sweep workload.
//! - [`benchmarks`] — compare-perftest's summary.json and its chart.
//!
//! A chart is data ([`Panel`], [`Series`]) first and SVG second, so the
//! data is tested apart from the drawing.

pub mod benchmarks;
pub mod draw;
pub mod scale;
pub mod sweep;

pub use draw::{side_by_side, stacked, LegendEntry};
pub use scale::ticks;

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("drawing the chart: {0}")]
    Draw(String),
}

/// How a line is stroked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dash {
    Solid,
    Dashed,
    Dotted,
}

/// One line of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// Colour index into [`draw::PALETTE`] (series of one message size,
    /// or of one tool, share a colour).
    pub colour: usize,
    pub dash: Dash,
    /// (x category index, value); categories without a value are gaps.
    pub points: Vec<(usize, f64)>,
}

/// What lies along x.
#[derive(Debug, Clone, PartialEq)]
pub enum XAxis {
    /// Named values, evenly spaced (a swept key's values).
    Categories(Vec<String>),
    /// Message sizes in bytes, on a log2 scale (labelled 64, 4K, 1M).
    Bytes(Vec<u64>),
}

impl XAxis {
    pub fn len(&self) -> usize {
        match self {
            XAxis::Categories(names) => names.len(),
            XAxis::Bytes(sizes) => sizes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of category `index` along x (before the axis' log).
    pub fn value(&self, index: usize) -> Option<f64> {
        match self {
            XAxis::Categories(names) => (index < names.len()).then_some(index as f64),
            XAxis::Bytes(sizes) => sizes.get(index).map(|s| *s as f64),
        }
    }
}

/// Which y axis a panel gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YScale {
    /// Linear from zero, or log when the values span more than
    /// [`scale::LOG_RATIO`].
    Auto,
    Log,
}

/// One chart: categories along x, a figure along y.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Drawn above the panel (empty: none).
    pub caption: String,
    pub x_label: String,
    pub x: XAxis,
    /// The y axis' title; " (log scale)" is added when the axis is log.
    pub y_label: String,
    pub y_scale: YScale,
    pub series: Vec<Series>,
}
