//! The machine's topology as sysfs and procfs describe it: NUMA nodes and
//! their CPUs, the bus device behind an RDMA device, the node it is local
//! to, and its interrupts. The doctor's NUMA and IRQ checks judge these.

use std::collections::{BTreeMap, BTreeSet};

use pinpoll::gid::SYSFS_INFINIBAND;

use crate::cpulist::{self, CpuSet};
use crate::doctor::DeviceKind;
use crate::root::{basename, ReadError, SystemRoot};

/// The directory of RDMA device `dev` in sysfs.
pub fn ib_dir(dev: &str) -> String {
    format!("{SYSFS_INFINIBAND}/{dev}")
}

/// The CPUs online (`/sys/devices/system/cpu/online`); empty when unreadable.
pub fn online_cpus(root: &SystemRoot) -> CpuSet {
    root.read_trim("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| cpulist::parse(&s).ok())
        .unwrap_or_default()
}

/// NUMA nodes and their CPUs (`/sys/devices/system/node/nodeN/cpulist`).
/// An absent node directory is a kernel without NUMA: one node.
pub fn numa_nodes(root: &SystemRoot) -> Result<BTreeMap<u32, CpuSet>, String> {
    let names = match root.list("/sys/devices/system/node") {
        Ok(n) => n,
        Err(e) if e.is_not_found() => return Ok(BTreeMap::new()),
        Err(e) => return Err(e.to_string()),
    };
    let mut nodes = BTreeMap::new();
    for name in names {
        let Some(n) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = format!("/sys/devices/system/node/{name}/cpulist");
        let text = root.read_trim(&path).map_err(|e| e.to_string())?;
        nodes.insert(
            n,
            cpulist::parse(&text).map_err(|e| format!("{path}: {e}"))?,
        );
    }
    Ok(nodes)
}

/// The NUMA node a device's traffic is local to: `numa_node` of its bus
/// device (for SoftRoCE, of its netdev's device). `Ok(None)`: there is no
/// device (a virtual netdev).
pub fn device_numa(
    root: &SystemRoot,
    dev: &str,
    kind: &DeviceKind,
) -> Result<Option<(i64, String)>, ReadError> {
    let dir = match bus_device(root, dev, kind) {
        None => return Ok(None),
        Some(d) => d?,
    };
    let file = format!("{dir}/numa_node");
    let text = root.read_trim(&file)?;
    let node = text.parse::<i64>().map_err(|_| ReadError {
        path: root.path(&file).display().to_string(),
        kind: std::io::ErrorKind::InvalidData,
        reason: format!("{text:?} is not a number"),
    })?;
    Ok(Some((node, file)))
}

/// One line of /proc/interrupts: the IRQ number and its description (chip,
/// hwirq, name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqLine {
    pub irq: u32,
    pub desc: String,
}

pub fn parse_interrupts(text: &str) -> Vec<IrqLine> {
    let mut lines = text.lines();
    let ncpu = lines
        .next()
        .map(|h| {
            h.split_whitespace()
                .filter(|w| w.starts_with("CPU"))
                .count()
        })
        .unwrap_or(0);
    lines
        .filter_map(|line| {
            let (num, rest) = line.trim_start().split_once(':')?;
            let irq = num.trim().parse::<u32>().ok()?;
            let desc: Vec<&str> = rest.split_whitespace().skip(ncpu).collect();
            Some(IrqLine {
                irq,
                desc: desc.join(" "),
            })
        })
        .collect()
}

/// `0000:3b:00.0`: a PCI function's address.
fn is_pci_id(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && name
            .chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The bus device (a path under /sys/devices) that carries a device's
/// traffic: the NIC itself, or (SoftRoCE) its netdev's device; walks up from
/// a virtio device to the PCI function that owns the MSI vectors and the
/// NUMA node. `None`: there is none (a virtual netdev, a software device).
pub fn bus_device(
    root: &SystemRoot,
    dev: &str,
    kind: &DeviceKind,
) -> Option<Result<String, ReadError>> {
    let link = match kind {
        DeviceKind::Hardware { .. } => format!("{}/device", ib_dir(dev)),
        DeviceKind::SoftRoce { netdev, .. } => {
            let d = format!("/sys/class/net/{netdev}/device");
            if !root.exists(&d) {
                return None;
            }
            d
        }
        DeviceKind::Software { .. } => return None,
    };
    let mut path = match root.canonical(&link) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    // A virtio (or other bus) device under a PCI function: the function
    // owns the interrupts.
    let mut up = path.clone();
    for _ in 0..2 {
        if is_pci_id(basename(&path)) {
            break;
        }
        match up.rfind('/') {
            Some(i) if i > "/sys/devices".len() => up.truncate(i),
            _ => break,
        }
        if is_pci_id(basename(&up)) {
            path = up.clone();
        }
    }
    Some(Ok(path))
}

/// The interrupts of a bus device, and how they were found.
pub struct DeviceIrqs {
    pub lines: Vec<IrqLine>,
    /// "matched by PCI address", "matched by msi_irqs", ...
    pub how: String,
}

/// The lines of /proc/interrupts that belong to the bus device at
/// `bus_path`: those naming its PCI address or listed in its `msi_irqs`;
/// failing both, those named after `driver`'s completion vectors (some
/// drivers name vectors without the address: mlx5_core -> mlx5_comp).
pub fn device_irqs(
    root: &SystemRoot,
    bus_path: &str,
    driver: Option<&str>,
) -> Result<DeviceIrqs, ReadError> {
    let bus_id = basename(bus_path);
    let msi: BTreeSet<u32> = match root.list(&format!("{bus_path}/msi_irqs")) {
        Ok(names) => names.iter().filter_map(|n| n.parse().ok()).collect(),
        Err(e) if e.is_not_found() => BTreeSet::new(),
        Err(e) => return Err(e),
    };
    let table = parse_interrupts(&root.read("/proc/interrupts")?);
    let lines: Vec<IrqLine> = table
        .iter()
        .filter(|l| l.desc.contains(bus_id) || msi.contains(&l.irq))
        .cloned()
        .collect();
    let by_name = lines.iter().any(|l| l.desc.contains(bus_id));
    let by_msi = lines.iter().any(|l| msi.contains(&l.irq));
    let how = match (by_name, by_msi) {
        (true, true) => "matched by PCI address and msi_irqs",
        (true, false) => "matched by PCI address",
        _ => "matched by msi_irqs",
    };
    match driver {
        Some(driver) if lines.is_empty() => {
            let pattern = format!("{}_comp", driver.trim_end_matches("_core"));
            Ok(DeviceIrqs {
                lines: table
                    .into_iter()
                    .filter(|l| l.desc.contains(&pattern))
                    .collect(),
                how: format!("matched by driver name {pattern} (no line names {bus_id})"),
            })
        }
        _ => Ok(DeviceIrqs {
            lines,
            how: how.to_owned(),
        }),
    }
}
