//! Drawing with plotters (SVG backend, no system fonts): a panel, a
//! legend, and the two arrangements of panels we publish. Every size is
//! in SVG pixels; legends get their own area, never the plotting area or
//! an axis title's.

use std::ops::Range;

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::scale::{self, Axis};
use super::{Dash, Panel, PlotError, Series};

/// Colours of series, by index (wrapping).
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
];
/// Subtitles and notes, and legend samples that stand for a line style
/// rather than a series' colour.
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);
const FRAME: RGBColor = RGBColor(0x44, 0x44, 0x44);
const GRID: RGBColor = RGBColor(0xdd, 0xdd, 0xdd);
const LIGHT_GRID: RGBColor = RGBColor(0xf0, 0xf0, 0xf0);

const TITLE_PX: f64 = 16.0;
const CAPTION_PX: f64 = 15.0;
const AXIS_TITLE_PX: f64 = 13.0;
const MIN_AXIS_TITLE_PX: f64 = 9.0;
const TICK_PX: f64 = 11.0;
const LEGEND_PX: f64 = 12.0;
const NOTE_PX: f64 = 11.0;

/// Width of one character, as a share of the font size: a little above
/// the average of sans-serif faces, so that estimated room is enough.
const CHAR_WIDTH: f64 = 0.64;
/// A legend entry: its line sample, the gap, then its text.
const SAMPLE_W: i32 = 28;
const SAMPLE_GAP: i32 = 6;
const LEGEND_ROW_H: i32 = 20;
/// Room around each panel.
const PANEL_MARGIN: i32 = 10;

/// Stacked charts: the header (title and a line of subtitle), its left
/// edge, each further subtitle line, each panel's least height, the
/// narrowest legend column and the least overall width.
const HEADER_H: u32 = 56;
const HEADER_LEFT: i32 = 16;
const LINE_H: i32 = 15;
const STACKED_PANEL_H: u32 = 300;
const STACKED_W: u32 = 720;
const LEGEND_COLUMN_MIN: u32 = 150;
/// The first legend entry's centre below the top of its panel.
const LEGEND_TOP: i32 = 24;
/// Side-by-side charts: each panel's width and height.
const SIDE_PANEL_W: u32 = 500;
const SIDE_PANEL_H: u32 = 400;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn drawn<T, E: std::fmt::Display>(result: Result<T, E>) -> Result<T, PlotError> {
    result.map_err(|e| PlotError::Draw(e.to_string()))
}

/// A sans-serif font of `px` SVG pixels (plotters writes size / 1.24).
fn font(px: f64) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", px * 1.24).into_font()).color(&BLACK)
}

fn bold(px: f64) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", px * 1.24, FontStyle::Bold).into_font()).color(&BLACK)
}

/// Room that `text` takes at `px` (an estimate: SVG has no metrics).
fn text_width(text: &str, px: f64) -> i32 {
    (text.chars().count() as f64 * px * CHAR_WIDTH).ceil() as i32
}

fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// One legend line: a colour (or none: a neutral grey, for a line style
/// shared by several series) and a stroke.
#[derive(Debug, Clone, PartialEq)]
pub struct LegendEntry {
    pub label: String,
    pub colour: Option<usize>,
    pub dash: Dash,
}

impl From<&Series> for LegendEntry {
    fn from(s: &Series) -> Self {
        LegendEntry {
            label: s.name.clone(),
            colour: Some(s.colour),
            dash: s.dash,
        }
    }
}

impl LegendEntry {
    fn width(&self) -> i32 {
        SAMPLE_W + SAMPLE_GAP + text_width(&self.label, LEGEND_PX)
    }
}

/// Draws a line of `dash` style through `points` on `area` (pixels, or a
/// chart's coordinates).
fn stroke<DB, CT>(
    area: &DrawingArea<DB, CT>,
    points: &[CT::From],
    dash: Dash,
    style: ShapeStyle,
) -> Result<(), String>
where
    DB: DrawingBackend,
    CT: plotters::coord::CoordTranslate,
    CT::From: Clone + 'static,
{
    let points = points.to_vec();
    let result = match dash {
        Dash::Solid => area.draw(&PathElement::new(points, style)),
        Dash::Dashed => area.draw(&DashedPathElement::new(points, 6, 4, style)),
        Dash::Dotted => area.draw(&DashedPathElement::new(points, 2, 3, style)),
    };
    result.map_err(|e| e.to_string())
}

/// Our axes are plotters coordinates: a linear map from `lo..hi`, ticks
/// (and grid lines) where [`scale`] put them, labelled as it says.
impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        let share = if span > 0.0 {
            (value - self.lo) / span
        } else {
            0.5
        };
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.ticks.iter().map(|(pos, _)| *pos).collect()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for Axis {
    fn format_ext(&self, value: &f64) -> String {
        self.label_at(*value)
    }
}

/// One panel, filling `area`: caption, axes with their titles, grid,
/// every series as a line with a marker per point, and a frame.
fn panel(area: &Area, p: &Panel) -> Result<(), PlotError> {
    let x = scale::x_axis(&p.x);
    let values: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, v)| *v))
        .collect();
    let y = scale::y_axis(&values, p.y_scale);
    let y_title = if y.is_log() {
        format!("{} (log scale)", p.y_label)
    } else {
        p.y_label.clone()
    };
    let widest = |axis: &Axis| {
        axis.ticks
            .iter()
            .map(|(_, t)| text_width(t, TICK_PX))
            .max()
            .unwrap_or(0)
    };
    let last_x_tick = x.ticks.last().map_or(0, |(_, t)| text_width(t, TICK_PX));
    // Below the plot: tick labels, a gap, the x title.
    let x_area = (TICK_PX * 1.5 + AXIS_TITLE_PX * 1.5) as i32 + 14;
    let caption_h = if p.caption.is_empty() {
        0
    } else {
        (CAPTION_PX * 2.0) as i32
    };
    let plot_h = area.dim_in_pixel().1 as i32 - PANEL_MARGIN - x_area - caption_h;
    // A y title longer than the plot is tall gets a smaller font.
    let y_title_px = (f64::from(plot_h) / (y_title.chars().count() as f64 * CHAR_WIDTH))
        .clamp(MIN_AXIS_TITLE_PX, AXIS_TITLE_PX);
    // Left of the plot: the rotated y title, a gap, the widest tick
    // label, and plotters' gap to the axis (twice its tick length).
    let y_area = (y_title_px * 1.5) as i32 + 6 + widest(&y) + 12;
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(PANEL_MARGIN)
        .margin_right((last_x_tick / 2 + PANEL_MARGIN).max(4 * PANEL_MARGIN))
        .x_label_area_size(x_area)
        .y_label_area_size(y_area);
    if !p.caption.is_empty() {
        builder.caption(&p.caption, bold(CAPTION_PX));
    }
    let mut chart = drawn(builder.build_cartesian_2d(x.clone(), y.clone()))?;
    drawn(
        chart
            .configure_mesh()
            .x_desc(p.x_label.as_str())
            .y_desc(y_title)
            .label_style(font(TICK_PX))
            .axis_desc_style(font(y_title_px))
            .axis_style(FRAME)
            .bold_line_style(GRID)
            .light_line_style(LIGHT_GRID)
            .draw(),
    )?;
    let plot = chart.plotting_area();
    for s in &p.series {
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|(i, v)| {
                let at = p.x.value(*i)?;
                (x.map.accepts(at) && y.map.accepts(*v)).then(|| (x.map.apply(at), y.map.apply(*v)))
            })
            .collect();
        let c = colour(s.colour);
        drawn(stroke(plot, &points, s.dash, c.stroke_width(2)))?;
        for at in points {
            drawn(plot.draw(&Circle::new(at, 3, c.filled())))?;
        }
    }
    drawn(plot.draw(&Rectangle::new(
        [(x.lo, y.lo), (x.hi, y.hi)],
        FRAME.stroke_width(1),
    )))
}

/// One legend entry with its sample's left end at `(x, y)` (pixels).
fn legend_entry(area: &Area, (x, y): (i32, i32), entry: &LegendEntry) -> Result<(), PlotError> {
    let c = entry.colour.map_or(GREY, colour);
    drawn(stroke(
        area,
        &[(x, y), (x + SAMPLE_W, y)],
        entry.dash,
        c.stroke_width(2),
    ))?;
    drawn(area.draw(&Text::new(
        entry.label.clone(),
        (x + SAMPLE_W + SAMPLE_GAP, y),
        font(LEGEND_PX).pos(Pos::new(HPos::Left, VPos::Center)),
    )))
}

/// `text` broken at spaces into lines of at most `width` pixels at `px`
/// (a word longer than that gets a line of its own).
fn wrap(text: &str, px: f64, width: i32) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if text_width(&format!("{line} {word}"), px) <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// The title and the subtitle's lines above everything.
fn header(area: &Area, left: i32, title: &str, subtitle: &[String]) -> Result<(), PlotError> {
    drawn(area.draw(&Text::new(
        title.to_owned(),
        (left, 10),
        bold(TITLE_PX).pos(Pos::new(HPos::Left, VPos::Top)),
    )))?;
    for (i, line) in subtitle.iter().enumerate() {
        drawn(
            area.draw(&Text::new(
                line.clone(),
                (left, 32 + LINE_H * i as i32),
                font(NOTE_PX)
                    .color(&GREY)
                    .pos(Pos::new(HPos::Left, VPos::Top)),
            )),
        )?;
    }
    Ok(())
}

/// Draws with `paint` onto a white `size` canvas and returns the SVG.
fn render(
    size: (u32, u32),
    paint: impl FnOnce(&Area) -> Result<(), PlotError>,
) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        drawn(root.fill(&WHITE))?;
        paint(&root)?;
        drawn(root.present())?;
    }
    Ok(format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{svg}"))
}

/// Panels one under another, each with its series' legend to its right,
/// under a title and a subtitle.
pub fn stacked(title: &str, subtitle: &str, panels: &[Panel]) -> Result<String, PlotError> {
    let legend_w = panels
        .iter()
        .flat_map(|p| p.series.iter())
        .map(|s| LegendEntry::from(s).width() + 16)
        .max()
        .map_or(LEGEND_COLUMN_MIN, |w| (w as u32).max(LEGEND_COLUMN_MIN));
    let width = STACKED_W.max(legend_w + 400);
    let rows = panels.len().max(1) as u32;
    // Each panel is as tall as its legend column, at least.
    let most_series = panels.iter().map(|p| p.series.len()).max().unwrap_or(0);
    let panel_h = STACKED_PANEL_H.max((LEGEND_TOP + LEGEND_ROW_H * most_series as i32) as u32 + 8);
    let subtitle = wrap(subtitle, NOTE_PX, width as i32 - 2 * HEADER_LEFT);
    let header_h = HEADER_H + LINE_H as u32 * subtitle.len().saturating_sub(1) as u32;
    let height = header_h + panel_h * rows + 8;
    render((width, height), |root| {
        header(root, HEADER_LEFT, title, &subtitle)?;
        let (_, body) = root.split_vertically(header_h);
        let (body, _) = body.split_vertically(panel_h * rows);
        for (p, row) in panels
            .iter()
            .zip(body.split_evenly((panels.len().max(1), 1)))
        {
            let (plot, legend) = row.split_horizontally(width - legend_w);
            panel(&plot, p)?;
            for (k, s) in p.series.iter().enumerate() {
                let y = LEGEND_TOP + LEGEND_ROW_H * k as i32;
                legend_entry(&legend, (4, y), &LegendEntry::from(s))?;
            }
        }
        Ok(())
    })
}

/// Lays `entries` out in rows no wider than `width`: each entry's left
/// end, row by row.
fn legend_rows(entries: &[LegendEntry], width: i32) -> Vec<Vec<(i32, &LegendEntry)>> {
    const GAP: i32 = 28;
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut x = 0;
    for e in entries {
        if x > 0 && x + e.width() > width {
            rows.push(std::mem::take(&mut row));
            x = 0;
        }
        row.push((x, e));
        x += e.width() + GAP;
    }
    rows.push(row);
    rows
}

/// Panels side by side, a shared legend (in rows) under them, and a note
/// under the legend.
pub fn side_by_side(
    panels: &[Panel],
    legend: &[LegendEntry],
    note: &str,
) -> Result<String, PlotError> {
    const LEFT: i32 = 24;
    let count = panels.len().max(1) as u32;
    let width = SIDE_PANEL_W * count;
    let rows = legend_rows(legend, width as i32 - 2 * LEFT);
    let legend_h = LEGEND_ROW_H as u32 * rows.len() as u32;
    let note = wrap(note, NOTE_PX, width as i32 - 2 * LEFT);
    let note_h = LINE_H as u32 * note.len() as u32;
    let height = SIDE_PANEL_H + 12 + legend_h + 4 + note_h + 12;
    render((width, height), |root| {
        let (top, bottom) = root.split_vertically(SIDE_PANEL_H);
        for (p, area) in panels
            .iter()
            .zip(top.split_evenly((1, panels.len().max(1))))
        {
            panel(&area, p)?;
        }
        for (r, row) in rows.iter().enumerate() {
            let y = 12 + LEGEND_ROW_H / 2 + LEGEND_ROW_H * r as i32;
            for (x, entry) in row {
                legend_entry(&bottom, (LEFT + x, y), entry)?;
            }
        }
        for (i, line) in note.iter().enumerate() {
            let y = 12 + legend_h as i32 + 4 + LINE_H * i as i32;
            drawn(
                bottom.draw(&Text::new(
                    line.clone(),
                    (LEFT, y),
                    font(NOTE_PX)
                        .color(&GREY)
                        .pos(Pos::new(HPos::Left, VPos::Top)),
                )),
            )?;
        }
        Ok(())
    })
}
