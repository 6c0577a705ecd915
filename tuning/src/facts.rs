//! What the RDMA devices say about themselves: an [`Inventory`] gathered
//! from pinpoll's verbs queries ([`gather_verbs`]) or, without verbs (a
//! fixture root, or a device that cannot be opened), from sysfs
//! ([`gather_sysfs`]). The doctor's checks take an `Inventory` as input, so
//! tests build one by hand.

use pinpoll::device::{self, Device};
use pinpoll::gid::{self, GidEntry, SYSFS_INFINIBAND};

use crate::root::SystemRoot;

/// Where the device facts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// libibverbs (`ibv_get_device_list`, `ibv_query_*`), through pinpoll.
    Verbs,
    /// sysfs only: no verbs queries were made (`--root`).
    Sysfs,
}

/// Every device the system lists, and the facts of those examined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub source: Source,
    /// Names of every RDMA device (`ibv_get_device_list`, or the entries of
    /// `/sys/class/infiniband`); `Err` says why the list could not be had.
    pub listing: Result<Vec<String>, String>,
    /// The devices examined (all of them, or the one asked for).
    pub devices: Vec<DeviceFacts>,
}

/// One device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    pub name: String,
    /// `ibv_query_device`.
    pub limits: Result<DeviceLimits, String>,
    /// Ports 1..=phys_port_cnt (or the port directories in sysfs).
    pub ports: Result<Vec<PortFacts>, String>,
    /// The largest `max_inline_data` an RC queue pair (1 SGE, 16 WRs) was
    /// created with: probed by creating queue pairs, at most 4096 (the
    /// engine's own limit).
    pub max_inline_data: Result<u32, String>,
}

/// The device limits a profile must fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    pub max_qp: u32,
    pub max_cq: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    pub max_sge: u32,
    pub max_qp_rd_atom: u32,
    pub phys_port_cnt: u8,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
}

/// One port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFacts {
    pub port: u8,
    pub state: Result<PortState, String>,
    /// Bytes (256..=4096).
    pub active_mtu: Result<u32, String>,
    pub max_mtu: Result<u32, String>,
    pub link_layer: Result<LinkLayer, String>,
    /// Populated GIDs with their sysfs type (`RoCE v2`, `IB/RoCE v1`, or
    /// empty on InfiniBand).
    pub gids: Result<Vec<GidEntry>, String>,
}

/// `enum ibv_port_state`: its number and name (`4`, `ACTIVE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortState {
    pub code: u32,
    pub name: String,
}

impl PortState {
    pub const ACTIVE: u32 = 4;

    pub fn is_active(&self) -> bool {
        self.code == Self::ACTIVE
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE.
    Ethernet,
}

impl LinkLayer {
    pub fn name(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
        }
    }
}

/// The error and every cause under it, on one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

fn ib_dir(dev: &str) -> String {
    format!("{SYSFS_INFINIBAND}/{dev}")
}

/// Facts from sysfs alone, under `root`: the device list from
/// `/sys/class/infiniband`, port state, link layer and GIDs from the port
/// directories. Limits, MTUs and the inline probe need verbs and are
/// reported as unknown with `why`.
pub fn gather_sysfs(root: &SystemRoot, only: Option<&str>, why: &str) -> Inventory {
    let listing = sysfs_devices(root);
    let devices = match &listing {
        Ok(names) => names
            .iter()
            .filter(|n| only.is_none_or(|o| o == n.as_str()))
            .map(|name| DeviceFacts {
                name: name.clone(),
                limits: Err(why.to_owned()),
                ports: sysfs_ports(root, name, why),
                max_inline_data: Err(why.to_owned()),
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    Inventory {
        source: Source::Sysfs,
        listing,
        devices,
    }
}

/// The entries of `/sys/class/infiniband` (none when it is absent: no RDMA
/// driver is loaded).
pub fn sysfs_devices(root: &SystemRoot) -> Result<Vec<String>, String> {
    match root.list(SYSFS_INFINIBAND) {
        Ok(names) => Ok(names),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}

fn sysfs_ports(root: &SystemRoot, dev: &str, why: &str) -> Result<Vec<PortFacts>, String> {
    let names = root
        .list(&format!("{}/ports", ib_dir(dev)))
        .map_err(|e| e.to_string())?;
    Ok(names
        .iter()
        .filter_map(|n| n.parse::<u8>().ok())
        .map(|port| {
            let dir = format!("{}/ports/{port}", ib_dir(dev));
            PortFacts {
                port,
                state: root
                    .read_trim(&format!("{dir}/state"))
                    .map_err(|e| e.to_string())
                    .and_then(|s| parse_sysfs_state(&s)),
                active_mtu: Err(why.to_owned()),
                max_mtu: Err(why.to_owned()),
                link_layer: root
                    .read_trim(&format!("{dir}/link_layer"))
                    .map_err(|e| e.to_string())
                    .and_then(|s| parse_link_layer(&s)),
                gids: sysfs_gids(root, dev, port),
            }
        })
        .collect())
}

/// `4: ACTIVE` → (4, ACTIVE).
pub fn parse_sysfs_state(text: &str) -> Result<PortState, String> {
    let (code, name) = text
        .split_once(':')
        .ok_or_else(|| format!("port state {text:?} is not \"N: NAME\""))?;
    Ok(PortState {
        code: code
            .trim()
            .parse()
            .map_err(|_| format!("port state {text:?} is not \"N: NAME\""))?,
        name: name.trim().to_owned(),
    })
}

fn parse_link_layer(text: &str) -> Result<LinkLayer, String> {
    match text {
        "Ethernet" => Ok(LinkLayer::Ethernet),
        "InfiniBand" => Ok(LinkLayer::InfiniBand),
        other => Err(format!("unknown link layer {other:?}")),
    }
}

fn sysfs_gids(root: &SystemRoot, dev: &str, port: u8) -> Result<Vec<GidEntry>, String> {
    let dir = format!("{}/ports/{port}/gids", ib_dir(dev));
    let names = root.list(&dir).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for index in names.iter().filter_map(|n| n.parse::<u32>().ok()) {
        // Unpopulated RoCE entries read as zero or fail (EINVAL): skip both.
        let Ok(text) = root.read_trim(&format!("{dir}/{index}")) else {
            continue;
        };
        let Some(gid) = parse_gid(&text) else {
            continue;
        };
        let entry = GidEntry {
            index,
            gid,
            kind: gid::gid_kind(&root.path(SYSFS_INFINIBAND), dev, port, index),
        };
        if !entry.is_zero() {
            out.push(entry);
        }
    }
    Ok(out)
}

/// `fe80:0000:0000:0000:5054:00ff:fe50:0001` → 16 bytes.
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        let v = u16::from_str_radix(g, 16).ok()?;
        gid[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(gid)
}

/// Facts from libibverbs through pinpoll: `ibv_get_device_list`, then for
/// each examined device `ibv_open_device`, `ibv_query_device`,
/// `ibv_query_port` and `ibv_query_gid` on every port (GID types from sysfs,
/// as pinpoll reads them), and an inline-size probe. A device that cannot be
/// opened falls back to its sysfs facts.
pub fn gather_verbs(root: &SystemRoot, only: Option<&str>) -> Inventory {
    let names = match device::list_devices() {
        Ok(list) => list.into_iter().map(|d| d.name).collect::<Vec<_>>(),
        // ENOSYS: the kernel has no uverbs at all, which means no device.
        Err(pinpoll::Error::NoDevice) => Vec::new(),
        Err(e) => {
            tracing::debug!(error = %error_chain(&e), "ibv_get_device_list");
            let mut inv = gather_sysfs(root, only, &error_chain(&e));
            inv.source = Source::Verbs;
            inv.listing = Err(error_chain(&e));
            return inv;
        }
    };
    let devices = names
        .iter()
        .filter(|n| only.is_none_or(|o| o == n.as_str()))
        .map(|name| verbs_device(root, name))
        .collect();
    Inventory {
        source: Source::Verbs,
        listing: Ok(names),
        devices,
    }
}

fn verbs_device(root: &SystemRoot, name: &str) -> DeviceFacts {
    tracing::debug!(device = name, "ibv_open_device");
    let ctx = match Device::open(Some(name)) {
        Ok(ctx) => ctx,
        Err(e) => {
            let why = error_chain(&e);
            return DeviceFacts {
                name: name.to_owned(),
                limits: Err(why.clone()),
                ports: sysfs_ports(root, name, &why),
                max_inline_data: Err(why),
            };
        }
    };
    let limits = ctx
        .query_device()
        .map(|a| DeviceLimits {
            max_qp: a.max_qp,
            max_cq: a.max_cq,
            max_mr: a.max_mr,
            max_pd: a.max_pd,
            max_srq: a.max_srq,
            max_srq_wr: a.max_srq_wr,
            max_qp_wr: a.max_qp_wr,
            max_cqe: a.max_cqe,
            max_sge: a.max_sge,
            max_qp_rd_atom: a.max_qp_rd_atom,
            phys_port_cnt: a.phys_port_cnt,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
        })
        .map_err(|e| error_chain(&e));
    let ports = match &limits {
        Ok(l) => Ok((1..=l.phys_port_cnt)
            .map(|port| verbs_port(root, &ctx, port))
            .collect()),
        Err(why) => sysfs_ports(root, name, why),
    };
    DeviceFacts {
        name: name.to_owned(),
        limits,
        ports,
        max_inline_data: probe_max_inline(&ctx),
    }
}

fn verbs_port(root: &SystemRoot, ctx: &Device, port: u8) -> PortFacts {
    tracing::debug!(device = ctx.name(), port, "ibv_query_port");
    match ctx.query_port(port) {
        Ok(attr) => PortFacts {
            port,
            state: Ok(PortState {
                code: attr.state,
                name: attr.state_name().to_owned(),
            }),
            active_mtu: Ok(device::mtu_bytes(attr.active_mtu)),
            max_mtu: Ok(device::mtu_bytes(attr.max_mtu)),
            link_layer: Ok(if attr.is_ethernet() {
                LinkLayer::Ethernet
            } else {
                LinkLayer::InfiniBand
            }),
            gids: gid::gid_table(ctx, port, attr.gid_tbl_len, &root.path(SYSFS_INFINIBAND))
                .map_err(|e| error_chain(&e)),
        },
        Err(e) => {
            let why = error_chain(&e);
            PortFacts {
                port,
                state: Err(why.clone()),
                active_mtu: Err(why.clone()),
                max_mtu: Err(why.clone()),
                link_layer: Err(why.clone()),
                gids: Err(why),
            }
        }
    }
}

/// The engine never asks for more inline data than this (QpConfig).
pub const ENGINE_MAX_INLINE: u32 = 4096;

/// The largest `max_inline_data` the device grants an RC queue pair with
/// one SGE, up to the engine's own limit (the device reports it nowhere).
fn probe_max_inline(ctx: &std::sync::Arc<Device>) -> Result<u32, String> {
    let found = device::max_inline_data(ctx, ENGINE_MAX_INLINE)
        .map_err(|e| format!("cannot create a probe queue pair: {}", error_chain(&e)))?;
    tracing::debug!(device = ctx.name(), max_inline_data = found, "inline probe");
    Ok(found)
}
