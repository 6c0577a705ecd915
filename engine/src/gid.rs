//! Choosing the GID a RoCE queue pair routes by.
//!
//! The verbs in rdma-core 44 do not report a GID's type, but the kernel
//! publishes it in sysfs (`.../ports/P/gid_attrs/types/N`: "IB/RoCE v1" or
//! "RoCE v2"). RoCE v2 (routable, UDP) is what ConnectX and rxe both want.

use std::path::{Path, PathBuf};

use crate::config::bad_setting;
use crate::error::{Error, Result};
use crate::sys::device::Context;

/// A GID entry and the type the kernel gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The entry's index in the port's GID table: what
    /// [`QpConfig::gid_index`](crate::QpConfig::gid_index) names.
    pub index: u32,
    /// The GID, 16 bytes in network order (on RoCE one of the netdev's
    /// IPv6 addresses, or an IPv4 one mapped into IPv6).
    pub gid: [u8; 16],
    /// "RoCE v2", "IB/RoCE v1", or empty when the kernel says nothing (IB).
    pub kind: String,
}

impl GidEntry {
    /// Whether the kernel typed it RoCE v2 (routable, over UDP/IP): the
    /// type [`select`] prefers.
    pub fn is_roce_v2(&self) -> bool {
        self.kind.trim() == "RoCE v2"
    }

    /// Whether the GID is all zeros: an unpopulated entry, which
    /// [`gid_table`] leaves out.
    pub fn is_zero(&self) -> bool {
        self.gid.iter().all(|b| *b == 0)
    }

    /// The GID as an IPv6 address (RoCE GIDs are the netdev's addresses;
    /// IPv4 ones appear as `::ffff:a.b.c.d`).
    pub fn as_ipv6(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.gid)
    }
}

/// Where the kernel's InfiniBand class lives; tests point it at a fixture.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// The type of GID `index` on `port` of `device`, read under `root`.
pub fn gid_kind(root: &Path, device: &str, port: u8, index: u32) -> String {
    let path: PathBuf = root
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs/types")
        .join(index.to_string());
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Every non-zero GID of the port, with its type.
pub fn gid_table(ctx: &Context, port: u8, table_len: u32, root: &Path) -> Result<Vec<GidEntry>> {
    let mut out = Vec::new();
    for index in 0..table_len {
        let gid = match ctx.query_gid(port, index) {
            Ok(gid) => gid,
            // Unpopulated RoCE entries can fail to query; skip them.
            Err(_) => continue,
        };
        let entry = GidEntry {
            index,
            gid,
            kind: gid_kind(root, ctx.name(), port, index),
        };
        if !entry.is_zero() {
            out.push(entry);
        }
    }
    Ok(out)
}

/// Picks the GID to use: the configured index if given, else the first
/// RoCE v2 entry, else (InfiniBand, or a kernel without the sysfs types)
/// the first non-zero entry.
pub fn select(table: &[GidEntry], wanted: Option<u32>, port: u8) -> Result<GidEntry> {
    if let Some(index) = wanted {
        return table
            .iter()
            .find(|e| e.index == index)
            .cloned()
            .ok_or_else(|| {
                bad_setting(
                    "gid_index",
                    index,
                    format!(
                        "is not a populated GID on port {port} (populated: {})",
                        table
                            .iter()
                            .map(|e| e.index.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            });
    }
    table
        .iter()
        .find(|e| e.is_roce_v2())
        .or_else(|| table.first())
        .cloned()
        .ok_or(Error::NoGid { port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, last: u8, kind: &str) -> GidEntry {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[15] = last;
        GidEntry {
            index,
            gid,
            kind: kind.into(),
        }
    }

    #[test]
    fn prefers_roce_v2_then_first_entry() {
        let table = [
            entry(0, 1, "IB/RoCE v1"),
            entry(1, 1, "RoCE v2"),
            entry(2, 2, "IB/RoCE v1"),
            entry(3, 2, "RoCE v2"),
        ];
        assert_eq!(select(&table, None, 1).unwrap().index, 1);
        assert_eq!(select(&table[..1], None, 1).unwrap().index, 0);
        assert_eq!(select(&table, Some(3), 1).unwrap().index, 3);
    }

    #[test]
    fn a_missing_index_or_an_empty_table_is_a_clear_error() {
        let table = [entry(0, 1, "RoCE v2")];
        let err = select(&table, Some(5), 1).unwrap_err().to_string();
        assert!(
            err.contains("gid_index (field qp.gid_index) = 5 is not a populated GID on port 1 (populated: 0)"),
            "{err}"
        );
        assert!(matches!(
            select(&[], None, 1),
            Err(Error::NoGid { port: 1 })
        ));
    }

    #[test]
    fn reads_gid_types_from_a_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("pinpoll-gid-{}", std::process::id()));
        let dir = root.join("rxe0/ports/1/gid_attrs/types");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("0"), "IB/RoCE v1\n").unwrap();
        std::fs::write(dir.join("1"), "RoCE v2\n").unwrap();
        assert_eq!(gid_kind(&root, "rxe0", 1, 0), "IB/RoCE v1");
        assert_eq!(gid_kind(&root, "rxe0", 1, 1), "RoCE v2");
        assert_eq!(gid_kind(&root, "rxe0", 1, 7), "");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
