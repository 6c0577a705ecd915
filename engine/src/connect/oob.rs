//! Connecting by an out-of-band exchange over TCP: each side sends a
//! [`ConnectionRecord`], then moves its QP RESET→INIT→RTR→RTS by hand.
//! This is how perftest connects without `-R`, and it works where rdma_cm
//! cannot (no IP on the RDMA netdev, InfiniBand without IPoIB).

use std::io::{Read, Write};
use std::net::TcpStream;

use super::record::ConnectionRecord;
use crate::config::QpConfig;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::gid::{self, GidEntry};
use crate::sys::device::Context;
use crate::sys::mr::{Access, RemoteSlice};

/// A queue pair in INIT, ready for its memory to be registered and its
/// receives posted, waiting for the peer's record.
#[derive(Debug)]
pub struct Prepared {
    endpoint: Endpoint,
    gid: GidEntry,
    psn: u32,
    cfg: QpConfig,
}

impl Prepared {
    /// Opens `device` (or the first whose port 1 is active), creates the endpoint and
    /// moves its QP to INIT allowing the remote accesses in `remote_access`
    /// (e.g. `Access::REMOTE_WRITE` for a peer that writes into us).
    pub fn new(device: Option<&str>, cfg: &QpConfig, remote_access: Access) -> Result<Prepared> {
        let ctx = Context::open(device)?;
        let mut endpoint = Endpoint::create(&ctx, None, cfg)?;
        let port = endpoint.port();
        let table = gid::gid_table(
            &ctx,
            port,
            endpoint.port_attr().gid_tbl_len,
            std::path::Path::new(gid::SYSFS_INFINIBAND),
        )?;
        let gid = if endpoint.port_attr().is_ethernet() {
            gid::select(&table, cfg.gid_index, port)?
        } else {
            // InfiniBand routes by LID; the GID is informational.
            gid::select(&table, cfg.gid_index, port).unwrap_or(GidEntry {
                index: 0,
                gid: [0; 16],
                kind: String::new(),
            })
        };
        endpoint.qp().enter_init(port, remote_access)?;
        let psn = initial_psn();
        Ok(Prepared {
            endpoint,
            gid,
            psn,
            cfg: cfg.clone(),
        })
    }

    /// The endpoint, to register memory and post receives on before the
    /// handshake.
    pub fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.endpoint
    }

    /// The GID this side routes from.
    pub fn gid(&self) -> &GidEntry {
        &self.gid
    }

    /// This side's record, exposing `region` to the peer.
    pub fn record(&mut self, region: Option<RemoteSlice>) -> ConnectionRecord {
        ConnectionRecord {
            qpn: self.endpoint.qp().qp_num(),
            psn: self.psn,
            lid: self.endpoint.port_attr().lid,
            gid: self.gid.gid,
            gid_index: self.gid.index as u8,
            mtu: self.endpoint.port_attr().active_mtu as u8,
            region,
        }
    }

    /// Swaps records with the peer over `stream`, brings the QP to RTS,
    /// then waits for the peer to be at RTS too (one byte each way), so the
    /// first message is never sent to a QP that would drop it.
    pub fn handshake(
        mut self,
        stream: &mut TcpStream,
        region: Option<RemoteSlice>,
    ) -> Result<Endpoint> {
        let io = |op: &'static str| move |source: std::io::Error| timeout_or(op, source);
        stream
            .set_read_timeout(Some(self.cfg.connect_timeout))
            .map_err(io("setting the socket timeout"))?;
        stream
            .set_write_timeout(Some(self.cfg.connect_timeout))
            .map_err(io("setting the socket timeout"))?;
        stream
            .set_nodelay(true)
            .map_err(io("setting TCP_NODELAY"))?;

        let mine = self.record(region);
        stream
            .write_all(&mine.encode())
            .map_err(io("sending the connection record"))?;
        let mut buf = [0u8; ConnectionRecord::LEN];
        stream
            .read_exact(&mut buf)
            .map_err(io("receiving the peer's connection record"))?;
        let peer = ConnectionRecord::decode(&buf)?;

        let path = crate::sys::qp::PeerPath {
            qpn: peer.qpn,
            psn: peer.psn,
            lid: peer.lid,
            gid: peer.gid,
            global: self.endpoint.port_attr().is_ethernet() || peer.lid == 0,
            sgid_index: self.gid.index as u8,
            mtu: u32::from(peer.mtu).min(self.endpoint.port_attr().active_mtu),
        };
        self.endpoint.qp().enter_rtr(&path, &self.cfg)?;
        self.endpoint.qp().enter_rts(self.psn, &self.cfg)?;

        stream.write_all(b"R").map_err(io("signalling ready"))?;
        let mut ready = [0u8; 1];
        stream
            .read_exact(&mut ready)
            .map_err(io("waiting for the peer to be ready"))?;
        if ready != *b"R" {
            return Err(Error::BadRecord(format!(
                "expected the ready byte 'R', got {:#04x}",
                ready[0]
            )));
        }
        self.endpoint.mark_connected(Vec::new(), peer.region);
        Ok(self.endpoint)
    }
}

fn timeout_or(op: &'static str, source: std::io::Error) -> Error {
    match source.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout {
            what: "the peer's out-of-band exchange",
            waited: std::time::Duration::ZERO,
        },
        _ => Error::Exchange { op, source },
    }
}

/// A 24-bit initial packet sequence number that differs between
/// connections and processes: std's hasher keys come from the OS's random
/// source once per process, the count makes each call's input new, and
/// the process id and the clock part a forked child (which inherits the
/// keys and the count) from its parent. (A PSN only has to be hard to
/// guess off-path; it is no secret.)
fn initial_psn() -> u32 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let input = (n, std::process::id(), now);
    (std::collections::hash_map::RandomState::new().hash_one(input) & 0xff_ffff) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn initial_psns_are_24_bits_and_spread() {
        let psns: std::collections::BTreeSet<u32> = (0..64).map(|_| super::initial_psn()).collect();
        assert!(psns.iter().all(|p| *p < 1 << 24), "{psns:?}");
        assert!(
            psns.len() > 60,
            "64 connections, {} distinct PSNs",
            psns.len()
        );
    }
}
