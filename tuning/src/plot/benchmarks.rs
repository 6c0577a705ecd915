//! The benchmark comparison (`docs/benchmarks.svg`): from the summary.json
//! of `scripts/compare-perftest.sh --sweep`, RDMA WRITE latency
//! percentiles and WRITE bandwidth against message size, pinpoll-perf
//! against perftest.
//!
//! The summary is read field by field, so that a missing or mistyped one
//! is reported by its path (`sweep.write_lat[2].perftest.p99`). A `null`
//! figure is a point that was not measured (every round of it failed):
//! it is left out of the line.

use serde_json::Value;

use super::{Dash, LegendEntry, Panel, PlotError, Series, XAxis, YScale};

/// The two tools compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Pinpoll,
    Perftest,
}

impl Tool {
    pub const BOTH: [Tool; 2] = [Tool::Pinpoll, Tool::Perftest];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Pinpoll => "pinpoll-perf",
            Tool::Perftest => "perftest",
        }
    }

    /// Its colour in every panel and in the legend.
    fn colour(self) -> usize {
        match self {
            Tool::Pinpoll => 0,
            Tool::Perftest => 1,
        }
    }
}

/// The latency percentiles plotted, each with its own stroke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Percentile {
    P50,
    P99,
    P99_9,
}

impl Percentile {
    pub const ALL: [Percentile; 3] = [Percentile::P50, Percentile::P99, Percentile::P99_9];

    pub fn name(self) -> &'static str {
        match self {
            Percentile::P50 => "p50",
            Percentile::P99 => "p99",
            Percentile::P99_9 => "p99.9",
        }
    }

    fn dash(self) -> Dash {
        match self {
            Percentile::P50 => Dash::Solid,
            Percentile::P99 => Dash::Dashed,
            Percentile::P99_9 => Dash::Dotted,
        }
    }
}

/// The latency percentiles of one tool at one size, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p99_9: Option<f64>,
}

impl Percentiles {
    pub fn get(&self, p: Percentile) -> Option<f64> {
        match p {
            Percentile::P50 => self.p50,
            Percentile::P99 => self.p99,
            Percentile::P99_9 => self.p99_9,
        }
    }
}

/// Both tools' figures at one message size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizePoint<T> {
    pub bytes: u64,
    pub pinpoll: T,
    pub perftest: T,
}

impl<T> SizePoint<T> {
    pub fn of(&self, tool: Tool) -> &T {
        match tool {
            Tool::Pinpoll => &self.pinpoll,
            Tool::Perftest => &self.perftest,
        }
    }
}

/// Latency percentiles of both tools at one size.
pub type LatencyPoint = SizePoint<Percentiles>;
/// Bandwidth of both tools at one size, in Gb/s.
pub type BandwidthPoint = SizePoint<Option<f64>>;

/// What the plot needs of a summary.json.
#[derive(Debug, Clone, PartialEq)]
pub struct ComparisonSummary {
    /// Interleaved rounds; every figure is a median over them.
    pub rounds: u64,
    pub write_lat: Vec<LatencyPoint>,
    pub write_bw: Vec<BandwidthPoint>,
}

/// Why a summary cannot be plotted. `field` is the path of the field at
/// fault, as in `sweep.write_lat[2].perftest.p99`.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("not JSON: {0}")]
    Syntax(#[from] serde_json::Error),
    #[error("field `{field}` is missing")]
    Missing { field: String },
    #[error("field `{field}` should be {expected}, found {found}")]
    Type {
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error("field `{field}` has no measured point: run scripts/compare-perftest.sh --sweep")]
    NoData { field: String },
    #[error("the summary should be a JSON object, found {found}")]
    NotAnObject { found: String },
}

/// A JSON value and its path in the document, for errors.
struct Field<'a> {
    path: String,
    value: &'a Value,
}

impl<'a> Field<'a> {
    fn get(&self, name: &str) -> Result<Field<'a>, SummaryError> {
        let path = if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        };
        match self.value.as_object() {
            Some(object) => match object.get(name) {
                Some(value) => Ok(Field { path, value }),
                None => Err(SummaryError::Missing { field: path }),
            },
            None if self.path.is_empty() => Err(SummaryError::NotAnObject {
                found: self.found(),
            }),
            None => Err(self.wrong("an object")),
        }
    }

    /// The value as an error quotes it: its JSON, cut short.
    fn found(&self) -> String {
        const QUOTED: usize = 40;
        let text = self.value.to_string();
        if text.chars().count() > QUOTED {
            text.chars().take(QUOTED).chain("...".chars()).collect()
        } else {
            text
        }
    }

    fn wrong(&self, expected: &'static str) -> SummaryError {
        SummaryError::Type {
            field: self.path.clone(),
            expected,
            found: self.found(),
        }
    }

    /// Reads each item of a list with `read`.
    fn each<T>(
        &self,
        read: impl Fn(&Field<'a>) -> Result<T, SummaryError>,
    ) -> Result<Vec<T>, SummaryError> {
        let array = self.value.as_array().ok_or_else(|| self.wrong("a list"))?;
        array
            .iter()
            .enumerate()
            .map(|(i, value)| {
                read(&Field {
                    path: format!("{}[{i}]", self.path),
                    value,
                })
            })
            .collect()
    }

    /// A figure: a non-negative number, or null for "not measured".
    fn figure(&self) -> Result<Option<f64>, SummaryError> {
        match self.value {
            Value::Null => Ok(None),
            v => v
                .as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(Some)
                .ok_or_else(|| self.wrong("a non-negative number or null")),
        }
    }

    fn positive_integer(&self) -> Result<u64, SummaryError> {
        self.value
            .as_u64()
            .filter(|n| *n > 0)
            .ok_or_else(|| self.wrong("a positive integer"))
    }

    /// `bytes`, and `pinpoll` and `perftest` read with `read`.
    fn size_point<T>(
        &self,
        read: impl Fn(&Field<'a>) -> Result<T, SummaryError>,
    ) -> Result<SizePoint<T>, SummaryError> {
        Ok(SizePoint {
            bytes: self.get("bytes")?.positive_integer()?,
            pinpoll: read(&self.get("pinpoll")?)?,
            perftest: read(&self.get("perftest")?)?,
        })
    }

    fn percentiles(&self) -> Result<Percentiles, SummaryError> {
        Ok(Percentiles {
            p50: self.get("p50")?.figure()?,
            p99: self.get("p99")?.figure()?,
            p99_9: self.get("p99_9")?.figure()?,
        })
    }
}

impl ComparisonSummary {
    /// Reads the fields the plot needs from summary.json's text.
    pub fn from_json(text: &str) -> Result<ComparisonSummary, SummaryError> {
        let value: Value = serde_json::from_str(text)?;
        let root = Field {
            path: String::new(),
            value: &value,
        };
        let sweep = root.get("sweep")?;
        let write_lat = sweep
            .get("write_lat")?
            .each(|p| p.size_point(Field::percentiles))?;
        let write_bw = sweep
            .get("write_bw")?
            .each(|p| p.size_point(Field::figure))?;
        let summary = ComparisonSummary {
            rounds: root.get("rounds")?.positive_integer()?,
            write_lat,
            write_bw,
        };
        summary.check_measured()?;
        Ok(summary)
    }

    /// Each panel needs one measured figure at least.
    fn check_measured(&self) -> Result<(), SummaryError> {
        let lat = self.write_lat.iter().any(|p| {
            [p.pinpoll, p.perftest].iter().any(|t| {
                [t.p50, t.p99, t.p99_9]
                    .iter()
                    .any(|v| v.is_some_and(|v| v > 0.0))
            })
        });
        let bw = self.write_bw.iter().any(|p| {
            [p.pinpoll, p.perftest]
                .iter()
                .any(|v| v.is_some_and(|v| v > 0.0))
        });
        for (measured, field) in [(lat, "sweep.write_lat"), (bw, "sweep.write_bw")] {
            if !measured {
                return Err(SummaryError::NoData {
                    field: field.into(),
                });
            }
        }
        Ok(())
    }

    /// The latency panel: p50 solid, p99 dashed, p99.9 dotted; one colour
    /// per tool.
    pub fn latency_panel(&self) -> Panel {
        let mut series = Vec::new();
        for percentile in Percentile::ALL {
            for tool in Tool::BOTH {
                series.push(Series {
                    name: format!("{} {}", tool.name(), percentile.name()),
                    colour: tool.colour(),
                    dash: percentile.dash(),
                    points: indexed(self.write_lat.iter().map(|p| p.of(tool).get(percentile))),
                });
            }
        }
        Panel {
            caption: "RDMA WRITE latency (½ round trip)".into(),
            x_label: "message size (bytes)".into(),
            x: XAxis::Bytes(self.write_lat.iter().map(|p| p.bytes).collect()),
            y_label: "latency, µs".into(),
            y_scale: YScale::Log,
            series,
        }
    }

    /// The bandwidth panel: one line per tool.
    pub fn bandwidth_panel(&self) -> Panel {
        Panel {
            caption: "RDMA WRITE bandwidth".into(),
            x_label: "message size (bytes)".into(),
            x: XAxis::Bytes(self.write_bw.iter().map(|p| p.bytes).collect()),
            y_label: "bandwidth, Gb/s".into(),
            y_scale: YScale::Log,
            series: Tool::BOTH
                .map(|tool| Series {
                    name: format!("{} bandwidth", tool.name()),
                    colour: tool.colour(),
                    dash: Dash::Solid,
                    points: indexed(self.write_bw.iter().map(|p| *p.of(tool))),
                })
                .to_vec(),
        }
    }

    /// The whole comparison as SVG: both panels, a legend of the tools
    /// and of the line styles, and how the figures were taken.
    pub fn chart(&self) -> Result<String, PlotError> {
        let entry = |label: &str, colour: Option<usize>, dash: Dash| LegendEntry {
            label: label.into(),
            colour,
            dash,
        };
        let how = |tool: Tool| match tool {
            Tool::Pinpoll => "direct mode, loopback",
            Tool::Perftest => "ib_write_lat / ib_write_bw",
        };
        let tools = Tool::BOTH.map(|t| {
            let label = format!("{} ({})", t.name(), how(t));
            entry(&label, Some(t.colour()), Dash::Solid)
        });
        let strokes = Percentile::ALL.map(|p| entry(p.name(), None, p.dash()));
        let legend: Vec<LegendEntry> = tools.into_iter().chain(strokes).collect();
        let note = format!(
            "medians of {} interleaved rounds; rxe (SoftRoCE) in a TCG guest",
            self.rounds
        );
        super::side_by_side(
            &[self.latency_panel(), self.bandwidth_panel()],
            &legend,
            &note,
        )
    }
}

/// (index, figure) of each measured figure.
fn indexed(figures: impl Iterator<Item = Option<f64>>) -> Vec<(usize, f64)> {
    figures
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, v)))
        .collect()
}
