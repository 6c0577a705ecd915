//! Shared set-up for the device tests: a connected pair of endpoints on the
//! RDMA device named by `PINPOLL_DEVICE`, by either connection method.
//! These tests run inside `scripts/softroce-vm`; without a device they fail
//! with the reason instead of passing silently.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use pinpoll::connect::cm::{Connector, Listener};
use pinpoll::connect::oob::Prepared;
use pinpoll::connect::{parse_socket_addr, RegionDescriptor};
use pinpoll::{
    Access, Connection, Endpoint, EngineConfig, MemoryRegion, PageSize, Posted, QpConfig,
    RemoteSlice, SharedRegion, WorkDone,
};

pub const REGION: usize = 64 * 1024;
/// Each side keeps this many receives posted, each into its own region.
pub const RECV_SLOT: usize = 4096;
pub const RECVS: usize = 8;
pub const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Cm,
    Oob,
}

/// One side of a connection: its endpoint, the region it exposes to the
/// peer (which the peer may write at any time), the peer's exposed
/// region, and its posted receives, oldest first.
pub struct Side {
    pub ep: Endpoint,
    pub exposed: SharedRegion,
    pub remote: RemoteSlice,
    pub receives: VecDeque<Posted>,
}

impl Side {
    /// A fresh buffer holding `data` (LOCAL_WRITE, so a READ may land in it).
    pub fn buffer(&self, data: &[u8]) -> MemoryRegion {
        let mut region = self
            .ep
            .register(data.len(), PageSize::Base, Access::LOCAL_WRITE)
            .expect("register a buffer");
        region.as_mut_slice().copy_from_slice(data);
        region
    }

    /// Waits for the oldest posted receive, posts a new one behind it, and
    /// returns what arrived: the completion and the bytes received.
    pub fn next_receive(&mut self) -> (WorkDone, Vec<u8>) {
        let posted = self.receives.pop_front().expect("a posted receive");
        let done = self
            .ep
            .complete(posted, WAIT)
            .expect("a receive completion");
        let region = done.region.expect("receives have buffers");
        let bytes = region.as_slice()[..done.done.byte_len as usize].to_vec();
        let again = self.ep.post_recv(Some(region)).expect("post_recv");
        self.receives.push_back(again);
        (done.done, bytes)
    }

    /// The exposed region's bytes, copied out.
    pub fn exposed_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.exposed.len()];
        self.exposed.copy_to(0, &mut out).unwrap();
        out
    }
}

pub fn device() -> String {
    std::env::var("PINPOLL_DEVICE").unwrap_or_else(|_| {
        panic!(
            "PINPOLL_DEVICE is not set: device tests need an RDMA device. Run them with \
             `scripts/softroce-vm -- cargo test -- --include-ignored` (scripts/test.sh does)"
        )
    })
}

/// The IPv4 link-local address of the rxe netdev (rdma_cm cannot use
/// 127.0.0.0/8 on rxe).
pub fn cm_addr() -> SocketAddr {
    let host = std::env::var("PINPOLL_ADDR4")
        .expect("PINPOLL_ADDR4 is not set; run under scripts/softroce-vm");
    parse_socket_addr(&host, 0).expect("PINPOLL_ADDR4 parses")
}

pub fn config() -> QpConfig {
    QpConfig {
        max_inline_data: 64,
        // Short, but never 0: errors surface in well under a second.
        timeout: 10,
        retry_count: 3,
        rnr_retry: 3,
        connect_timeout: Duration::from_secs(10),
        ..QpConfig::default()
    }
}

fn exposed(ep: &Endpoint) -> SharedRegion {
    ep.register_shared(REGION, PageSize::Base, true)
        .expect("register exposed region")
}

fn post_receives(ep: &mut Endpoint) -> VecDeque<Posted> {
    (0..RECVS)
        .map(|_| {
            let region = ep
                .register(RECV_SLOT, PageSize::Base, Access::LOCAL_WRITE)
                .expect("register a receive buffer");
            ep.post_recv(Some(region)).expect("post_recv")
        })
        .collect()
}

/// A connected (client, server) pair.
pub fn pair(method: Method) -> (Side, Side) {
    match method {
        Method::Cm => cm_sides(),
        Method::Oob => oob_sides(),
    }
}

fn cm_sides() -> (Side, Side) {
    let listener = Listener::bind(cm_addr()).expect("rdma_cm listen on the rxe address");
    let addr = listener.local_addr().expect("bound address");
    let server = std::thread::spawn(move || cm_server_side(&listener));
    let client = cm_client_side(addr);
    (client, server.join().expect("server thread"))
}

/// The server side of the next connection on `listener`: fresh regions
/// (so a fresh rkey), receives posted, accepted.
pub fn cm_server_side(listener: &Listener) -> Side {
    let mut req = listener
        .next_request(&config(), WAIT)
        .expect("connect request");
    let exposed = exposed(req.endpoint());
    let receives = post_receives(req.endpoint());
    let descriptor = RegionDescriptor(exposed.remote(0..REGION).unwrap()).encode();
    let ep = req.accept(&descriptor).expect("accept");
    let remote = RegionDescriptor::decode(ep.peer_private_data())
        .expect("client's region")
        .0;
    Side {
        ep,
        exposed,
        remote,
        receives,
    }
}

/// The client side of a connection to an rdma_cm listener at `addr`.
pub fn cm_client_side(addr: SocketAddr) -> Side {
    let mut conn = Connector::resolve(addr, &config()).expect("resolve");
    let exposed = exposed(conn.endpoint());
    let receives = post_receives(conn.endpoint());
    let descriptor = RegionDescriptor(exposed.remote(0..REGION).unwrap()).encode();
    let ep = conn.connect(&descriptor).expect("connect");
    let remote = RegionDescriptor::decode(ep.peer_private_data())
        .expect("server's region")
        .0;
    Side {
        ep,
        exposed,
        remote,
        receives,
    }
}

fn oob_side(stream: &mut TcpStream) -> Side {
    let mut prepared = Prepared::new(
        Some(&device()),
        &config(),
        Access::REMOTE_WRITE | Access::REMOTE_READ,
    )
    .expect("prepare QP");
    let exposed = exposed(prepared.endpoint());
    let receives = post_receives(prepared.endpoint());
    let ep = prepared
        .handshake(stream, Some(exposed.remote(0..REGION).unwrap()))
        .expect("handshake");
    let remote = ep.remote_region().expect("peer exposed a region");
    Side {
        ep,
        exposed,
        remote,
        receives,
    }
}

fn oob_sides() -> (Side, Side) {
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    let addr = tcp.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = tcp.accept().expect("accept TCP");
        oob_side(&mut stream)
    });
    let mut stream = TcpStream::connect(addr).expect("connect TCP");
    let client = oob_side(&mut stream);
    (client, server.join().expect("server thread"))
}

/// A deterministic, position-dependent pattern, different per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Small queues and rings, short timeouts: back-pressure and errors show
/// within a few operations.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        qp: QpConfig {
            max_send_wr: 16,
            max_recv_wr: 32,
            cq_depth: 64,
            ..config()
        },
        batch_size: 8,
        signal_interval: 4,
        inline_threshold: 64,
        slot_size: 4096,
        slot_count: 32,
        completion_timeout: Duration::from_secs(10),
        ..EngineConfig::default()
    }
}

/// A connected (client, server) pair of fast-path connections over rdma_cm.
pub fn cm_pair(cfg: &EngineConfig) -> (Connection, Connection) {
    let listener = Listener::bind(cm_addr()).unwrap();
    let addr = listener.local_addr().unwrap();
    let scfg = cfg.clone();
    let server = std::thread::spawn(move || {
        Connection::accept(&listener, &scfg, Duration::from_secs(10)).unwrap()
    });
    let client = Connection::connect(addr, cfg).unwrap();
    (client, server.join().unwrap())
}

/// The same over the out-of-band TCP exchange.
pub fn oob_pair(cfg: &EngineConfig) -> (Connection, Connection) {
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = tcp.local_addr().unwrap();
    let scfg = cfg.clone();
    let dev = device();
    let server = std::thread::spawn(move || {
        let (mut s, _) = tcp.accept().unwrap();
        Connection::over_tcp(&mut s, Some(&dev), &scfg).unwrap()
    });
    let mut stream = TcpStream::connect(addr).unwrap();
    let client = Connection::over_tcp(&mut stream, Some(&device()), cfg).unwrap();
    (client, server.join().unwrap())
}

/// Bytes `range` of `conn`'s target ring, copied out (the peer may write
/// it: no reference to it is ever held).
pub fn target_bytes(conn: &Connection, range: std::ops::Range<usize>) -> Vec<u8> {
    let mut out = vec![0u8; range.len()];
    conn.target().copy_to(range.start, &mut out).unwrap();
    out
}
