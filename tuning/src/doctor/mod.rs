//! `pinpoll-tune doctor`: is this host ready for busy-poll RDMA?
//!
//! Every check is a pure function of [`Inputs`]: a [`SystemRoot`] (sysfs and
//! procfs under `/`, or a fixture tree), an [`Inventory`] of device facts
//! (verbs queries, or hand-made in tests), the profile and the worker cores.
//! A check never guesses: what it cannot read it reports as
//! `warn` "cannot read X: reason".

mod cpu;
mod memory;
mod rdma;
mod render;

use std::fmt;

use pinpoll::EngineConfig;

use crate::cpulist::CpuSet;
use crate::facts::Inventory;
use crate::root::SystemRoot;

pub use memory::{pages_needed, pinned_bytes, HugePool};
pub use rdma::{classify, DeviceKind};

/// How a check came out. Ordered: `Ok < Warn < Fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// Works, but slower or less predictable than it could be; or a fact
    /// could not be read.
    Warn,
    /// pinpoll (with this profile and these cores) will not run as is.
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Stable id of the check (`port.state`, `hugepages.2M`, ...).
    pub check: &'static str,
    /// What it was about: a device (`rxe0`), a port (`rxe0/1`), or nothing
    /// for host-wide checks.
    pub subject: Option<String>,
    pub status: Status,
    /// What the system says.
    pub finding: String,
    /// The exact fix, for `warn` and `fail`.
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(check: &'static str, finding: impl Into<String>) -> Finding {
        Finding {
            check,
            subject: None,
            status: Status::Ok,
            finding: finding.into(),
            fix: None,
        }
    }

    pub fn warn(
        check: &'static str,
        finding: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Finding::ok(check, finding)
        }
    }

    pub fn fail(
        check: &'static str,
        finding: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            status: Status::Fail,
            fix: Some(fix.into()),
            ..Finding::ok(check, finding)
        }
    }

    /// A fact that could not be read: `warn`, naming the file and reason.
    pub fn unreadable(check: &'static str, what: impl fmt::Display) -> Finding {
        Finding::warn(
            check,
            what.to_string(),
            "make the file readable to this process (run as root, or check that the kernel exposes it), then re-run",
        )
    }

    pub fn on(mut self, subject: impl Into<String>) -> Finding {
        self.subject = Some(subject.into());
        self
    }
}

/// Where the worker cores came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoresFrom {
    /// `--cores LIST`.
    Flag,
    /// The profile's `core = N`.
    Profile,
    /// Neither: the worker is unpinned.
    None,
}

/// Everything the checks look at.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub root: &'a SystemRoot,
    pub inventory: &'a Inventory,
    /// The profile's configuration (the engine defaults without a profile).
    pub config: &'a EngineConfig,
    /// How to name the profile in findings (`latency`, a path, or `None`
    /// for the engine defaults).
    pub profile: Option<String>,
    /// The `--device` the user asked for, if any.
    pub device: Option<String>,
    /// The cores the busy-poll worker(s) will be pinned to.
    pub cores: CpuSet,
    pub cores_from: CoresFrom,
}

impl Inputs<'_> {
    pub(crate) fn profile_label(&self) -> String {
        match &self.profile {
            Some(p) => format!("profile {p}"),
            None => "the default configuration (no --profile)".into(),
        }
    }
}

/// The doctor's report: every finding, and the facts behind them.
#[derive(Debug, Clone)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Machine-readable facts (devices, huge pages, memlock) for `--json`.
    pub facts: serde_json::Value,
    pub header: String,
}

impl Report {
    /// The worst status of any finding.
    pub fn status(&self) -> Status {
        self.findings
            .iter()
            .map(|f| f.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    pub fn count(&self, status: Status) -> usize {
        self.findings.iter().filter(|f| f.status == status).count()
    }

    /// The findings of one check.
    pub fn of(&self, check: &str) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.check == check).collect()
    }

    pub fn to_json(&self) -> serde_json::Value {
        render::json(self)
    }

    pub fn to_table(&self) -> String {
        render::table(self)
    }
}

/// Runs every check.
pub fn run(inputs: &Inputs<'_>) -> Report {
    let mut findings = Vec::new();
    findings.extend(rdma::check_devices(inputs));
    for dev in &inputs.inventory.devices {
        findings.extend(rdma::check_device(inputs, dev));
    }
    findings.extend(memory::check_hugepages(inputs));
    findings.push(memory::check_memlock(inputs));
    findings.push(memory::check_thp(inputs));
    findings.push(cpu::check_cores(inputs));
    findings.push(cpu::check_governor(inputs));
    findings.push(cpu::check_cstates(inputs));
    findings.extend(cpu::check_cmdline(inputs));
    let facts = serde_json::json!({
        "context": render::context(inputs),
        "devices": rdma::device_facts(inputs),
        "hugepages": memory::hugepage_facts(inputs),
        "memlock": memory::memlock_facts(inputs),
    });
    Report {
        findings,
        facts,
        header: render::header(inputs),
    }
}
