//! Device checks: which devices exist, what they are (hardware or
//! SoftRoCE), port state, MTU, link layer, GID, whether the profile fits the
//! device, NUMA locality and interrupt affinity.

use std::collections::BTreeMap;

use pinpoll::gid::{self, GidEntry, SYSFS_INFINIBAND};
use serde_json::{json, Value};

use super::{Finding, Inputs};
use crate::cpulist::{self, CpuSet};
use crate::facts::{DeviceFacts, LinkLayer, PortFacts, Source};
use crate::root::{basename, ReadError, SystemRoot};
use crate::topology::{
    bus_device, device_irqs, device_numa, ib_dir, numa_nodes, online_cpus, DeviceIrqs, IrqLine,
};

/// rxe's `vendor_id` (`RXE_VENDOR_ID`, drivers/infiniband/sw/rxe).
pub const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

const HOW_TO_GET_A_DEVICE: &str = "load the NIC's RDMA driver (e.g. `modprobe mlx5_ib`) and the user-space providers (`apt install rdma-core ibverbs-providers`); for functional testing only, create SoftRoCE: `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <netdev>` (or run inside `scripts/softroce-vm`)";

/// What a device is, from where sysfs puts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// rxe: a virtual device with a `parent` netdev.
    SoftRoce { netdev: String, path: String },
    /// Another device without hardware under it (e.g. siw).
    Software { path: String },
    /// A device on a bus: its bus id (`0000:3b:00.0`) and driver.
    Hardware {
        path: String,
        bus_id: String,
        driver: Result<String, ReadError>,
    },
}

impl DeviceKind {
    pub fn name(&self) -> &'static str {
        match self {
            DeviceKind::SoftRoce { .. } => "softroce",
            DeviceKind::Software { .. } => "software",
            DeviceKind::Hardware { .. } => "hardware",
        }
    }
}

/// Tells SoftRoCE from hardware: `/sys/class/infiniband/DEV` resolves under
/// `/sys/devices/virtual/` for software devices, and rxe adds a `parent`
/// attribute naming its netdev; hardware has a `device` symlink to its bus
/// device, whose `driver` link names the driver.
pub fn classify(root: &SystemRoot, dev: &str) -> Result<DeviceKind, ReadError> {
    let path = root.canonical(&ib_dir(dev))?;
    if path.starts_with("/sys/devices/virtual/") {
        let parent = format!("{}/parent", ib_dir(dev));
        if root.exists(&parent) {
            return Ok(DeviceKind::SoftRoce {
                netdev: root.read_trim(&parent)?,
                path,
            });
        }
        return Ok(DeviceKind::Software { path });
    }
    let bus = root.canonical(&format!("{}/device", ib_dir(dev)))?;
    let driver = root
        .read_link(&format!("{}/device/driver", ib_dir(dev)))
        .map(|p| basename(&p.to_string_lossy()).to_owned());
    Ok(DeviceKind::Hardware {
        path,
        bus_id: basename(&bus).to_owned(),
        driver,
    })
}

/// The netdev a RoCE device sends through, when sysfs names one: rxe's
/// `parent`, a NIC's `device/net/*`, or the netdev of GID 0.
fn netdev_of(root: &SystemRoot, dev: &str, kind: Option<&DeviceKind>) -> Option<String> {
    if let Some(DeviceKind::SoftRoce { netdev, .. }) = kind {
        return Some(netdev.clone());
    }
    if let Ok(names) = root.list(&format!("{}/device/net", ib_dir(dev))) {
        if let Some(first) = names.into_iter().next() {
            return Some(first);
        }
    }
    root.read_trim(&format!("{}/ports/1/gid_attrs/ndevs/0", ib_dir(dev)))
        .ok()
        .filter(|s| !s.is_empty())
}

/// Checks the device list itself.
/// The failure of a host whose libibverbs (or sysfs) lists no device,
/// saying what sysfs has.
fn no_device(inputs: &Inputs<'_>) -> Finding {
    let sysfs = match inputs.root.list(SYSFS_INFINIBAND) {
        Ok(n) if n.is_empty() => "/sys/class/infiniband is empty".to_owned(),
        Ok(n) => format!("/sys/class/infiniband has {}", n.join(", ")),
        Err(e) if e.is_not_found() => {
            "no /sys/class/infiniband: no RDMA driver is loaded".to_owned()
        }
        Err(e) => e.to_string(),
    };
    let via = match inputs.inventory.source {
        Source::Verbs => "ibv_get_device_list lists none",
        Source::Sysfs => "none in sysfs",
    };
    Finding::fail(
        "rdma.devices",
        format!("no RDMA device ({via}; {sysfs})"),
        HOW_TO_GET_A_DEVICE,
    )
}

/// A device the kernel has but libibverbs does not list has no user-space
/// provider.
fn without_provider(inputs: &Inputs<'_>, listed: &[String]) -> Option<Finding> {
    if inputs.inventory.source != Source::Verbs {
        return None;
    }
    let sysfs = inputs.root.list(SYSFS_INFINIBAND).ok()?;
    let missing: Vec<&str> = sysfs
        .iter()
        .filter(|n| !listed.contains(n))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(Finding::warn(
        "rdma.devices",
        format!(
            "{} in /sys/class/infiniband but not listed by libibverbs (no user-space provider, or ib_uverbs not loaded)",
            missing.join(", ")
        ),
        "`modprobe ib_uverbs` and install the provider library (`apt install ibverbs-providers` / `dnf install libibverbs`)",
    ))
}

pub fn check_devices(inputs: &Inputs<'_>) -> Vec<Finding> {
    const CHECK: &str = "rdma.devices";
    let inv = inputs.inventory;
    let listed = match &inv.listing {
        Ok(names) => names.clone(),
        Err(why) => {
            return vec![Finding::fail(
                CHECK,
                format!("cannot list RDMA devices: {why}"),
                HOW_TO_GET_A_DEVICE,
            )]
        }
    };
    if listed.is_empty() {
        return vec![no_device(inputs)];
    }
    let mut out = Vec::new();
    if let Some(wanted) = &inputs.device {
        if !listed.contains(wanted) {
            return vec![Finding::fail(
                CHECK,
                format!("no RDMA device {wanted:?} (have: {})", listed.join(", ")),
                format!("pass --device with one of: {}", listed.join(", ")),
            )];
        }
    }
    let described: Vec<String> = listed
        .iter()
        .map(|name| match classify(inputs.root, name) {
            Ok(DeviceKind::SoftRoce { .. }) => format!("{name} (SoftRoCE)"),
            Ok(kind) => format!("{name} ({})", kind.name()),
            // device.kind reports why.
            Err(_) => name.clone(),
        })
        .collect();
    out.push(Finding::ok(
        CHECK,
        format!(
            "{} device{}: {}{}",
            listed.len(),
            if listed.len() == 1 { "" } else { "s" },
            described.join(", "),
            match &inputs.device {
                Some(d) => format!("; examining {d} (--device)"),
                None => String::new(),
            }
        ),
    ));
    out.extend(without_provider(inputs, &listed));
    out
}

/// Every check of one device.
pub fn check_device(inputs: &Inputs<'_>, dev: &DeviceFacts) -> Vec<Finding> {
    let name = dev.name.as_str();
    let mut out = Vec::new();
    let kind = classify(inputs.root, name);
    out.push(check_kind(dev, &kind).on(name));
    match &dev.ports {
        Ok(ports) => {
            for port in ports {
                let subject = format!("{name}/{}", port.port);
                let netdev = netdev_of(inputs.root, name, kind.as_ref().ok());
                out.push(
                    check_port_state(inputs, dev, port, netdev.as_deref(), &kind).on(&subject),
                );
                out.push(check_link_layer(port).on(&subject));
                out.push(check_mtu(port, netdev.as_deref()).on(&subject));
                out.push(check_gid(inputs, dev, port, netdev.as_deref()).on(&subject));
            }
        }
        Err(why) => out.push(Finding::unreadable("port.state", why).on(name)),
    }
    out.push(check_fit(inputs, dev).on(name));
    out.push(check_capacity(inputs, dev).on(name));
    out.push(check_numa(inputs, name, &kind).on(name));
    out.push(check_irqs(inputs, name, &kind).on(name));
    out
}

fn check_kind(dev: &DeviceFacts, kind: &Result<DeviceKind, ReadError>) -> Finding {
    const CHECK: &str = "device.kind";
    let vendor = match &dev.limits {
        Ok(l) if l.vendor_id == RXE_VENDOR_ID => format!(", vendor_id {:#x} = rxe's", l.vendor_id),
        Ok(l) => format!(", vendor_id {:#x}", l.vendor_id),
        Err(_) => String::new(),
    };
    match kind {
        Err(e) => Finding::unreadable(CHECK, e),
        Ok(DeviceKind::SoftRoce { netdev, path }) => Finding::warn(
            CHECK,
            format!(
                "SoftRoCE (rxe) over netdev {netdev} ({} -> {path}, no hardware device; `parent` = {netdev}{vendor}): figures measured on it are functional, not hardware",
                ib_dir(&dev.name)
            ),
            "nothing to fix for functional tests; for performance figures run on a hardware RDMA NIC",
        ),
        Ok(DeviceKind::Software { path }) => Finding::warn(
            CHECK,
            format!(
                "software RDMA device ({} -> {path}, no hardware device{vendor}): figures measured on it are functional, not hardware",
                ib_dir(&dev.name)
            ),
            "for performance figures run on a hardware RDMA NIC",
        ),
        Ok(DeviceKind::Hardware {
            bus_id, driver, ..
        }) => {
            let driver = match driver {
                Ok(d) => d.clone(),
                Err(e) => format!("driver unknown: {e}"),
            };
            Finding::ok(
                CHECK,
                format!("hardware: {bus_id}, driver {driver}{vendor}"),
            )
        }
    }
}

fn check_port_state(
    inputs: &Inputs<'_>,
    dev: &DeviceFacts,
    port: &PortFacts,
    netdev: Option<&str>,
    kind: &Result<DeviceKind, ReadError>,
) -> Finding {
    const CHECK: &str = "port.state";
    let state = match &port.state {
        Ok(s) => s,
        Err(why) => return Finding::unreadable(CHECK, why),
    };
    let phys = inputs
        .root
        .read_trim(&format!(
            "{}/ports/{}/phys_state",
            ib_dir(&dev.name),
            port.port
        ))
        .map(|p| format!(" (phys_state {p})"))
        .unwrap_or_default();
    if state.is_active() {
        return Finding::ok(CHECK, format!("{}{phys}", state.name));
    }
    let nd = netdev.unwrap_or("<netdev>");
    let fix = match (&port.link_layer, kind) {
        (_, Ok(DeviceKind::SoftRoce { netdev, .. })) => format!(
            "SoftRoCE follows its netdev: `ip link set dev {netdev} up` (check `ip link show {netdev}`: it must be UP with a carrier)"
        ),
        (Ok(LinkLayer::Ethernet), _) => format!(
            "`ip link set dev {nd} up`; then check the cable or the peer/switch port (`ethtool {nd}` must say Link detected: yes)"
        ),
        (Ok(LinkLayer::InfiniBand), _) if state.code == 2 => {
            "port INIT: no subnet manager has configured it; start one on the fabric (`systemctl start opensm`, or enable the switch's SM)".to_owned()
        }
        _ => format!(
            "check the cable and the switch port; `ibv_devinfo -d {}` shows the state",
            dev.name
        ),
    };
    Finding::fail(
        CHECK,
        format!(
            "{} ({}){phys}: queue pairs cannot connect",
            state.name, state.code
        ),
        fix,
    )
}

fn check_link_layer(port: &PortFacts) -> Finding {
    const CHECK: &str = "port.link_layer";
    match &port.link_layer {
        Ok(LinkLayer::Ethernet) => Finding::ok(CHECK, "Ethernet (RoCE: addressed by GID)"),
        Ok(LinkLayer::InfiniBand) => Finding::ok(CHECK, "InfiniBand"),
        Err(why) => Finding::unreadable(CHECK, why),
    }
}

/// The netdev MTU a RoCE path MTU of `ib_mtu` bytes needs: the payload
/// plus Ethernet/IP/UDP/BTH headers (≈ 100 B), rounded up to a round number.
fn netdev_mtu_for(ib_mtu: u32) -> u32 {
    (ib_mtu + 104).div_ceil(100) * 100
}

fn check_mtu(port: &PortFacts, netdev: Option<&str>) -> Finding {
    const CHECK: &str = "port.mtu";
    let (active, max) = match (&port.active_mtu, &port.max_mtu) {
        (Ok(a), Ok(m)) => (*a, *m),
        (Err(why), _) | (_, Err(why)) => {
            return Finding::unreadable(CHECK, format!("cannot read the port MTU: {why}"))
        }
    };
    if active >= max {
        return Finding::ok(CHECK, format!("active {active} = max {max} bytes"));
    }
    let finding = format!(
        "active {active} < max {max} bytes: messages travel in {active}-byte packets (more packets, more per-packet work)"
    );
    let fix = match &port.link_layer {
        Ok(LinkLayer::InfiniBand) => format!(
            "the subnet manager sets the IB MTU: in opensm's partitions.conf give the partition mtu={} (= {max} bytes), e.g. `Default=0x7fff, ipoib, mtu={} : ALL=full;`, and restart opensm",
            mtu_code(max),
            mtu_code(max)
        ),
        _ => format!(
            "raise the netdev MTU: `ip link set dev {} mtu {}` (RoCE's path MTU is the largest of 256..4096 that fits the netdev MTU minus headers; the peer and every switch on the path must carry frames that large)",
            netdev.unwrap_or("<netdev>"),
            netdev_mtu_for(max)
        ),
    };
    Finding::warn(CHECK, finding, fix)
}

/// `enum ibv_mtu` of a byte count (4096 → 5).
fn mtu_code(bytes: u32) -> u32 {
    (1..=5).find(|c| 128u32 << c == bytes).unwrap_or(5)
}

fn describe_gid(root: &SystemRoot, dev: &str, port: u8, e: &GidEntry) -> String {
    let ndev = root
        .read_trim(&format!(
            "{}/ports/{port}/gid_attrs/ndevs/{}",
            ib_dir(dev),
            e.index
        ))
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| format!(" on {s}"))
        .unwrap_or_default();
    let kind = if e.kind.is_empty() {
        "type not in sysfs".to_owned()
    } else {
        e.kind.clone()
    };
    format!("GID {} {} ({kind}{ndev})", e.index, e.as_ipv6())
}

fn check_gid(
    inputs: &Inputs<'_>,
    dev: &DeviceFacts,
    port: &PortFacts,
    netdev: Option<&str>,
) -> Finding {
    const CHECK: &str = "port.gid";
    let table = match &port.gids {
        Ok(t) => t,
        Err(why) => return Finding::unreadable(CHECK, why),
    };
    let nd = netdev.unwrap_or("<netdev>");
    let wanted = inputs.config.qp.gid_index;
    let chosen = match gid::select(table, wanted, port.port) {
        Ok(e) => e,
        Err(pinpoll::Error::NoGid { .. }) => {
            return Finding::fail(
                CHECK,
                "no populated GID: nothing to address this port by",
                match port.link_layer {
                    Ok(LinkLayer::InfiniBand) => {
                        "an IB port gets GID 0 from its port GUID; check `ibv_devinfo -v` and the subnet manager".to_owned()
                    }
                    _ => format!(
                        "RoCE GIDs are the netdev's IP addresses: `ip addr add <address>/<prefix> dev {nd}` (and `ip link set dev {nd} up`)"
                    ),
                },
            )
        }
        Err(e) => {
            return Finding::fail(
                CHECK,
                e.to_string(),
                format!(
                    "set gid_index in the profile to one of {}, or remove it to let pinpoll pick the first RoCE v2 GID",
                    table.iter().map(|e| e.index.to_string()).collect::<Vec<_>>().join(", ")
                ),
            )
        }
    };
    let how = if wanted.is_some() {
        "the profile's gid_index"
    } else {
        "pinpoll's choice"
    };
    let described = describe_gid(inputs.root, &dev.name, port.port, &chosen);
    let finding = format!("{described}, {how}; {} populated", table.len());
    match port.link_layer {
        Ok(LinkLayer::Ethernet) if chosen.is_roce_v2() => Finding::ok(CHECK, finding),
        Ok(LinkLayer::Ethernet) if chosen.kind.is_empty() => Finding::warn(
            CHECK,
            format!("{finding}; the kernel publishes no GID types (…/gid_attrs/types), so RoCE v1 and v2 cannot be told apart"),
            "use a kernel with gid_attrs in sysfs (4.9+) or set gid_index to a RoCE v2 entry of `show_gids`",
        ),
        Ok(LinkLayer::Ethernet) => Finding::warn(
            CHECK,
            format!("{finding}: RoCE v1 is not routable and peers usually speak v2"),
            format!(
                "RoCE v2 GIDs follow the netdev's IP addresses: `ip addr add <address>/<prefix> dev {nd}`; or pick a v2 entry with gid_index"
            ),
        ),
        _ => Finding::ok(CHECK, finding),
    }
}

/// Completion queues each connection creates (one for its sends, one for
/// its receives).
const CQS_PER_CONNECTION: u32 = 2;

/// How many connections of the profile the device holds at once, and
/// which of its limits is the tightest; and what shared receive queues
/// it offers.
fn check_capacity(inputs: &Inputs<'_>, dev: &DeviceFacts) -> Finding {
    const CHECK: &str = "device.capacity";
    let limits = match &dev.limits {
        Ok(l) => l,
        Err(why) => {
            return Finding::unreadable(
                CHECK,
                format!("cannot count what {} holds: {why}", dev.name),
            )
        }
    };
    let cfg = inputs.config;
    let regions = cfg.ring_bytes().len() as u32;
    let (name, limit, each) = [
        ("max_qp", limits.max_qp, 1),
        ("max_cq", limits.max_cq, CQS_PER_CONNECTION),
        ("max_mr", limits.max_mr, regions),
        ("max_pd", limits.max_pd, 1),
    ]
    .into_iter()
    .min_by_key(|&(_, limit, each)| limit / each)
    .expect("four limits");
    let connections = limit / each;
    let srq = match limits.max_srq {
        0 => "no shared receive queues".to_owned(),
        n => format!(
            "shared receive queues: max_srq {n}, of up to max_srq_wr {} receives each",
            limits.max_srq_wr
        ),
    };
    let finding = format!(
        "{} holds {connections} connections of {} at once, each a queue pair, {CQS_PER_CONNECTION} completion queues, {regions} memory regions ({} registered) and a protection domain: the tightest limit is {name} {limit}; {srq}",
        dev.name,
        inputs.profile_label(),
        super::memory::human(cfg.registered_bytes()),
    );
    if connections == 0 {
        return Finding::fail(
            CHECK,
            finding,
            format!(
                "{} cannot hold one connection: check `ibv_devinfo -v -d {}`",
                dev.name, dev.name
            ),
        );
    }
    Finding::ok(CHECK, finding)
}

/// The profile's depths and inline size against the device's limits.
fn check_fit(inputs: &Inputs<'_>, dev: &DeviceFacts) -> Finding {
    const CHECK: &str = "profile.fit";
    let cfg = inputs.config;
    let label = inputs.profile_label();
    let limits = match &dev.limits {
        Ok(l) => l,
        Err(why) => {
            return Finding::unreadable(
                CHECK,
                format!("cannot check {label} against the device: {why}"),
            )
        }
    };
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut fits: Vec<String> = Vec::new();
    let mut cmp = |key: &str, value: u32, limit: u32, what: &str| {
        if value > limit {
            problems.push((
                format!("{key} = {value} > {limit} ({what})"),
                format!("{key} = {limit}"),
            ));
        } else {
            fits.push(format!("{key} {value} <= {limit}"));
        }
    };
    cmp(
        "send_queue_depth",
        cfg.qp.max_send_wr,
        limits.max_qp_wr,
        "max_qp_wr",
    );
    cmp(
        "recv_queue_depth",
        cfg.qp.max_recv_wr,
        limits.max_qp_wr,
        "max_qp_wr",
    );
    cmp("cq_depth", cfg.qp.cq_depth, limits.max_cqe, "max_cqe");
    cmp(
        "max_rd_atomic",
        u32::from(cfg.qp.max_rd_atomic),
        limits.max_qp_rd_atom,
        "max_qp_rd_atom",
    );
    match &dev.max_inline_data {
        Ok(max) => cmp(
            "inline_threshold",
            cfg.inline_threshold,
            *max,
            "the largest max_inline_data a queue pair was created with",
        ),
        Err(why) => fits.push(format!(
            "inline_threshold {} unchecked ({why})",
            cfg.inline_threshold
        )),
    }
    if problems.is_empty() {
        return Finding::ok(CHECK, format!("{label} fits: {}", fits.join(", ")));
    }
    Finding::fail(
        CHECK,
        format!(
            "{label} does not fit {}: {}; creating its queue pair fails",
            dev.name,
            problems
                .iter()
                .map(|p| p.0.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ),
        format!(
            "in the profile set {}",
            problems
                .iter()
                .map(|p| p.1.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

fn check_numa(inputs: &Inputs<'_>, dev: &str, kind: &Result<DeviceKind, ReadError>) -> Finding {
    const CHECK: &str = "numa.locality";
    let kind = match kind {
        Ok(k) => k,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let nodes = match numa_nodes(inputs.root) {
        Ok(n) => n,
        Err(why) => return Finding::unreadable(CHECK, why),
    };
    let node = match device_numa(inputs.root, dev, kind) {
        Ok(n) => n,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let cores = &inputs.cores;
    let Some((node, file)) = node else {
        let why = match kind {
            DeviceKind::SoftRoce { netdev, .. } => {
                format!(
                    "SoftRoCE over {netdev}, a virtual netdev (no /sys/class/net/{netdev}/device)"
                )
            }
            _ => "software device".to_owned(),
        };
        return Finding::ok(CHECK, format!("{why}: no NUMA locality to match"));
    };
    if node < 0 {
        if nodes.len() <= 1 {
            return Finding::ok(
                CHECK,
                format!("{file} = -1 (no node reported); this machine has one NUMA node"),
            );
        }
        return Finding::warn(
            CHECK,
            format!("{file} = -1: the firmware reports no NUMA node for the NIC, on a machine with {} nodes", nodes.len()),
            "find the NIC's socket from the board manual or `lstopo`, and pin to its cores; enable ACPI SRAT/NUMA in the BIOS so the kernel knows",
        );
    }
    let node = node as u32;
    let Some(local) = nodes.get(&node) else {
        if nodes.is_empty() {
            return Finding::ok(
                CHECK,
                format!("NIC on node {node} ({file}); the kernel has no NUMA topology (one node)"),
            );
        }
        return Finding::warn(
            CHECK,
            format!("{file} = {node}, but /sys/devices/system/node/node{node} does not exist"),
            "check the kernel's NUMA support (`numactl -H`)",
        );
    };
    let local_list = cpulist::format(local);
    if cores.is_empty() {
        return Finding::ok(
            CHECK,
            format!("NIC on node {node} (cpus {local_list}); no worker cores chosen: pick them from these"),
        );
    }
    let remote: CpuSet = cores.difference(local).copied().collect();
    if remote.is_empty() {
        return Finding::ok(
            CHECK,
            format!(
                "worker core(s) {} on the NIC's node {node} (cpus {local_list})",
                cpulist::format(cores)
            ),
        );
    }
    Finding::warn(
        CHECK,
        format!(
            "worker core(s) {} are not on the NIC's node {node} (cpus {local_list}): every completion and doorbell crosses the socket interconnect",
            cpulist::format(&remote)
        ),
        format!("pin to cores of node {node}: `--cores {local_list}` here, and core = <one of {local_list}> in the profile"),
    )
}

fn check_irqs(inputs: &Inputs<'_>, dev: &str, kind: &Result<DeviceKind, ReadError>) -> Finding {
    const CHECK: &str = "irq.affinity";
    let root = inputs.root;
    let kind = match kind {
        Ok(k) => k,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let bus_path = match bus_device(root, dev, kind) {
        None => {
            let why = match kind {
                DeviceKind::SoftRoce { netdev, .. } => format!(
                    "SoftRoCE raises no interrupts of its own, and its netdev {netdev} is virtual (no device)"
                ),
                _ => "a software device raises no interrupts of its own".to_owned(),
            };
            return Finding::ok(CHECK, format!("{why}: nothing to steer"));
        }
        Some(Err(e)) => return Finding::unreadable(CHECK, e),
        Some(Ok(p)) => p,
    };
    let bus_id = basename(&bus_path).to_owned();
    let driver = match kind {
        DeviceKind::Hardware {
            driver: Ok(driver), ..
        } => Some(driver.as_str()),
        _ => None,
    };
    let irqs = match device_irqs(root, &bus_path, driver) {
        Ok(irqs) => irqs,
        Err(why) => return Finding::unreadable(CHECK, why),
    };
    if irqs.lines.is_empty() {
        return Finding::warn(
            CHECK,
            format!("no interrupt of {bus_id} in /proc/interrupts (nor in {bus_path}/msi_irqs)"),
            format!("check that the driver is bound and up: `ls {bus_path}/msi_irqs`, `grep {bus_id} /proc/interrupts`"),
        );
    }
    let affinity = match irq_affinity(root, &irqs.lines, &inputs.cores) {
        Ok(a) => a,
        Err(why) => return Finding::unreadable(CHECK, why),
    };
    let summary = irq_summary(&bus_id, &irqs, &affinity.spread);
    if inputs.cores.is_empty() {
        return Finding::ok(
            CHECK,
            format!("{summary}; no worker cores chosen to keep them off"),
        );
    }
    if affinity.on_workers.is_empty() {
        return Finding::ok(
            CHECK,
            format!(
                "{summary}; none may fire on worker core(s) {}",
                cpulist::format(&inputs.cores)
            ),
        );
    }
    irqs_on_workers(inputs, dev, kind, &summary, &affinity.on_workers)
}

/// Where each IRQ may fire: those that may fire on a worker core, and the
/// IRQs by affinity list.
struct IrqAffinity {
    on_workers: Vec<u32>,
    spread: BTreeMap<String, Vec<u32>>,
}

fn irq_affinity(
    root: &SystemRoot,
    lines: &[IrqLine],
    workers: &CpuSet,
) -> Result<IrqAffinity, String> {
    let mut on_workers = Vec::new();
    let mut spread: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for line in lines {
        let file = format!("/proc/irq/{}/smp_affinity_list", line.irq);
        let aff = root.read_trim(&file).map_err(|e| e.to_string())?;
        let set = cpulist::parse(&aff).map_err(|e| format!("{file}: {e}"))?;
        if !set.is_disjoint(workers) {
            on_workers.push(line.irq);
        }
        spread.entry(aff).or_default().push(line.irq);
    }
    Ok(IrqAffinity { on_workers, spread })
}

/// `N IRQ(s) of BUS (how: names...); affinity LIST for N IRQ(s), ...`.
fn irq_summary(bus_id: &str, irqs: &DeviceIrqs, spread: &BTreeMap<String, Vec<u32>>) -> String {
    let names: Vec<String> = irqs
        .lines
        .iter()
        .take(3)
        .map(|l| l.desc.rsplit(' ').next().unwrap_or("").to_owned())
        .collect();
    format!(
        "{} IRQ(s) of {bus_id} ({}: {}{}); affinity {}",
        irqs.lines.len(),
        irqs.how,
        names.join(", "),
        if irqs.lines.len() > 3 { ", ..." } else { "" },
        spread
            .iter()
            .map(|(aff, irqs)| format!("{aff} for {} IRQ(s)", irqs.len()))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The warning for IRQs that may fire on worker cores, and the fix: steer
/// them to the NIC's node (else every online CPU) minus the workers.
fn irqs_on_workers(
    inputs: &Inputs<'_>,
    dev: &str,
    kind: &DeviceKind,
    summary: &str,
    on_workers: &[u32],
) -> Finding {
    let root = inputs.root;
    let online = online_cpus(root);
    let local = match device_numa(root, dev, kind) {
        Ok(Some((n, _))) if n >= 0 => numa_nodes(root)
            .ok()
            .and_then(|m| m.get(&(n as u32)).cloned())
            .unwrap_or_else(|| online.clone()),
        _ => online.clone(),
    };
    let mut allowed: CpuSet = local.difference(&inputs.cores).copied().collect();
    if allowed.is_empty() {
        allowed = online.difference(&inputs.cores).copied().collect();
    }
    let irqs = on_workers
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let fix = if allowed.is_empty() {
        "every online core is a worker core: leave at least one core for interrupts and housekeeping".to_owned()
    } else {
        let allowed = cpulist::format(&allowed);
        format!(
            "stop irqbalance from moving them back (`systemctl stop irqbalance`, or IRQBALANCE_BANNED_CPULIST={} in /etc/default/irqbalance), then `for i in {irqs}; do echo {allowed} > /proc/irq/$i/smp_affinity_list; done`",
            cpulist::format(&inputs.cores)
        )
    };
    Finding::warn(
        "irq.affinity",
        format!(
            "{summary}: IRQ(s) {irqs} may fire on worker core(s) {}, stealing cycles from the busy-poll loop",
            cpulist::format(&inputs.cores)
        ),
        fix,
    )
}

fn fact<T: Into<Value> + Clone, E: ToString>(r: &Result<T, E>) -> Value {
    match r {
        Ok(v) => v.clone().into(),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// One port's facts, and the GID the engine would select on it.
fn port_json(p: &PortFacts, gid_index: Option<u32>) -> Value {
    let selected = p
        .gids
        .as_ref()
        .ok()
        .and_then(|t| gid::select(t, gid_index, p.port).ok())
        .map_or(Value::Null, |e| json!(e.index));
    json!({
        "port": p.port,
        "state": p.state.as_ref().map(|s| s.name.clone()).map_or_else(|e| json!({"error": e}), Value::from),
        "state_code": p.state.as_ref().map(|s| s.code).map_or(Value::Null, Value::from),
        "active_mtu": fact(&p.active_mtu),
        "max_mtu": fact(&p.max_mtu),
        "link_layer": p.link_layer.as_ref().map(|l| l.name()).map_or_else(|e| json!({"error": e}), Value::from),
        "gids": p.gids.as_ref().map(|t| t.iter().map(|e| json!({
            "index": e.index,
            "gid": e.as_ipv6().to_string(),
            "type": e.kind,
        })).collect::<Vec<_>>()).map_or_else(|e| json!({"error": e}), Value::from),
        "selected_gid": selected,
    })
}

/// The devices examined, for `--json`.
pub fn device_facts(inputs: &Inputs<'_>) -> Value {
    let root = inputs.root;
    let list: Vec<Value> = inputs
        .inventory
        .devices
        .iter()
        .map(|dev| {
            let kind = classify(root, &dev.name);
            let (netdev, bus_id, driver) = match &kind {
                Ok(DeviceKind::SoftRoce { netdev, .. }) => (json!(netdev), Value::Null, Value::Null),
                Ok(DeviceKind::Hardware { bus_id, driver, .. }) => (
                    netdev_of(root, &dev.name, kind.as_ref().ok()).map_or(Value::Null, Value::from),
                    json!(bus_id),
                    fact(driver),
                ),
                _ => (Value::Null, Value::Null, Value::Null),
            };
            let numa = match &kind {
                Ok(k) => match device_numa(root, &dev.name, k) {
                    Ok(Some((n, _))) => json!(n),
                    Ok(None) => Value::Null,
                    Err(e) => json!({ "error": e.to_string() }),
                },
                Err(_) => Value::Null,
            };
            let ports = match &dev.ports {
                Ok(ports) => Value::Array(
                    ports
                        .iter()
                        .map(|p| port_json(p, inputs.config.qp.gid_index))
                        .collect(),
                ),
                Err(e) => json!({ "error": e }),
            };
            json!({
                "name": dev.name,
                "kind": kind.as_ref().map(|k| k.name()).map_or_else(|e| json!({"error": e.to_string()}), Value::from),
                "softroce": matches!(kind, Ok(DeviceKind::SoftRoce { .. })),
                "sysfs_path": kind.as_ref().ok().map(|k| match k {
                    DeviceKind::SoftRoce { path, .. } | DeviceKind::Software { path } | DeviceKind::Hardware { path, .. } => path.clone(),
                }),
                "netdev": netdev,
                "bus_id": bus_id,
                "driver": driver,
                "numa_node": numa,
                "limits": match &dev.limits {
                    Ok(l) => json!({
                        "max_qp": l.max_qp,
                        "max_cq": l.max_cq,
                        "max_mr": l.max_mr,
                        "max_pd": l.max_pd,
                        "max_srq": l.max_srq,
                        "max_srq_wr": l.max_srq_wr,
                        "max_qp_wr": l.max_qp_wr,
                        "max_cqe": l.max_cqe,
                        "max_sge": l.max_sge,
                        "max_qp_rd_atom": l.max_qp_rd_atom,
                        "phys_port_cnt": l.phys_port_cnt,
                        "vendor_id": l.vendor_id,
                        "vendor_part_id": l.vendor_part_id,
                    }),
                    Err(e) => json!({ "error": e }),
                },
                "max_inline_data": fact(&dev.max_inline_data),
                "ports": ports,
            })
        })
        .collect();
    Value::Array(list)
}
