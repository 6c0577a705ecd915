//! Connected pairs on the device of [`crate::env`], by either connection
//! method: endpoints with an exposed region and posted receives
//! ([`pair`]), and fast-path connections ([`cm_pair`], [`oob_pair`]).

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use pinpoll::connect::cm::{Connector, Listener};
use pinpoll::connect::oob::Prepared;
use pinpoll::connect::RegionDescriptor;
use pinpoll::{
    Access, Connection, Endpoint, EngineConfig, MemoryRegion, PageSize, Posted, QpConfig,
    RemoteSlice, SharedRegion, WorkDone,
};

use crate::env::{cm_addr, device};

/// The size of the region each side exposes to its peer.
pub const REGION: usize = 64 * 1024;
/// Each side keeps [`RECVS`] receives posted, each into its own region.
pub const RECV_SLOT: usize = 4096;
pub const RECVS: usize = 8;
/// The bound of every wait for a completion or a connection.
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

/// Short retry and timeouts, but never 0: errors surface in well under a
/// second.
pub fn config() -> QpConfig {
    let mut built = QpConfig::default();
    built.max_inline_data = 64;
    built.timeout = 10;
    built.retry_count = 3;
    built.rnr_retry = 3;
    built.connect_timeout = WAIT;
    built
}

/// What a side sets up on its endpoint before it connects: the exposed
/// region (fresh, so a fresh rkey) and the posted receives.
struct Before {
    exposed: SharedRegion,
    receives: VecDeque<Posted>,
}

impl Before {
    fn on(ep: &mut Endpoint) -> Before {
        let exposed = ep
            .register_shared(REGION, PageSize::Base, true)
            .expect("register exposed region");
        let receives = (0..RECVS)
            .map(|_| {
                let region = ep
                    .register(RECV_SLOT, PageSize::Base, Access::LOCAL_WRITE)
                    .expect("register a receive buffer");
                ep.post_recv(Some(region)).expect("post_recv")
            })
            .collect();
        Before { exposed, receives }
    }

    fn exposed_remote(&self) -> RemoteSlice {
        self.exposed
            .remote(0..REGION)
            .expect("the whole exposed region")
    }

    /// The rdma_cm private data announcing the exposed region.
    fn descriptor(&self) -> [u8; RegionDescriptor::LEN] {
        RegionDescriptor(self.exposed_remote()).encode()
    }

    fn connected(self, ep: Endpoint, remote: RemoteSlice) -> Side {
        Side {
            ep,
            exposed: self.exposed,
            remote,
            receives: self.receives,
        }
    }

    /// The side, once rdma_cm connected `ep`: the peer's region comes in
    /// its private data.
    fn connected_cm(self, ep: Endpoint) -> Side {
        let remote = RegionDescriptor::decode(ep.peer_private_data())
            .expect("the peer's region in its private data")
            .0;
        self.connected(ep, remote)
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
    let before = Before::on(req.endpoint());
    let ep = req.accept(&before.descriptor()).expect("accept");
    before.connected_cm(ep)
}

/// The client side of a connection to an rdma_cm listener at `addr`.
pub fn cm_client_side(addr: SocketAddr) -> Side {
    let mut conn = Connector::resolve(addr, &config()).expect("resolve");
    let before = Before::on(conn.endpoint());
    let ep = conn.connect(&before.descriptor()).expect("connect");
    before.connected_cm(ep)
}

fn oob_side(stream: &mut TcpStream) -> Side {
    let mut prepared = Prepared::new(
        Some(&device()),
        &config(),
        Access::REMOTE_WRITE | Access::REMOTE_READ,
    )
    .expect("prepare QP");
    let before = Before::on(prepared.endpoint());
    let ep = prepared
        .handshake(stream, Some(before.exposed_remote()))
        .expect("handshake");
    let remote = ep.remote_region().expect("peer exposed a region");
    before.connected(ep, remote)
}

fn oob_sides() -> (Side, Side) {
    over_loopback_tcp(oob_side)
}

/// Runs `side` on both ends of a fresh loopback TCP connection, the server
/// end on a thread; returns (client, server).
fn over_loopback_tcp<T: Send + 'static>(side: fn(&mut TcpStream) -> T) -> (T, T) {
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    let addr = tcp.local_addr().expect("bound address");
    let server = std::thread::spawn(move || {
        let (mut stream, _) = tcp.accept().expect("accept TCP");
        side(&mut stream)
    });
    let mut stream = TcpStream::connect(addr).expect("connect TCP");
    let client = side(&mut stream);
    (client, server.join().expect("server thread"))
}

/// Small queues and rings, short timeouts: back-pressure and errors show
/// within a few operations.
pub fn engine_config() -> EngineConfig {
    let mut built = EngineConfig::default();
    built.qp = config();
    built.qp.max_send_wr = 16;
    built.qp.max_recv_wr = 32;
    built.qp.cq_depth = 64;
    built.batch_size = 8;
    built.signal_interval = 4;
    built.inline_threshold = 64;
    built.slot_size = 4096;
    built.slot_count = 32;
    built.completion_timeout = WAIT;
    built
}

/// A connected (client, server) pair of fast-path connections over rdma_cm.
pub fn cm_pair(cfg: &EngineConfig) -> (Connection, Connection) {
    let listener = Listener::bind(cm_addr()).expect("rdma_cm listen on the rxe address");
    let addr = listener.local_addr().expect("bound address");
    let scfg = cfg.clone();
    let server =
        std::thread::spawn(move || Connection::accept(&listener, &scfg, WAIT).expect("accept"));
    let client = Connection::connect(addr, cfg).expect("connect");
    (client, server.join().expect("server thread"))
}

/// The same over the out-of-band TCP exchange.
pub fn oob_pair(cfg: &EngineConfig) -> (Connection, Connection) {
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
    let addr = tcp.local_addr().expect("bound address");
    let scfg = cfg.clone();
    let dev = device();
    let server = std::thread::spawn(move || {
        let (mut s, _) = tcp.accept().expect("accept TCP");
        Connection::over_tcp(&mut s, Some(&dev), &scfg).expect("server over_tcp")
    });
    let mut stream = TcpStream::connect(addr).expect("connect TCP");
    let client = Connection::over_tcp(&mut stream, Some(&device()), cfg).expect("client over_tcp");
    (client, server.join().expect("server thread"))
}

/// Bytes `range` of `conn`'s target ring, copied out (the peer may write
/// it: no reference to it is ever held).
pub fn target_bytes(conn: &Connection, range: std::ops::Range<usize>) -> Vec<u8> {
    let mut out = vec![0u8; range.len()];
    conn.target().copy_to(range.start, &mut out).unwrap();
    out
}
