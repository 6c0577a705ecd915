//! CPU checks: the worker cores, frequency governor, deep C-states, and the
//! isolation parameters of the kernel command line.

use std::collections::BTreeMap;

use super::{CoresFrom, Finding, Inputs};
use crate::cpulist::{self, CpuSet};
use crate::root::{ReadError, SystemRoot};

/// Exit latencies above this many µs count as deep C-states (C1/C1E are
/// 1–10 µs; C3 and deeper are tens to hundreds).
pub const DEEP_CSTATE_US: u64 = 10;

fn online(root: &SystemRoot) -> Result<CpuSet, String> {
    let text = root
        .read_trim("/sys/devices/system/cpu/online")
        .map_err(|e| e.to_string())?;
    cpulist::parse(&text).map_err(|e| format!("/sys/devices/system/cpu/online: {e}"))
}

/// The CPUs a per-CPU check looks at: the worker cores, else every online
/// CPU.
fn examined(inputs: &Inputs<'_>) -> Result<(CpuSet, &'static str), String> {
    if inputs.cores.is_empty() {
        Ok((online(inputs.root)?, "online cpus"))
    } else {
        Ok((inputs.cores.clone(), "worker cores"))
    }
}

pub fn check_cores(inputs: &Inputs<'_>) -> Finding {
    const CHECK: &str = "cpu.cores";
    let online = match online(inputs.root) {
        Ok(o) => o,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let on = cpulist::format(&online);
    let cores = &inputs.cores;
    if cores.is_empty() {
        return Finding::warn(
            CHECK,
            format!("no worker cores chosen (online: {on}): an unpinned worker migrates between cores, and the NUMA, IRQ and isolation checks cannot be specific"),
            "choose the worker cores: `--cores LIST` here, and `core = N` in the profile (one core per engine worker, on the NIC's NUMA node, not core 0)",
        );
    }
    let from = match inputs.cores_from {
        CoresFrom::Flag => "--cores",
        CoresFrom::Profile => "the profile's core",
        CoresFrom::None => "",
    };
    let list = cpulist::format(cores);
    let offline: CpuSet = cores.difference(&online).copied().collect();
    if !offline.is_empty() {
        return Finding::fail(
            CHECK,
            format!("worker core(s) {} ({from}) are not online (online: {on}): pinning fails", cpulist::format(&offline)),
            format!("choose cores from {on}, or bring them online: `echo 1 > /sys/devices/system/cpu/cpu<N>/online`"),
        );
    }
    if cores.contains(&0) {
        return Finding::warn(
            CHECK,
            format!("worker core(s) {list} ({from}) include core 0, which carries housekeeping (timers, unmovable IRQs, RCU)"),
            format!(
                "pin to another core: one of {}",
                cpulist::format(&online.iter().copied().filter(|c| *c != 0).collect())
            ),
        );
    }
    Finding::ok(
        CHECK,
        format!("worker core(s) {list} ({from}), online: {on}"),
    )
}

/// "2 3" as `cpu{2,3}` / `cpu2` for a shell glob over sysfs.
fn cpu_brace(set: &CpuSet) -> String {
    if set.len() == 1 {
        format!("cpu{}", set.iter().next().copied().unwrap_or(0))
    } else {
        format!(
            "cpu{{{}}}",
            set.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    }
}

pub fn check_governor(inputs: &Inputs<'_>) -> Finding {
    const CHECK: &str = "cpu.governor";
    let (cpus, which) = match examined(inputs) {
        Ok(x) => x,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let mut by_gov: BTreeMap<String, CpuSet> = BTreeMap::new();
    let mut unscaled = CpuSet::new();
    for cpu in &cpus {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq");
        match inputs.root.read_trim(&format!("{dir}/scaling_governor")) {
            Ok(g) => {
                by_gov.entry(g).or_default().insert(*cpu);
            }
            Err(e) if e.is_not_found() && !inputs.root.exists(&dir) => {
                unscaled.insert(*cpu);
            }
            Err(e) => return Finding::unreadable(CHECK, e),
        }
    }
    let mut parts: Vec<String> = by_gov
        .iter()
        .map(|(g, set)| format!("{g} on {}", cpulist::format(set)))
        .collect();
    if !unscaled.is_empty() {
        parts.push(format!(
            "no cpufreq on {} (the kernel does not scale their frequency)",
            cpulist::format(&unscaled)
        ));
    }
    let finding = format!("{which}: {}", parts.join("; "));
    let slow: CpuSet = by_gov
        .iter()
        .filter(|(g, _)| g.as_str() != "performance")
        .flat_map(|(_, s)| s.iter().copied())
        .collect();
    if slow.is_empty() {
        return Finding::ok(CHECK, finding);
    }
    Finding::warn(
        CHECK,
        format!("{finding}: a non-performance governor lowers the clock between bursts, and the first messages after idle pay for ramping it up"),
        format!(
            "`cpupower -c {} frequency-set -g performance` (or `echo performance | tee /sys/devices/system/cpu/{}/cpufreq/scaling_governor`)",
            cpulist::format(&slow),
            cpu_brace(&slow)
        ),
    )
}

/// The enabled C-states of some CPUs.
struct CStates {
    /// (state name, exit latency) -> CPUs where it is enabled, for states
    /// whose exit latency exceeds [`DEEP_CSTATE_US`].
    deep: BTreeMap<(String, u64), CpuSet>,
    /// The other enabled states by name.
    shallow: BTreeMap<String, CpuSet>,
    /// CPUs without cpuidle states.
    without: CpuSet,
}

fn enabled_cstates(root: &SystemRoot, cpus: &CpuSet) -> Result<CStates, ReadError> {
    let mut found = CStates {
        deep: BTreeMap::new(),
        shallow: BTreeMap::new(),
        without: CpuSet::new(),
    };
    for cpu in cpus {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpuidle");
        let states = match root.list(&dir) {
            Ok(s) => s,
            Err(e) if e.is_not_found() => {
                found.without.insert(*cpu);
                continue;
            }
            Err(e) => return Err(e),
        };
        for state in states.iter().filter(|s| s.starts_with("state")) {
            let base = format!("{dir}/{state}");
            let name = root.read_trim(&format!("{base}/name"))?;
            let latency = root.read_u64(&format!("{base}/latency"))?;
            if root.read_trim(&format!("{base}/disable"))? != "0" {
                continue;
            }
            if latency > DEEP_CSTATE_US {
                found.deep.entry((name, latency)).or_default().insert(*cpu);
            } else {
                found.shallow.entry(name).or_default().insert(*cpu);
            }
        }
    }
    Ok(found)
}

pub fn check_cstates(inputs: &Inputs<'_>) -> Finding {
    const CHECK: &str = "cpu.cstates";
    let root = inputs.root;
    let (cpus, which) = match examined(inputs) {
        Ok(x) => x,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let driver = root
        .read_trim("/sys/devices/system/cpu/cpuidle/current_driver")
        .unwrap_or_else(|e| {
            if e.is_not_found() {
                "none".into()
            } else {
                e.to_string()
            }
        });
    let CStates {
        deep,
        shallow,
        without,
    } = match enabled_cstates(root, &cpus) {
        Ok(states) => states,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    if deep.is_empty() {
        let mut parts = Vec::new();
        if !shallow.is_empty() {
            parts.push(format!(
                "enabled states all exit within {DEEP_CSTATE_US} µs ({})",
                shallow.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        if !without.is_empty() {
            parts.push(format!(
                "no cpuidle states on {}",
                cpulist::format(&without)
            ));
        }
        return Finding::ok(
            CHECK,
            format!("{which} (cpuidle driver {driver}): {}", parts.join("; ")),
        );
    }
    let all: CpuSet = deep.values().flat_map(|s| s.iter().copied()).collect();
    Finding::warn(
        CHECK,
        format!(
            "{which} (cpuidle driver {driver}): deep C-states enabled: {}; waking from them costs the peer (and a backing-off worker) their exit latency",
            deep.iter()
                .map(|((n, l), s)| format!("{n} ({l} µs) on {}", cpulist::format(s)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!(
            "`cpupower -c {} idle-set -D {DEEP_CSTATE_US}` (disables states with exit latency above {DEEP_CSTATE_US} µs; until reboot), or at boot: `intel_idle.max_cstate=1 processor.max_cstate=1` on the kernel command line",
            cpulist::format(&all)
        ),
    )
}

/// `key=value` parameters of /proc/cmdline (last one wins, as in the kernel).
fn cmdline_params(text: &str) -> BTreeMap<String, String> {
    text.split_whitespace()
        .take_while(|w| *w != "--")
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (w.to_owned(), String::new()),
        })
        .collect()
}

/// `isolcpus=` takes optional flags before the list.
const ISOLCPUS_FLAGS: [&str; 3] = ["nohz", "domain", "managed_irq"];

fn param_cpus(key: &str, value: &str) -> Result<(Vec<String>, CpuSet), String> {
    let mut flags = Vec::new();
    let mut list = Vec::new();
    for part in value.split(',') {
        if key == "isolcpus" && ISOLCPUS_FLAGS.contains(&part) {
            flags.push(part.to_owned());
        } else {
            list.push(part);
        }
    }
    let set = cpulist::parse(&list.join(",")).map_err(|e| format!("{key}={value}: {e}"))?;
    Ok((flags, set))
}

pub fn check_cmdline(inputs: &Inputs<'_>) -> Vec<Finding> {
    let keys: [(&'static str, &'static str, &'static str); 3] = [
        (
            "kernel.isolcpus",
            "isolcpus",
            "the scheduler still places other tasks on them",
        ),
        (
            "kernel.nohz_full",
            "nohz_full",
            "the scheduler tick still interrupts them (up to 1000 times a second)",
        ),
        (
            "kernel.rcu_nocbs",
            "rcu_nocbs",
            "RCU callbacks still run on them",
        ),
    ];
    let text = match inputs.root.read_trim("/proc/cmdline") {
        Ok(t) => t,
        Err(e) => {
            return keys
                .iter()
                .map(|(check, _, _)| Finding::unreadable(check, &e))
                .collect()
        }
    };
    let params = cmdline_params(&text);
    keys.iter()
        .map(|&(check, key, cost)| check_param(&inputs.cores, &params, check, key, cost))
        .collect()
}

/// Where to put a kernel parameter.
const HOW: &str = "on the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then `update-grub` or `grub2-mkconfig -o /boot/grub2/grub.cfg`, and reboot)";

/// Covers the kernel command line's `key` (isolcpus, nohz_full,
/// rcu_nocbs) the worker `cores`? `cost` says what a core outside it
/// suffers.
fn check_param(
    cores: &CpuSet,
    params: &BTreeMap<String, String>,
    check: &'static str,
    key: &str,
    cost: &str,
) -> Finding {
    let (flags, listed, shown) = match params.get(key) {
        Some(v) => match param_cpus(key, v) {
            Ok((f, s)) => (f, s, format!("{key}={v}")),
            Err(e) => {
                return Finding::unreadable(check, format!("cannot parse /proc/cmdline: {e}"))
            }
        },
        None => (Vec::new(), CpuSet::new(), format!("no {key}=")),
    };
    let flags = if key == "isolcpus" && flags.is_empty() {
        "managed_irq,domain,".to_owned()
    } else if flags.is_empty() {
        String::new()
    } else {
        format!("{},", flags.join(","))
    };
    if cores.is_empty() {
        if listed.is_empty() {
            return Finding::warn(
                check,
                format!("{shown} on the kernel command line: {cost}"),
                format!("choose the worker cores (--cores), then add {key}={flags}<cores> {HOW}"),
            );
        }
        return Finding::ok(
            check,
            format!(
                "{shown}: pick worker cores from {}",
                cpulist::format(&listed)
            ),
        );
    }
    let missing: CpuSet = cores.difference(&listed).copied().collect();
    if missing.is_empty() {
        return Finding::ok(
            check,
            format!("{shown} covers worker core(s) {}", cpulist::format(cores)),
        );
    }
    let want: CpuSet = listed.union(cores).copied().collect();
    let shown = if listed.is_empty() {
        format!("{shown} on the kernel command line, so it does not cover")
    } else {
        format!("{shown} does not cover")
    };
    Finding::warn(
        check,
        format!(
            "{shown} worker core(s) {}: {cost}",
            cpulist::format(&missing)
        ),
        format!(
            "{} {key}={flags}{} {HOW}",
            if listed.is_empty() { "add" } else { "make it" },
            cpulist::format(&want)
        ),
    )
}
