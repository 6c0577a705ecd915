//! The plot module and `pinpoll-tune plot`: axes and their ticks, the
//! benchmark comparison from a compare-perftest summary.json (every field
//! it needs, and an error naming the one that is missing), and the layout
//! of the SVG (text on the canvas, no text over another).

mod common;

use common::{
    assert_contains, assert_text_fits, assert_well_formed, svg_labels, svg_texts, tune, Fixture,
};
use pinpoll_tune::plot::benchmarks::{ComparisonSummary, SummaryError};
use pinpoll_tune::plot::scale::{self, tick_label};
use pinpoll_tune::plot::{self, Dash, Panel, Series, XAxis, YScale};
use serde_json::{json, Value};

// ---- scales -------------------------------------------------------------------

fn labels(axis: &scale::Axis) -> Vec<&str> {
    axis.ticks.iter().map(|(_, l)| l.as_str()).collect()
}

#[test]
fn log_axes_run_from_the_1_2_5_value_below_to_the_one_above() {
    let y = scale::y_axis(&[12.2, 92.7, 1514.0], YScale::Log);
    assert_eq!(
        labels(&y),
        ["10", "20", "50", "100", "200", "500", "1000", "2000"]
    );
    assert!(y.minor.is_empty());
    assert_eq!((y.lo, y.hi), (1.0, 2000f64.log10()));
    let bw = scale::y_axis(&[0.0221, 0.35, 0.0], YScale::Log);
    assert_eq!(labels(&bw), ["0.02", "0.05", "0.1", "0.2", "0.5"]);
    // One value: still a range, up to the next 1-2-5 value.
    assert_eq!(labels(&scale::y_axis(&[10.0], YScale::Log)), ["10", "20"]);
}

#[test]
fn log_axes_over_many_decades_label_only_the_decades() {
    let y = scale::y_axis(&[0.5, 12.0, 40000.0], YScale::Auto);
    assert_eq!(labels(&y), ["1", "10", "100", "1000", "10000"]);
    assert_eq!((y.lo, y.hi), (0.5f64.log10(), 50000f64.log10()));
    let minor: Vec<String> = y.minor.iter().map(|p| tick_label(10f64.powf(*p))).collect();
    assert_eq!(minor.first().map(String::as_str), Some("0.5"));
    assert_eq!(minor.last().map(String::as_str), Some("50000"));
    assert_eq!(minor.len(), 1 + 2 * 5);
}

#[test]
fn linear_axes_start_at_zero_and_end_on_a_round_tick() {
    let y = scale::y_axis(&[10.0, 30.0, f64::NAN], YScale::Auto);
    assert!(!y.is_log());
    assert_eq!(labels(&y), ["0", "10", "20", "30", "40"]);
    let empty = scale::y_axis(&[], YScale::Log);
    assert!(!empty.is_log(), "nothing positive to put on a log axis");
    assert_eq!(labels(&empty), ["0", "0.2", "0.4", "0.6", "0.8", "1"]);
}

#[test]
fn size_axes_are_log2_with_room_past_the_first_and_last_size() {
    let x = scale::x_axis(&XAxis::Bytes(vec![8, 64, 1024, 65536, 1 << 20]));
    assert_eq!(labels(&x), ["8", "64", "1K", "64K", "1M"]);
    assert_eq!(x.ticks[2].0, 10.0);
    assert!(x.lo < 3.0 && x.hi > 20.0);
    assert_eq!(scale::size_label(1536), "1536");
    assert_eq!(scale::size_label(3 << 10), "3K");
    let c = scale::x_axis(&XAxis::Categories(vec!["spin".into(), "backoff".into()]));
    assert_eq!(labels(&c), ["spin", "backoff"]);
    assert!(c.lo < 0.0 && c.hi > 1.0);
}

#[test]
fn tick_labels_are_the_shortest_decimal() {
    assert_eq!(tick_label(0.1 + 0.2), "0.3");
    assert_eq!(tick_label(2000.0), "2000");
    assert_eq!(tick_label(0.05), "0.05");
    assert_eq!(tick_label(-0.0), "0");
    assert_eq!(tick_label(10f64.powf(200f64.log10())), "200");
}

// ---- the benchmark comparison ---------------------------------------------------

/// A summary as compare_table.py writes it (with its other fields too):
/// latency at 8 B..64 KiB, bandwidth at 64 B..1 MiB. perftest's p99.9 at
/// 4 KiB is null (not measured).
fn summary() -> Value {
    let lat = |bytes: u64, base: f64| {
        json!({
            "bytes": bytes,
            "pinpoll": {"p50": base, "p99": base * 2.5, "p99_9": base * 9.0},
            "perftest": {"p50": base * 1.03, "p99": base * 3.0,
                         "p99_9": if bytes == 4096 { Value::Null } else { json!(base * 11.0) }},
        })
    };
    let bw = |bytes: u64, pinpoll: f64, perftest: f64| json!({"bytes": bytes, "pinpoll": pinpoll, "perftest": perftest});
    json!({
        "rounds": 3,
        "elapsed_seconds": 900,
        "rows": [],
        "sweep": {
            "write_lat": [lat(8, 12.2), lat(64, 12.8), lat(256, 16.2), lat(1024, 25.8),
                          lat(4096, 94.0), lat(16384, 372.0), lat(65536, 1504.0)],
            "write_bw": [bw(64, 0.030, 0.0221), bw(1024, 0.259, 0.22), bw(4096, 0.325, 0.31),
                         bw(65536, 0.317, 0.34), bw(262144, 0.329, 0.34), bw(1048576, 0.348, 0.35)],
        },
        "runs": {},
        "errors": [],
    })
}

fn parse(v: &Value) -> Result<ComparisonSummary, SummaryError> {
    ComparisonSummary::from_json(&v.to_string())
}

#[test]
fn a_summary_is_read_with_null_figures_as_gaps() {
    let s = parse(&summary()).unwrap();
    assert_eq!(s.rounds, 3);
    assert_eq!(s.write_lat.len(), 7);
    assert_eq!(s.write_lat[4].bytes, 4096);
    assert_eq!(s.write_lat[4].perftest.p99_9, None);
    assert_eq!(s.write_lat[0].pinpoll.p50, Some(12.2));
    assert_eq!(s.write_bw[5].perftest, Some(0.35));
    let lat = s.latency_panel();
    assert_eq!(lat.series.len(), 6, "3 percentiles x 2 tools");
    let gap = lat
        .series
        .iter()
        .find(|s| s.name == "perftest p99.9")
        .unwrap();
    assert_eq!(gap.dash, Dash::Dotted);
    assert_eq!(gap.points.len(), 6);
    assert!(gap.points.iter().all(|(i, _)| *i != 4));
    assert_eq!(s.bandwidth_panel().series[0].points[1], (1, 0.259));
}

#[test]
fn the_comparison_chart_names_every_series_axis_and_tick() {
    let s = parse(&summary()).unwrap();
    let svg = s.chart().unwrap();
    assert_well_formed(&svg);
    let labels = svg_labels(&svg);
    let has = |l: &str| assert!(labels.iter().any(|x| x == l), "{l:?} in {labels:?}");
    for l in [
        "RDMA WRITE latency (½ round trip)",
        "RDMA WRITE bandwidth",
        "latency, µs (log scale)",
        "bandwidth, Gb/s (log scale)",
        "pinpoll-perf (direct mode, loopback)",
        "perftest (ib_write_lat / ib_write_bw)",
        "p50",
        "p99",
        "p99.9",
        "medians of 3 interleaved rounds; rxe (SoftRoCE) in a TCG guest",
    ] {
        has(l);
    }
    assert_eq!(
        labels
            .iter()
            .filter(|l| *l == "message size (bytes)")
            .count(),
        2
    );
    // p99.9 reaches 16544 us: latency spans four decades, labelled at
    // each; bandwidth gets every 1-2-5 value.
    for tick in [
        "8", "256", "16K", "1K", "4K", "64K", "256K", "1M", "10", "10000", "0.02", "0.05", "0.5",
    ] {
        has(tick);
    }
    // A marker for every figure that is not null: 7 x 6 - 1 + 6 x 2.
    assert_eq!(svg.matches("<circle").count(), 7 * 6 - 1 + 6 * 2);
}

#[test]
fn the_comparison_chart_has_no_text_cut_off_or_over_another() {
    let svg = parse(&summary()).unwrap().chart().unwrap();
    assert_text_fits(&svg);
    // The legend lies below both x axis titles.
    let texts = svg_texts(&svg);
    let lowest_title = texts
        .iter()
        .filter(|t| t.text == "message size (bytes)")
        .map(|t| t.bounds().3)
        .fold(f64::MIN, f64::max);
    let legend = texts.iter().find(|t| t.text == "p99.9").unwrap();
    assert!(legend.bounds().1 > lowest_title, "{legend:?}");
}

#[test]
fn a_summary_missing_a_field_is_an_error_naming_it() {
    type Remove = fn(&mut Value);
    let cases: [(&str, Remove); 6] = [
        ("sweep.write_lat[1].perftest.p99", |v| {
            v["sweep"]["write_lat"][1]["perftest"]
                .as_object_mut()
                .unwrap()
                .remove("p99");
        }),
        ("sweep.write_bw[3].bytes", |v| {
            v["sweep"]["write_bw"][3]
                .as_object_mut()
                .unwrap()
                .remove("bytes");
        }),
        ("rounds", |v| {
            v.as_object_mut().unwrap().remove("rounds");
        }),
        ("sweep", |v| {
            v.as_object_mut().unwrap().remove("sweep");
        }),
        ("sweep.write_bw", |v| {
            v["sweep"].as_object_mut().unwrap().remove("write_bw");
        }),
        ("sweep.write_lat[0].pinpoll", |v| {
            v["sweep"]["write_lat"][0]
                .as_object_mut()
                .unwrap()
                .remove("pinpoll");
        }),
    ];
    for (field, remove) in cases {
        let mut v = summary();
        remove(&mut v);
        let e = parse(&v).unwrap_err();
        assert!(
            matches!(&e, SummaryError::Missing { field: f } if f == field),
            "{field}: {e:?}"
        );
        assert_eq!(e.to_string(), format!("field `{field}` is missing"));
    }
}

#[test]
fn a_summary_with_a_wrong_field_or_no_data_is_an_error_naming_it() {
    let mut v = summary();
    v["rounds"] = json!("three");
    assert_eq!(
        parse(&v).unwrap_err().to_string(),
        "field `rounds` should be a positive integer, found \"three\""
    );
    let mut v = summary();
    v["sweep"]["write_bw"][2]["pinpoll"] = json!(-1.0);
    assert_contains(
        &parse(&v).unwrap_err().to_string(),
        "field `sweep.write_bw[2].pinpoll` should be a non-negative number or null, found -1.0",
    );
    let mut v = summary();
    v["sweep"]["write_lat"] = json!({});
    assert_contains(
        &parse(&v).unwrap_err().to_string(),
        "field `sweep.write_lat` should be a list",
    );
    let mut v = summary();
    v["sweep"]["write_lat"] = json!([]);
    assert_eq!(
        parse(&v).unwrap_err().to_string(),
        "field `sweep.write_lat` has no measured point: run scripts/compare-perftest.sh --sweep"
    );
    let mut v = summary();
    for p in v["sweep"]["write_bw"].as_array_mut().unwrap() {
        p["pinpoll"] = Value::Null;
        p["perftest"] = Value::Null;
    }
    assert_contains(
        &parse(&v).unwrap_err().to_string(),
        "field `sweep.write_bw` has no measured point",
    );
    let mut v = summary();
    v["sweep"]["write_lat"][0]["bytes"] = json!("µ".repeat(100));
    assert_eq!(
        parse(&v).unwrap_err().to_string(),
        format!(
            "field `sweep.write_lat[0].bytes` should be a positive integer, found \"{}...",
            "µ".repeat(39)
        )
    );
    assert_eq!(
        parse(&json!([1, 2])).unwrap_err().to_string(),
        "the summary should be a JSON object, found [1,2]"
    );
    assert_contains(
        &ComparisonSummary::from_json("{\"rounds\": 3,")
            .unwrap_err()
            .to_string(),
        "not JSON: EOF while parsing",
    );
}

// ---- stacked panels ----------------------------------------------------------------

#[test]
fn stacked_panels_wrap_a_long_subtitle_and_keep_text_apart() {
    let panel = |key: &str| Panel {
        caption: String::new(),
        x_label: key.into(),
        x: XAxis::Categories(vec!["spin".into(), "backoff".into(), "sleep".into()]),
        y_label: "latency [µs]".into(),
        y_scale: YScale::Auto,
        series: (0..6)
            .map(|k| Series {
                name: format!("p{} {} B", if k % 2 == 0 { 50 } else { 99 }, 8 << k),
                colour: k / 2,
                dash: if k % 2 == 0 {
                    Dash::Solid
                } else {
                    Dash::Dashed
                },
                points: vec![(0, 10.0 + k as f64), (2, 3000.0 * (k + 1) as f64)],
            })
            .collect(),
    };
    let subtitle = "base profile /a/rather/deep/directory/of/profiles/tuned.toml; medians of \
                    3 runs per point; each point: the best grid point with that value (lowest p50)";
    let svg = plot::stacked("title", subtitle, &[panel("idle"), panel("batch_size")]).unwrap();
    assert_well_formed(&svg);
    assert_text_fits(&svg);
    let labels = svg_labels(&svg);
    let lines: Vec<&String> = labels.iter().filter(|l| subtitle.contains(*l)).collect();
    assert!(lines.len() >= 2, "wrapped: {lines:?}");
    let joined: Vec<&str> = lines.iter().map(|l| l.as_str()).collect();
    assert_eq!(joined.join(" "), subtitle);
    assert_eq!(labels.iter().filter(|l| *l == "p99 256 B").count(), 2);
    assert_eq!(svg.matches("<circle").count(), 2 * 6 * 2);
}

#[test]
fn a_panel_is_as_tall_as_its_legend() {
    let panel = Panel {
        caption: String::new(),
        x_label: "batch_size".into(),
        x: XAxis::Categories(vec!["1".into(), "16".into()]),
        y_label: "bandwidth [MiB/s]".into(),
        y_scale: YScale::Auto,
        series: (0..20)
            .map(|k| Series {
                name: format!("MiB/s {} B", 1 << k),
                colour: k,
                dash: Dash::Solid,
                points: vec![(0, k as f64), (1, 2.0 * k as f64)],
            })
            .collect(),
    };
    let svg = plot::stacked("t", "s", &[panel.clone(), panel]).unwrap();
    assert_well_formed(&svg);
    assert_text_fits(&svg);
    assert_eq!(
        svg_labels(&svg)
            .iter()
            .filter(|l| *l == "MiB/s 524288 B")
            .count(),
        2
    );
}

// ---- the command ----------------------------------------------------------------------

#[test]
fn the_plot_command_writes_the_svg_beside_the_summary_or_where_told() {
    let fx = Fixture::empty("plot-cli");
    let input = fx.path().join("summary.json");
    std::fs::write(&input, summary().to_string()).unwrap();
    let o = tune(&["plot", input.to_str().unwrap()]);
    assert!(o.status.success(), "{}", o.stderr.as_str());
    let beside = fx.path().join("benchmarks.svg");
    assert_contains(o.stdout.as_str(), &format!("wrote {}", beside.display()));
    let svg = std::fs::read_to_string(&beside).unwrap();
    assert_eq!(svg, parse(&summary()).unwrap().chart().unwrap());
    let out = fx.path().join("elsewhere.svg");
    let o = tune(&["plot", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", o.stderr.as_str());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), svg);
}

#[test]
fn the_plot_command_names_a_missing_file_or_field() {
    let fx = Fixture::empty("plot-cli-bad");
    let absent = fx.path().join("absent.json");
    let o = tune(&["plot", absent.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let stderr = o.stderr.as_str();
    assert_contains(stderr, &format!("error: cannot read {}", absent.display()));
    assert_contains(stderr, "No such file or directory");

    let mut v = summary();
    v["sweep"]["write_lat"][2]["pinpoll"]
        .as_object_mut()
        .unwrap()
        .remove("p99_9");
    let input = fx.path().join("summary.json");
    std::fs::write(&input, v.to_string()).unwrap();
    let o = tune(&["plot", input.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let stderr = o.stderr.as_str();
    assert_contains(
        stderr,
        &format!(
            "error: {}: field `sweep.write_lat[2].pinpoll.p99_9` is missing",
            input.display()
        ),
    );
    assert!(!fx.path().join("benchmarks.svg").exists());

    let help = tune(&["plot", "--help"]);
    let text = help.stdout.as_str();
    assert_contains(text, "Usage: pinpoll-tune plot [OPTIONS] <SUMMARY.json>");
    assert_contains(text, "-o, --out <OUT.svg>");
    assert_contains(text, "sweep.write_lat[].{bytes, pinpoll, perftest}");
}
