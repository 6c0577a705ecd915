//! `pinpoll-tune sweep` without a device: grid parsing and expansion,
//! medians, CSV, SVG and the recommendation on synthetic measurements, and
//! the command itself over a fake `pinpoll-perf` (a shell script).

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_contains, assert_text_fits, assert_well_formed, csv_fields, svg_labels, tune_command,
    Fixture, BOUND,
};
use pinpoll::{EngineConfig, IdlePolicy};
use pinpoll_testkit::{Finished, Running};
use pinpoll_tune::plot::{self, Dash, Series, XAxis, YScale};
use pinpoll_tune::sweep::csv;
use pinpoll_tune::sweep::grid::{self, Grid, Value};
use pinpoll_tune::sweep::measure::{self, median, Measurement, Outcome, Run, Workload};
use pinpoll_tune::sweep::recommend::{self, HostInfo};
use pinpoll_tune::sweep::{write_outputs, OutputInfo, Sweep};

// ---- grid ----------------------------------------------------------------

#[test]
fn grid_arguments_parse_and_expand_last_key_fastest() {
    let g =
        Grid::from_args(&["batch_size=1,16", "idle=spin,backoff", "signal_interval=4"]).unwrap();
    assert_eq!(g.keys(), ["batch_size", "idle", "signal_interval"]);
    assert_eq!(
        g.axes[1].1,
        [Value::Word("spin".into()), Value::Word("backoff".into())]
    );
    let points = g.points();
    assert_eq!(points.len(), 4);
    assert_eq!(
        points[0].label(),
        "batch_size=1 idle=spin signal_interval=4"
    );
    assert_eq!(
        points[1].label(),
        "batch_size=1 idle=backoff signal_interval=4"
    );
    assert_eq!(
        points[3].label(),
        "batch_size=16 idle=backoff signal_interval=4"
    );
    assert_eq!(points[3].index, 3);
    assert_eq!(points[2].get("batch_size"), Some(&Value::Int(16)));
    // Duplicate values collapse; an empty grid is the base profile alone.
    let g = Grid::from_args(&["batch_size=1,1,2"]).unwrap();
    assert_eq!(g.axes[0].1.len(), 2);
    let empty = Grid::from_args::<&str>(&[]).unwrap();
    assert_eq!(empty.points().len(), 1);
    assert_eq!(empty.points()[0].label(), "base");
}

#[test]
fn grid_errors_name_the_problem() {
    let e = Grid::from_args(&["batchsize=1"]).unwrap_err();
    assert_contains(&e, "\"batchsize\" cannot be swept");
    assert_contains(&e, "batch_size");
    assert_contains(
        &Grid::from_args(&["batch_size=1,x"]).unwrap_err(),
        "batch_size=x: not a whole number",
    );
    assert_contains(
        &Grid::from_args(&["batch_size"]).unwrap_err(),
        "give KEY=V1,V2",
    );
    assert_contains(
        &Grid::from_args(&["batch_size=1", "batch_size=2"]).unwrap_err(),
        "given twice",
    );
    assert_contains(
        &Grid::from_args(&["batch_size=1,"]).unwrap_err(),
        "empty value",
    );
}

#[test]
fn grid_files_take_arrays_and_scalars() {
    let g =
        Grid::from_toml("batch_size = [1, 16]\nidle = [\"spin\", \"backoff\"]\nslot_count = 64\n")
            .unwrap();
    assert_eq!(g.points().len(), 4);
    assert_eq!(
        g.axes.iter().find(|a| a.0 == "slot_count").unwrap().1,
        [Value::Int(64)]
    );
    assert!(Grid::from_toml("nope = [1]").is_err());
    assert!(Grid::from_toml("batch_size = [1.5]").is_err());
    let mut a = Grid::from_args(&["batch_size=1"]).unwrap();
    assert!(a
        .merge(Grid::from_toml("batch_size = [2]").unwrap())
        .is_err());
    a.merge(Grid::from_toml("signal_interval = [2]").unwrap())
        .unwrap();
    assert_eq!(a.keys(), ["batch_size", "signal_interval"]);
}

#[test]
fn point_configs_validate_and_skip_invalid_combinations() {
    let base = EngineConfig::load("softroce").unwrap();
    let g = Grid::from_args(&[
        "batch_size=1,120",
        "signal_interval=1,16",
        "inline_threshold=64,1024",
    ])
    .unwrap();
    let mut valid = 0;
    for p in g.points() {
        match grid::point_config(&base, &p, Some(512)) {
            Ok((table, cfg)) => {
                valid += 1;
                assert_eq!(
                    Value::Int(u64::from(cfg.batch_size)),
                    *p.get("batch_size").unwrap()
                );
                assert_eq!(cfg.qp.max_send_wr, 128, "the rest is the base profile's");
                assert_eq!(table["send_queue_depth"].as_integer(), Some(128));
            }
            Err(e) => {
                let inline_too_big = p.get("inline_threshold") == Some(&Value::Int(1024));
                let batch_too_big = p.get("batch_size") == Some(&Value::Int(120))
                    && p.get("signal_interval") == Some(&Value::Int(16));
                assert!(inline_too_big || batch_too_big, "{}: {e}", p.label());
                if batch_too_big && !inline_too_big {
                    assert_contains(&e, "signal_interval");
                }
                if inline_too_big && !batch_too_big {
                    assert_contains(&e, "at most 512 bytes");
                }
            }
        }
    }
    assert_eq!(valid, 3, "(1,1,64) (1,16,64) (120,1,64)");
    // Without a device limit, only the engine's relations count.
    let p = &Grid::from_args(&["inline_threshold=1024"])
        .unwrap()
        .points()[0];
    assert!(grid::point_config(&base, p, None).is_ok());
}

#[test]
fn deeper_queues_get_a_cq_to_match_and_spin_drops_backoff() {
    let base = EngineConfig::load("softroce").unwrap();
    let g = Grid::from_args(&["send_queue_depth=1024", "slot_count=1024", "idle=spin"]).unwrap();
    let (table, cfg) = grid::point_config(&base, &g.points()[0], None).unwrap();
    assert_eq!(cfg.qp.max_send_wr, 1024);
    assert_eq!(cfg.qp.cq_depth, 1024, "raised to max(sq, rq)");
    assert_eq!(cfg.idle, IdlePolicy::Spin);
    assert!(!table.contains_key("backoff_spins"));
    // A cq_depth the grid sets is kept, and checked.
    let g = Grid::from_args(&["send_queue_depth=1024", "cq_depth=512"]).unwrap();
    let e = grid::point_config(&base, &g.points()[0], None).unwrap_err();
    assert_contains(&e, "cq_depth");
}

// ---- measurements and medians -------------------------------------------

#[test]
fn medians_of_odd_and_even_counts() {
    assert_eq!(median(&mut vec![3.0, 1.0, 100.0]), Some(3.0));
    assert_eq!(median(&mut vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    assert_eq!(median(&mut vec![f64::NAN, 7.0]), Some(7.0));
    assert_eq!(median(&mut vec![]), None);
    assert_eq!(median(&mut vec![f64::NAN]), None);
}

const PERF_LAT_JSON: &str = r#"{
  "tool": "pinpoll-perf", "version": "0.1.0",
  "config": {"test": "write-lat", "device": "rxe0"},
  "results": [{
    "bytes": 64, "iterations": 1000, "warmup": 100, "inline": true,
    "latency": {"measure": "half_round_trip", "unit": "usec", "samples": 1000,
      "min": 16.448, "p50": 17.3275, "mean": 889.84, "p99": 6721.5355,
      "p99_9": 8626.1755, "p99_99": 28229.6315, "max": 28229.6315, "stdev": 1923.6},
    "work_requests": {"posted": 1101, "doorbells": 1101, "per_op": 1.0},
    "connection": {"send_depth": 128, "recv_depth": 8, "cq_depth": 256, "batch_size": 16,
      "signal_interval": 16, "inline_threshold": 512, "max_inline_data": 512,
      "slot_size": 64, "slot_count": 128, "hugepages": false}
  }]
}"#;

#[test]
fn perf_json_is_read() {
    let m = Measurement::from_perf_json(PERF_LAT_JSON).unwrap();
    assert_eq!(m.p50_us, Some(17.3275));
    assert_eq!(m.p99_us, Some(6721.5355));
    assert_eq!(m.mib_per_sec, None);
    assert_eq!(m.doorbells_per_op, Some(1.0));
    let c = m.connection.unwrap();
    assert_eq!((c.slot_size, c.recv_depth, c.signal_interval), (64, 8, 16));
    let bw = r#"{"results": [{"bytes": 4096, "bandwidth": {"seconds": 1.0, "gbps": 0.3, "mib_per_sec": 35.5, "mpps": 0.009}, "work_requests": {"per_op": 0.0625}}]}"#;
    let m = Measurement::from_perf_json(bw).unwrap();
    assert_eq!(m.mib_per_sec, Some(35.5));
    assert_eq!(m.p50_us, None);
    assert_contains(&Measurement::from_perf_json("oops").unwrap_err(), "no JSON");
    assert_contains(
        &Measurement::from_perf_json(r#"{"results": []}"#).unwrap_err(),
        "no results",
    );
    assert_contains(
        &Measurement::from_perf_json(r#"{"results": [{"bytes": 1}]}"#).unwrap_err(),
        "neither",
    );
}

fn lat(p50: f64, p99: f64) -> Measurement {
    Measurement {
        p50_us: Some(p50),
        p99_us: Some(p99),
        ..Measurement::default()
    }
}

fn bw(mib: f64) -> Measurement {
    Measurement {
        mib_per_sec: Some(mib),
        doorbells_per_op: Some(0.1),
        ..Measurement::default()
    }
}

fn run(w: Workload, point: usize, size: usize, repeat: u32, m: Measurement) -> Run {
    Run {
        workload: w,
        point,
        size,
        repeat,
        outcome: Outcome::Ok(m),
    }
}

/// Point 0: steady 10 us. Point 1: one lucky 5 us run among 20 us ones.
/// Point 2: invalid. Point 3: every run failed.
fn synthetic_latency() -> (Vec<Run>, Vec<(Workload, usize, String)>) {
    let w = Workload::WriteLat;
    let mut runs = Vec::new();
    for size in [8, 4096] {
        let k = if size == 8 { 1.0 } else { 2.0 };
        for (r, p50) in [(1, 10.0), (2, 10.2), (3, 9.9)] {
            runs.push(run(w, 0, size, r, lat(p50 * k, 40.0 * k)));
        }
        for (r, p50) in [(1, 5.0), (2, 20.0), (3, 21.0)] {
            runs.push(run(w, 1, size, r, lat(p50 * k, 30.0 * k)));
        }
        for r in 1..=3 {
            runs.push(Run {
                workload: w,
                point: 3,
                size,
                repeat: r,
                outcome: if r == 3 {
                    Outcome::TimedOut(2.0)
                } else {
                    Outcome::Failed("pinpoll-perf exited with 1: error: boom".into())
                },
            });
        }
    }
    (
        runs,
        vec![(w, 2, "signal_interval = 16 is out of range".into())],
    )
}

#[test]
fn summaries_take_medians_and_keep_failures_and_skips() {
    let (runs, invalid) = synthetic_latency();
    let s = measure::summarize(&runs, &[Workload::WriteLat], 4, &[8, 4096], &invalid);
    assert_eq!(s.len(), 8, "4 points x 2 sizes");
    let at = |p: usize, size: usize| s.iter().find(|x| x.point == p && x.size == size).unwrap();
    assert_eq!(at(0, 8).median.as_ref().unwrap().p50_us, Some(10.0));
    assert_eq!(
        at(1, 8).median.as_ref().unwrap().p50_us,
        Some(20.0),
        "not the lucky 5"
    );
    assert_eq!(at(1, 4096).median.as_ref().unwrap().p50_us, Some(40.0));
    assert_eq!(
        (at(0, 8).ok, at(0, 8).runs, at(0, 8).status()),
        (3, 3, "ok")
    );
    assert_eq!(at(2, 8).status(), "invalid");
    assert_contains(at(2, 8).error.as_deref().unwrap(), "signal_interval");
    assert_eq!(at(3, 8).status(), "failed");
    assert_contains(at(3, 8).error.as_deref().unwrap(), "killed after 2 s");
}

// ---- recommendation -------------------------------------------------------

#[test]
fn latency_recommendation_takes_the_best_median_not_a_lucky_run() {
    let (runs, invalid) = synthetic_latency();
    let s = measure::summarize(&runs, &[Workload::WriteLat], 4, &[8, 4096], &invalid);
    let c = recommend::recommend(Workload::WriteLat, &s, &[8, 4096]).unwrap();
    assert_eq!(c.point, 0);
    assert_eq!(
        c.ranking.iter().map(|r| r.0).collect::<Vec<_>>(),
        [0, 1],
        "failed and invalid points do not compete"
    );
    assert!((c.ranking[0].1 - 1.0).abs() < 1e-12);
    assert!((c.ranking[1].1 - 2.0).abs() < 1e-12);
    assert_eq!(c.best, [(8, 10.0), (4096, 20.0)]);
    assert_eq!(c.medians[1].1.p50_us, Some(20.0));
}

#[test]
fn latency_ties_are_broken_by_p99() {
    let w = Workload::SendLat;
    let runs = vec![
        run(w, 0, 8, 1, lat(10.0, 50.0)),
        run(w, 1, 8, 1, lat(10.05, 20.0)), // within 1%: a tie, better tail
        run(w, 2, 8, 1, lat(12.0, 11.0)),  // best tail, but 20% slower
    ];
    let s = measure::summarize(&runs, &[w], 3, &[8], &[]);
    assert_eq!(recommend::recommend(w, &s, &[8]).unwrap().point, 1);
}

#[test]
fn bandwidth_recommendation_maximizes_median_throughput_over_sizes() {
    let w = Workload::WriteBw;
    let mut runs = Vec::new();
    // Point 0: best at 64 B, poor at 64 KiB; point 1: good at both.
    for r in 1..=3 {
        runs.push(run(w, 0, 64, r, bw(12.0)));
        runs.push(run(w, 0, 65536, r, bw(100.0)));
        runs.push(run(w, 1, 64, r, bw(10.0)));
        runs.push(run(w, 1, 65536, r, bw(400.0)));
    }
    // Point 2 has a huge outlier once but is only measured at one size.
    runs.push(run(w, 2, 64, 1, bw(1000.0)));
    let s = measure::summarize(&runs, &[w], 3, &[64, 65536], &[]);
    let c = recommend::recommend(w, &s, &[64, 65536]).unwrap();
    assert_eq!(c.point, 1, "{:?}", c.ranking);
    assert_eq!(c.ranking.len(), 2, "incomplete points do not compete");
    assert!(recommend::recommend(Workload::ReadBw, &s, &[64]).is_none());
}

// ---- CSV --------------------------------------------------------------------

#[test]
fn csv_has_a_header_and_a_row_per_run_and_per_point() {
    let (runs, invalid) = synthetic_latency();
    let g = Grid::from_args(&["batch_size=1,16", "signal_interval=1,16"]).unwrap();
    let points = g.points();
    let text = csv::runs_csv(&g.keys(), &points, &runs).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + runs.len());
    let head = csv_fields(lines[0]);
    assert_eq!(
        &head[..7],
        [
            "workload",
            "size",
            "point",
            "batch_size",
            "signal_interval",
            "repeat",
            "status"
        ]
    );
    assert!(head.contains(&"p50_us".to_owned()) && head.contains(&"mib_per_sec".to_owned()));
    assert_eq!(head.last().unwrap(), "error");
    for l in &lines[1..] {
        assert_eq!(csv_fields(l).len(), head.len(), "{l}");
    }
    let first = csv_fields(lines[1]);
    assert_eq!(&first[..7], ["write-lat", "8", "1", "1", "1", "1", "ok"]);
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    assert_eq!(first[col("p50_us")], "10");
    let failed = lines.iter().find(|l| l.contains("failed")).unwrap();
    assert_eq!(
        csv_fields(failed)[col("error")],
        "pinpoll-perf exited with 1: error: boom"
    );

    let s = measure::summarize(&runs, &[Workload::WriteLat], 4, &[8, 4096], &invalid);
    let text = csv::medians_csv(&g.keys(), &points, &s, &|x| x.point == 0).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + 8);
    let head = csv_fields(lines[0]);
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    let p1 = csv_fields(
        lines
            .iter()
            .find(|l| l.starts_with("write-lat,8,2,"))
            .unwrap(),
    );
    assert_eq!(p1[col("p50_us")], "20");
    assert_eq!(p1[col("ok_runs")], "3");
    let p0 = csv_fields(lines[1]);
    assert_eq!(p0[col("recommended")], "yes");
    let skipped = lines.iter().find(|l| l.contains(",invalid,")).unwrap();
    assert_contains(skipped, "out of range");
}

#[test]
fn csv_fields_are_quoted_when_needed() {
    let g = Grid::from_args(&["batch_size=1"]).unwrap();
    let failed = |repeat: u32, error: &str| Run {
        workload: Workload::WriteLat,
        point: 0,
        size: 8,
        repeat,
        outcome: Outcome::Failed(error.into()),
    };
    let runs = [
        failed(1, "plain"),
        failed(2, "a,b"),
        failed(3, "say \"hi\""),
    ];
    let text = csv::runs_csv(&g.keys(), &g.points(), &runs).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].ends_with(",plain"), "{}", lines[1]);
    assert!(lines[2].ends_with(",\"a,b\""), "{}", lines[2]);
    assert!(lines[3].ends_with(",\"say \"\"hi\"\"\""), "{}", lines[3]);
    assert_eq!(
        csv_fields("x,\"a,b\",\"say \"\"hi\"\"\",").as_slice(),
        ["x", "a,b", "say \"hi\"", ""]
    );
    for (line, error) in lines[1..].iter().zip(["plain", "a,b", "say \"hi\""]) {
        assert_eq!(csv_fields(line).last().unwrap(), error);
    }
}

// ---- SVG --------------------------------------------------------------------

#[test]
fn svg_charts_are_well_formed_with_a_line_per_series() {
    let (runs, invalid) = synthetic_latency();
    let g = Grid::from_args(&["batch_size=1,16", "signal_interval=1,16"]).unwrap();
    let points = g.points();
    let s = measure::summarize(&runs, &[Workload::WriteLat], 4, &[8, 4096], &invalid);
    let panels = plot::sweep::workload_panels(Workload::WriteLat, &g, &points, &s, &[8, 4096]);
    assert_eq!(panels.len(), 2, "one panel per swept key");
    assert_eq!(panels[0].x_label, "batch_size");
    assert_eq!(
        panels[0].x,
        XAxis::Categories(vec!["1".into(), "16".into()])
    );
    let names: Vec<&str> = panels[0].series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["p50 8 B", "p99 8 B", "p50 4096 B", "p99 4096 B"]);
    // batch_size=1: best of points 0 and 1 -> point 0 (p50 10); batch_size=16:
    // point 2 invalid, point 3 failed -> a gap.
    assert_eq!(panels[0].series[0].points, [(0, 10.0)]);
    assert_eq!(panels[1].series[0].points, [(0, 10.0), (1, 20.0)]);

    let text = plot::stacked("write-lat <&> test", "sub", &panels).unwrap();
    assert_well_formed(&text);
    assert_text_fits(&text);
    let labels = svg_labels(&text);
    // A legend line per series of each panel, 8 in all, and a marker per
    // point drawn.
    for n in names {
        assert_eq!(labels.iter().filter(|l| *l == n).count(), 2, "{n}");
    }
    let drawn: usize = panels
        .iter()
        .flat_map(|p| &p.series)
        .map(|s| s.points.len())
        .sum();
    assert_eq!(text.matches("<circle").count(), drawn);
    assert!(
        labels.contains(&"write-lat &lt;&amp;&gt; test".to_owned()),
        "{labels:?}"
    );
    assert!(labels.contains(&"batch_size".to_owned()));
    assert!(labels.contains(&"signal_interval".to_owned()));
}

#[test]
fn tails_far_above_the_median_get_a_log_axis() {
    let panel = plot::Panel {
        caption: String::new(),
        x_label: "k".into(),
        x: XAxis::Categories(vec!["a".into(), "b".into()]),
        y_label: "latency".into(),
        y_scale: YScale::Auto,
        series: vec![Series {
            name: "s".into(),
            colour: 0,
            dash: Dash::Solid,
            points: vec![(0, 10.0), (1, 9000.0)],
        }],
    };
    let text = plot::stacked("t", "", std::slice::from_ref(&panel)).unwrap();
    assert_well_formed(&text);
    assert_contains(&text, "(log scale)");
    assert!(svg_labels(&text).contains(&"10000".to_owned()));
    let mut linear = panel;
    linear.series[0].points = vec![(0, 10.0), (1, 30.0)];
    assert!(!plot::stacked("t", "", &[linear])
        .unwrap()
        .contains("log scale"));
    assert_eq!(plot::ticks(0.0, 31.5), [0.0, 10.0, 20.0, 30.0, 40.0]);
}

// ---- the whole sweep, with a fake runner ----------------------------------

#[test]
fn a_sweep_with_a_fake_runner_writes_every_file_and_a_loadable_profile() {
    let fx = Fixture::empty("sweep-fake");
    let g = Grid::from_args(&["batch_size=1,16,200", "signal_interval=1,16"]).unwrap();
    let softroce = EngineConfig::load("softroce").unwrap();
    let base = |_: Workload| ("softroce".to_owned(), softroce.clone());
    let sweep = Sweep::plan(
        &[Workload::WriteLat, Workload::WriteBw],
        &[8, 4096],
        g,
        3,
        &base,
        Some(512),
        &fx.path().join("points"),
    )
    .unwrap();
    // batch_size=200 exceeds the 128-deep send queue: 2 of 6 points skipped.
    assert_eq!(sweep.invalid().len(), 2 * 2);
    let jobs = sweep.jobs();
    assert_eq!(jobs.len(), 2 * 4 * 2 * 3);
    assert!(
        jobs[..16].iter().all(|j| j.repeat == 1),
        "repeats outermost"
    );
    // Latency: best with batch_size=1, signal_interval=16; bandwidth: best
    // with batch_size=16, signal_interval=16.
    let mut fake = |j: &pinpoll_tune::sweep::Job| {
        let text = std::fs::read_to_string(&j.profile).unwrap();
        let cfg = EngineConfig::from_toml(&text).unwrap();
        let noise = if j.repeat == 2 { 0.5 } else { 1.0 };
        Outcome::Ok(if j.workload.is_latency() {
            let p50 =
                10.0 + f64::from(cfg.batch_size) / 4.0 + 16.0 / f64::from(cfg.signal_interval);
            lat(p50 * noise, p50 * 3.0)
        } else {
            bw(f64::from(cfg.batch_size * cfg.signal_interval) * j.size as f64 / 1000.0 * noise)
        })
    };
    let mut seen = 0;
    let runs = sweep.run(&mut fake, &mut |_, _| seen += 1);
    assert_eq!(seen, jobs.len());
    let summaries = sweep.summarize(&runs);
    let choices = sweep.recommend(&summaries);
    assert_eq!(choices.len(), 2);
    assert_eq!(
        sweep.points[choices[0].point].label(),
        "batch_size=1 signal_interval=16"
    );
    assert_eq!(
        sweep.points[choices[1].point].label(),
        "batch_size=16 signal_interval=16"
    );
    let host = HostInfo {
        hostname: "testhost".into(),
        kernel: "6.1.0".into(),
        cpus: 2,
        device: "rxe0".into(),
        device_facts: vec!["rxe0: SoftRoCE (rxe) over rxenet0".into()],
    };
    let out = fx.path().join("out");
    let written = write_outputs(
        &out,
        &sweep,
        &runs,
        &summaries,
        &choices,
        &OutputInfo {
            host: &host,
            iterations: Some(200),
            mode: "direct",
            date: "2026-01-01",
        },
    )
    .unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "runs.csv",
            "medians.csv",
            "write-lat.svg",
            "write-bw.svg",
            "recommended-write-lat.toml",
            "recommended.toml",
            "recommended-write-bw.toml"
        ]
    );
    check_outputs(&out, 4, 2, 3);
    let rec = std::fs::read_to_string(out.join("recommended.toml")).unwrap();
    assert_contains(&rec, "# recommended (write-lat): measured by `pinpoll-tune sweep` on testhost, device rxe0, 2026-01-01.");
    assert_contains(&rec, "# Device: rxe0: SoftRoCE (rxe) over rxenet0");
    assert_contains(&rec, "# Chosen: batch_size=1 signal_interval=16");
    assert_contains(&rec, "signal_interval = 16");
    assert_contains(&rec, "# swept over 1, 16, 200: measured best");
    let cfg = EngineConfig::load(out.join("recommended.toml").to_str().unwrap()).unwrap();
    assert_eq!((cfg.batch_size, cfg.signal_interval), (1, 16));
    assert_eq!(
        cfg.qp.max_send_wr, softroce.qp.max_send_wr,
        "the rest from the base"
    );
    assert_eq!(cfg.idle, softroce.idle);
    let bwcfg =
        EngineConfig::load(out.join("recommended-write-bw.toml").to_str().unwrap()).unwrap();
    assert_eq!((bwcfg.batch_size, bwcfg.signal_interval), (16, 16));
}

/// The files of a finished sweep, checked as the device test checks them:
/// `points` valid points per workload, `sizes` sizes, `repeat` repeats.
fn check_outputs(out: &Path, points: usize, sizes: usize, repeat: usize) {
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let lines: Vec<&str> = runs.lines().collect();
    assert!(lines[0].starts_with("workload,size,point,"));
    assert_eq!(lines.len() - 1, 2 * points * sizes * repeat, "{runs}");
    let status = csv_fields(lines[0])
        .iter()
        .position(|h| h == "status")
        .unwrap();
    for l in &lines[1..] {
        assert_eq!(csv_fields(l)[status], "ok", "{l}");
    }
    for w in ["write-lat", "write-bw"] {
        let svg = std::fs::read_to_string(out.join(format!("{w}.svg"))).unwrap();
        assert_well_formed(&svg);
        assert!(svg.contains("<polyline"));
    }
}

// ---- the command, over a fake pinpoll-perf --------------------------------

/// `pinpoll-tune args`, with no device from the environment.
fn tune(args: &[&str]) -> Finished {
    let mut cmd = tune_command(args);
    cmd.env_remove("PINPOLL_DEVICE");
    Running::spawn(cmd).finish_within(BOUND)
}

/// A `pinpoll-perf` stand-in: prints a latency or bandwidth document
/// whose p50 is 10 + the -Q it was given (bandwidth: 100 x the profile's
/// signal_interval MiB/s); `sleep` for -s 999 (to test the
/// timeout), fails for -s 13.
fn fake_perf(fx: &Fixture) -> PathBuf {
    let path = fx.path().join("fake-perf");
    std::fs::write(
        &path,
        r#"#!/bin/sh
workload=$1; shift
q=; s=0
while [ $# -gt 0 ]; do
  case $1 in -Q) q=$2; shift;; -s) s=$2; shift;; --profile) p=$2; shift;; esac
  shift
done
[ -n "$q" ] || q=$(sed -n 's/^signal_interval = //p' "$p")
[ "$s" = 999 ] && exec sleep 30
[ "$s" = 13 ] && { echo "error: the fake fails at 13 bytes" >&2; exit 1; }
case $workload in
  *-lat) echo "{\"results\": [{\"bytes\": $s, \"latency\": {\"min\": 1, \"p50\": $((10 + q)), \"mean\": 20, \"p99\": 50, \"p99_9\": 60, \"max\": 70}, \"work_requests\": {\"per_op\": 1.0}, \"connection\": {\"batch_size\": 1, \"signal_interval\": $q, \"slot_size\": 64}}]}";;
  *) echo "{\"results\": [{\"bytes\": $s, \"bandwidth\": {\"seconds\": 1, \"gbps\": 1, \"mib_per_sec\": $((100 * q)), \"mpps\": 1}, \"work_requests\": {\"per_op\": 0.1}}]}";;
esac
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn the_command_runs_a_fake_perf_end_to_end() {
    let fx = Fixture::empty("sweep-cli");
    let perf = fake_perf(&fx);
    let out = fx.path().join("out");
    let o = tune(&[
        "sweep",
        "--perf",
        perf.to_str().unwrap(),
        "--workloads",
        "write-lat,write-bw",
        "--sizes",
        "8,64",
        "--grid",
        "signal_interval=1,8,200",
        "--repeat",
        "2",
        "--base-profile",
        "softroce",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = o.stdout.as_str();
    let stderr = o.stderr.as_str();
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert_contains(stderr, "skipped: write-lat point 3 (signal_interval=200)");
    assert_contains(
        stderr,
        "[1/16] write-lat 8 B point 1 (signal_interval=1) repeat 1: p50 11.00 us",
    );
    assert_contains(stdout, "write-lat: recommended signal_interval=1");
    assert_contains(stdout, "write-bw: recommended signal_interval=8");
    check_outputs(&out, 2, 2, 2);
    let cfg = EngineConfig::load(out.join("recommended.toml").to_str().unwrap()).unwrap();
    assert_eq!(cfg.signal_interval, 1);
}

#[test]
fn failed_and_hung_runs_are_recorded_not_fatal() {
    let fx = Fixture::empty("sweep-fail");
    let perf = fake_perf(&fx);
    let out = fx.path().join("out");
    // The fake hangs at 999 bytes: the sweep's own --timeout must kill it
    // (recorded below); a sweep that hung instead fails in `tune`. The
    // bound leaves the failing run (a shell script) time to start and fail
    // on a loaded TCG guest, where 0.5 s was not always enough.
    let o = tune(&[
        "sweep",
        "--perf",
        perf.to_str().unwrap(),
        "--workloads",
        "write-lat",
        "--sizes",
        "8,13,999",
        "--grid",
        "signal_interval=1",
        "--repeat",
        "1",
        "--timeout",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "no point measured at every size");
    let stdout = o.stdout.as_str();
    assert_contains(stdout, "write-lat: no point measured at every size");
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert_contains(&runs, "write-lat,8,1,1,1,ok,");
    assert_contains(&runs, "failed");
    assert_contains(&runs, "error: the fake fails at 13 bytes");
    assert_contains(&runs, ",timeout,");
    assert_contains(&runs, "killed after 5 s");
    assert!(!out.join("recommended.toml").exists());
}

#[test]
fn dry_run_lists_points_and_a_missing_perf_is_a_clear_error() {
    let fx = Fixture::empty("sweep-dry");
    let out = fx.path().join("out");
    let o = tune(&[
        "sweep",
        "--dry-run",
        "--grid",
        "batch_size=1,120",
        "signal_interval=1,16",
        "--base-profile",
        "softroce",
        "--workloads",
        "send-lat",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = o.stdout.as_str();
    assert!(o.status.success(), "{stdout}");
    assert_contains(stdout, "send-lat (base profile softroce):");
    assert_contains(stdout, "batch_size=120 signal_interval=16");
    assert_contains(stdout, "invalid: signal_interval = 16 is out of range");
    assert_contains(stdout, "18 runs: 3 valid points x 2 sizes x 3 repeats");

    let o = tune(&[
        "sweep",
        "--perf",
        "/nonexistent/pinpoll-perf",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert_contains(o.stderr.as_str(), "cargo build -p pinpoll-perf");

    let o = tune(&["sweep", "--grid", "nope=1", "--dry-run"]);
    assert_eq!(o.status.code(), Some(2));
    assert_contains(o.stderr.as_str(), "\"nope\" cannot be swept");
    let o = tune(&["sweep", "--workloads", "write-latency", "--dry-run"]);
    assert_eq!(o.status.code(), Some(2));
    assert_contains(o.stderr.as_str(), "is not a workload");
}
