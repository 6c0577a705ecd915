//! The report as a table (people) or JSON (scripts).

use serde_json::{json, Value};

use super::{CoresFrom, Inputs, Report, Status};
use crate::cpulist;
use crate::facts::Source;

pub fn header(inputs: &Inputs<'_>) -> String {
    let cores = match inputs.cores_from {
        CoresFrom::None => "no worker cores chosen".to_owned(),
        CoresFrom::Flag => format!("worker cores {} (--cores)", cpulist::format(&inputs.cores)),
        CoresFrom::Profile => format!("worker core {} (profile)", cpulist::format(&inputs.cores)),
    };
    let source = match inputs.inventory.source {
        Source::Verbs => "device facts from verbs",
        Source::Sysfs => "device facts from sysfs only (no verbs queries)",
    };
    let root = if inputs.root.is_host() {
        String::new()
    } else {
        format!(", root {}", inputs.root.dir().display())
    };
    format!(
        "pinpoll-tune doctor: {}, {cores}, {source}{root}",
        inputs.profile_label()
    )
}

pub fn table(report: &Report) -> String {
    let label = |f: &super::Finding| match &f.subject {
        Some(s) => format!("{} {s}", f.check),
        None => f.check.to_owned(),
    };
    let width = report
        .findings
        .iter()
        .map(|f| label(f).len())
        .max()
        .unwrap_or(5)
        .max("CHECK".len());
    let mut out = String::new();
    out.push_str(&report.header);
    out.push_str("\n\n");
    out.push_str(&format!("{:<width$}  {:<6}  FINDING\n", "CHECK", "STATUS"));
    for f in &report.findings {
        out.push_str(&format!(
            "{:<width$}  {:<6}  {}\n",
            label(f),
            f.status.as_str(),
            f.finding
        ));
        if let Some(fix) = &f.fix {
            out.push_str(&format!("{:<width$}  {:<6}  fix: {fix}\n", "", ""));
        }
    }
    out.push_str(&format!(
        "\n{} ok, {} warn, {} fail: {}\n",
        report.count(Status::Ok),
        report.count(Status::Warn),
        report.count(Status::Fail),
        match report.status() {
            Status::Fail => "pinpoll will not run as configured (exit status 1)",
            Status::Warn => "pinpoll runs; the warnings cost latency or predictability",
            Status::Ok => "ready",
        }
    ));
    out
}

pub fn json(report: &Report) -> Value {
    let checks: Vec<Value> = report
        .findings
        .iter()
        .map(|f| {
            json!({
                "check": f.check,
                "subject": f.subject,
                "status": f.status.as_str(),
                "finding": f.finding,
                "fix": f.fix,
            })
        })
        .collect();
    let mut out = json!({
        "status": report.status().as_str(),
        "summary": {
            "ok": report.count(Status::Ok),
            "warn": report.count(Status::Warn),
            "fail": report.count(Status::Fail),
        },
        "checks": checks,
    });
    if let (Value::Object(out), Value::Object(facts)) = (&mut out, &report.facts) {
        for (k, v) in facts {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// The context of the run, for `--json`.
pub fn context(inputs: &Inputs<'_>) -> Value {
    json!({
        "root": inputs.root.dir().display().to_string(),
        "source": match inputs.inventory.source {
            Source::Verbs => "verbs",
            Source::Sysfs => "sysfs",
        },
        "profile": inputs.profile,
        "cores": inputs.cores.iter().collect::<Vec<_>>(),
        "cores_from": match inputs.cores_from {
            CoresFrom::Flag => "flag",
            CoresFrom::Profile => "profile",
            CoresFrom::None => "none",
        },
    })
}
