//! Shared set-up for the device tests: a connected pair of endpoints on the
//! RDMA device named by `PINPOLL_DEVICE`, by either connection method.
//! These tests run inside `scripts/softroce-vm`; without a device they fail
//! with the reason instead of passing silently.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use pinpoll::connect::cm::{Connector, Listener};
use pinpoll::connect::oob::Prepared;
use pinpoll::connect::{parse_socket_addr, RegionDescriptor};
use pinpoll::{
    Access, Connection, Endpoint, EngineConfig, MemoryRegion, PageSize, QpConfig, RemoteSlice,
};

pub const REGION: usize = 64 * 1024;
/// Receives are posted into the upper half of `local`, in slots of this size.
pub const RECV_SLOT: usize = 4096;
pub const RECV_BASE: usize = REGION / 2;
pub const RECVS: u64 = 8;
pub const RECV_WR_BASE: u64 = 1000;
pub const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Cm,
    Oob,
}

/// One side of a connection: its endpoint, a local buffer (send source,
/// receive and READ target), a region it exposes to the peer, and the
/// peer's exposed region.
pub struct Side {
    pub ep: Endpoint,
    pub local: MemoryRegion,
    pub exposed: MemoryRegion,
    pub remote: RemoteSlice,
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

fn regions(ep: &Endpoint) -> (MemoryRegion, MemoryRegion) {
    let local = ep
        .register(REGION, PageSize::Base, Access::LOCAL_WRITE)
        .expect("register local buffer");
    let exposed = ep
        .register(
            REGION,
            PageSize::Base,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .expect("register exposed region");
    (local, exposed)
}

fn post_receives(ep: &mut Endpoint, local: &MemoryRegion) {
    for i in 0..RECVS {
        let at = RECV_BASE + i as usize * RECV_SLOT;
        ep.qp()
            .post_recv(
                RECV_WR_BASE + i,
                Some(local.slice(at..at + RECV_SLOT).unwrap()),
            )
            .expect("post_recv");
    }
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
    let (local, exposed) = regions(req.endpoint());
    post_receives(req.endpoint(), &local);
    let descriptor = RegionDescriptor(exposed.remote(0..REGION).unwrap()).encode();
    let ep = req.accept(&descriptor).expect("accept");
    let remote = RegionDescriptor::decode(ep.peer_private_data())
        .expect("client's region")
        .0;
    Side {
        ep,
        local,
        exposed,
        remote,
    }
}

/// The client side of a connection to an rdma_cm listener at `addr`.
pub fn cm_client_side(addr: SocketAddr) -> Side {
    let mut conn = Connector::resolve(addr, &config()).expect("resolve");
    let (local, exposed) = regions(conn.endpoint());
    post_receives(conn.endpoint(), &local);
    let descriptor = RegionDescriptor(exposed.remote(0..REGION).unwrap()).encode();
    let ep = conn.connect(&descriptor).expect("connect");
    let remote = RegionDescriptor::decode(ep.peer_private_data())
        .expect("server's region")
        .0;
    Side {
        ep,
        local,
        exposed,
        remote,
    }
}

fn oob_side(stream: &mut TcpStream) -> Side {
    let mut prepared = Prepared::new(
        Some(&device()),
        &config(),
        Access::REMOTE_WRITE | Access::REMOTE_READ,
    )
    .expect("prepare QP");
    let (local, exposed) = regions(prepared.endpoint());
    post_receives(prepared.endpoint(), &local);
    let ep = prepared
        .handshake(stream, Some(exposed.remote(0..REGION).unwrap()))
        .expect("handshake");
    let remote = ep.remote_region().expect("peer exposed a region");
    Side {
        ep,
        local,
        exposed,
        remote,
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
