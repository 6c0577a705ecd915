//! Connecting by an out-of-band exchange over TCP: each side sends a
//! [`ConnectionRecord`], then moves its QP RESET→INIT→RTR→RTS by hand.
//! This is how perftest connects without `-R`, and it works where rdma_cm
//! cannot (no IP on the RDMA netdev, InfiniBand without IPoIB).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        let endpoint = Endpoint::create(&ctx, None, cfg)?;
        Prepared::with_endpoint(endpoint, cfg, remote_access)
    }

    /// [`Prepared::new`] for an endpoint made already (on queues it
    /// shares with others).
    pub(crate) fn with_endpoint(
        mut endpoint: Endpoint,
        cfg: &QpConfig,
        remote_access: Access,
    ) -> Result<Prepared> {
        let ctx = Arc::clone(endpoint.context());
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
        self,
        stream: &mut TcpStream,
        region: Option<RemoteSlice>,
    ) -> Result<Endpoint> {
        self.handshake_keeping(stream, region, |_| Ok(()))
            .map_err(|failed| failed.error)
    }

    /// [`handshake`](Self::handshake), with the peer's record checked by
    /// `check` before the queue pair can receive (RTR); a failure after
    /// that point hands the endpoint back, in RTR or RTS, for its owner
    /// to end through ERR: a queue pair on a shared receive queue may
    /// already hold one of its receives, which destroying it at once
    /// would strand.
    pub(crate) fn handshake_keeping(
        mut self,
        stream: &mut TcpStream,
        region: Option<RemoteSlice>,
        check: impl FnOnce(&ConnectionRecord) -> Result<()>,
    ) -> std::result::Result<Endpoint, HandshakeFailed> {
        let peer = self
            .exchange_records(stream, region)
            .and_then(|(exchange, peer)| {
                check(&peer)?;
                Ok((exchange, peer))
            });
        let (mut exchange, peer) = peer.map_err(HandshakeFailed::before_rtr)?;
        let path = crate::sys::qp::PeerPath {
            qpn: peer.qpn,
            psn: peer.psn,
            lid: peer.lid,
            gid: peer.gid,
            global: self.endpoint.port_attr().is_ethernet() || peer.lid == 0,
            sgid_index: self.gid.index as u8,
            mtu: u32::from(peer.mtu).min(self.endpoint.port_attr().active_mtu),
        };
        if let Err(e) = self.endpoint.qp().enter_rtr(&path, &self.cfg) {
            return Err(HandshakeFailed::before_rtr(e));
        }
        let ready = self
            .endpoint
            .qp()
            .enter_rts(self.psn, &self.cfg)
            .and_then(|()| exchange.ready());
        match ready {
            Ok(()) => {
                self.endpoint.mark_connected(Vec::new(), peer.region);
                Ok(self.endpoint)
            }
            Err(error) => Err(HandshakeFailed {
                error,
                at_rtr: Some(Box::new((self.endpoint, peer.region))),
            }),
        }
    }

    /// Sends this side's record and takes the peer's.
    fn exchange_records<'s>(
        &mut self,
        stream: &'s mut TcpStream,
        region: Option<RemoteSlice>,
    ) -> Result<(Exchange<'s>, ConnectionRecord)> {
        let mut exchange = Exchange::new(stream, self.cfg.connect_timeout)?;
        let mine = self.record(region);
        exchange.send(
            &mine.encode(),
            "sending the connection record",
            "the peer to take our connection record",
        )?;
        let mut buf = [0u8; ConnectionRecord::LEN];
        exchange.receive(
            &mut buf,
            "receiving the peer's connection record",
            "the peer's connection record",
        )?;
        Ok((exchange, ConnectionRecord::decode(&buf)?))
    }
}

/// A handshake that failed, with the endpoint if its queue pair had
/// reached RTR (it may have begun to receive), and the region the peer's
/// record exposed.
#[derive(Debug)]
pub(crate) struct HandshakeFailed {
    pub error: Error,
    /// Boxed: the error path, and an endpoint is large.
    pub at_rtr: Option<Box<(Endpoint, Option<RemoteSlice>)>>,
}

impl HandshakeFailed {
    fn before_rtr(error: Error) -> HandshakeFailed {
        HandshakeFailed {
            error,
            at_rtr: None,
        }
    }
}

/// The TCP stream of one out-of-band exchange, all of it within one
/// deadline: a socket timeout alone restarts with every read, so a peer
/// sending its record a byte at a time, each just within the connect
/// timeout, could stretch the exchange to 65 times it.
struct Exchange<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
    within: Duration,
}

impl<'a> Exchange<'a> {
    fn new(stream: &'a mut TcpStream, within: Duration) -> Result<Exchange<'a>> {
        stream.set_nodelay(true).map_err(|source| Error::Exchange {
            op: "setting TCP_NODELAY",
            source,
        })?;
        Ok(Exchange {
            stream,
            deadline: crate::wait::deadline_after(within),
            within,
        })
    }

    /// What is left of the deadline, or the timeout of the step awaiting
    /// `what` if nothing is.
    fn left(&self, what: &'static str) -> Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what,
                waited: self.within,
            });
        }
        Ok(left)
    }

    /// Sends `bytes` in the step `op`, whose timeout names `what` it
    /// awaited.
    fn send(&mut self, mut bytes: &[u8], op: &'static str, what: &'static str) -> Result<()> {
        while !bytes.is_empty() {
            let left = self.left(what)?;
            self.stream
                .set_write_timeout(Some(left))
                .map_err(|source| Error::Exchange { op, source })?;
            match self.stream.write(bytes) {
                Ok(0) => {
                    return Err(Error::Exchange {
                        op,
                        source: std::io::ErrorKind::WriteZero.into(),
                    })
                }
                Ok(n) => bytes = &bytes[n..],
                Err(e) if waits_again(&e) => {}
                Err(source) => return Err(Error::Exchange { op, source }),
            }
        }
        Ok(())
    }

    /// Fills `buf` in the step `op`, whose timeout names `what` it
    /// awaited.
    fn receive(&mut self, mut buf: &mut [u8], op: &'static str, what: &'static str) -> Result<()> {
        while !buf.is_empty() {
            let left = self.left(what)?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|source| Error::Exchange { op, source })?;
            match self.stream.read(buf) {
                Ok(0) => {
                    return Err(Error::Exchange {
                        op,
                        source: std::io::ErrorKind::UnexpectedEof.into(),
                    })
                }
                Ok(n) => buf = &mut buf[n..],
                Err(e) if waits_again(&e) => {}
                Err(source) => return Err(Error::Exchange { op, source }),
            }
        }
        Ok(())
    }

    /// Says this side is at RTS (one byte), then waits for the peer's
    /// byte saying the same, so the first message is never sent to a
    /// queue pair that would drop it.
    fn ready(&mut self) -> Result<()> {
        self.send(b"R", "signalling ready", "the peer to take our ready byte")?;
        let mut ready = [0u8; 1];
        self.receive(
            &mut ready,
            "waiting for the peer to be ready",
            "the peer's ready byte",
        )?;
        if ready != *b"R" {
            return Err(Error::BadRecord(format!(
                "expected the ready byte 'R', got {:#04x}",
                ready[0]
            )));
        }
        Ok(())
    }
}

impl Drop for Exchange<'_> {
    /// Leaves the stream with the connect timeout on its reads and
    /// writes, as the exchange always has: a caller that goes on using the
    /// stream never inherits what was left of the deadline.
    fn drop(&mut self) {
        let _ = self.stream.set_read_timeout(Some(self.within));
        let _ = self.stream.set_write_timeout(Some(self.within));
    }
}

/// Whether a read or write ended only because its socket timeout (or a
/// signal) did: the deadline decides whether to wait again.
fn waits_again(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
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
    use std::io::Write as _;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::Exchange;
    use crate::error::Error;

    /// A peer that sends its record a byte at a time, each byte well
    /// within the connect timeout, is given up when the timeout has
    /// passed for the whole exchange, not only for one read.
    #[test]
    fn a_record_trickled_byte_by_byte_ends_at_the_connect_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let trickler = std::thread::spawn(move || {
            for _ in 0..64 {
                if peer.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        let mut exchange = Exchange::new(&mut ours, Duration::from_millis(500)).unwrap();
        let got = exchange.receive(
            &mut [0u8; 64],
            "receiving the peer's connection record",
            "the peer's connection record",
        );
        assert!(
            matches!(got, Err(Error::Timeout { .. })),
            "the whole record takes 1.6 s: {got:?}"
        );
        let Err(Error::Timeout { what, waited }) = got else {
            unreachable!()
        };
        // The step, not only "the exchange"; and the whole budget.
        assert_eq!(what, "the peer's connection record");
        assert_eq!(waited, Duration::from_millis(500));
        drop(exchange);
        drop(ours);
        trickler.join().unwrap();
    }
    /// A connect timeout past what the clock can add (`Duration::MAX`,
    /// through the public `QpConfig`) is no panic: the deadline is as far
    /// as the clock goes, and the exchange runs.
    #[test]
    fn a_connect_timeout_past_the_clock_s_range_does_not_panic() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        peer.write_all(b"rec").unwrap();
        let mut exchange = Exchange::new(&mut ours, Duration::MAX).unwrap();
        let mut got = [0u8; 3];
        exchange
            .receive(
                &mut got,
                "receiving the peer's connection record",
                "the peer's connection record",
            )
            .unwrap();
        assert_eq!(&got, b"rec");
    }

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
