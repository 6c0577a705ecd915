//! The peer: a thread that owns the other end of both connections and
//! keeps the NIC busy — RDMA WRITEs into this side's exposed region and
//! target ring all the time, and the SENDs it is told to make — while it
//! checks every message this side sends it, in order, byte for byte.
//!
//! It sends no more than this side has receives for (the runner tells
//! it how many), and says how many of this side's messages it has taken,
//! so this side never sends beyond the receives the peer has posted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pinpoll::{Access, CompleteError, Connection, MemoryRegion, PageSize, Posted, RegionOp};
use pinpoll_testkit::pair::{Side, RECV_SLOT};

use crate::bytes::{check_message, message, peer_message_len, Stream};

/// The longest any wait for the peer lasts.
const PATIENCE: Duration = Duration::from_secs(20);
/// The peer's own sends and noise WRITEs in flight on the endpoint.
const EP_SENDS: usize = 6;

enum Command {
    EndpointSends(u64),
    ConnectionSends(u64),
}

#[derive(Default)]
struct Shared {
    /// This side's messages the peer took, per connection.
    endpoint_got: AtomicU64,
    connection_got: AtomicU64,
    /// This side is closing: errors are expected from now on.
    closing: AtomicBool,
    stop: AtomicBool,
    failure: Mutex<Option<String>>,
}

pub struct Peer {
    commands: Sender<Command>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    /// Starts the peer on its ends of both connections.
    pub fn start(side: Side, conn: Connection) -> Peer {
        let (commands, rx) = channel();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("model-peer".into())
            .spawn(move || run(side, conn, rx, s))
            .expect("spawn the peer");
        Peer {
            commands,
            shared,
            thread: Some(thread),
        }
    }

    pub fn endpoint_sends(&self, n: u64) {
        let _ = self.commands.send(Command::EndpointSends(n));
    }

    pub fn connection_sends(&self, n: u64) {
        let _ = self.commands.send(Command::ConnectionSends(n));
    }

    /// What went wrong at the peer, if anything did.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().unwrap().clone()
    }

    /// Waits until the peer has taken all but `window` of this side's
    /// `sent` endpoint (or connection) messages, so one more finds a
    /// receive posted.
    pub fn wait_room(&self, endpoint: bool, sent: u64, window: u64) -> Result<(), String> {
        let got = if endpoint {
            &self.shared.endpoint_got
        } else {
            &self.shared.connection_got
        };
        let start = Instant::now();
        while sent.saturating_sub(got.load(Ordering::Acquire)) >= window {
            if let Some(f) = self.failure() {
                return Err(f);
            }
            if start.elapsed() > PATIENCE {
                return Err(format!(
                    "the peer took only {} of this side's {sent} messages in {PATIENCE:?}",
                    got.load(Ordering::Acquire)
                ));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// This side starts closing: the peer stops working and checking.
    pub fn closing(&self) {
        self.shared.closing.store(true, Ordering::Release);
    }

    /// Stops the peer (its ends close) and reports what went wrong before
    /// this side started closing.
    pub fn stop(mut self) -> Result<(), String> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| "the peer thread panicked".to_string())?;
        }
        self.failure().map_or(Ok(()), Err)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(side: Side, conn: Connection, rx: Receiver<Command>, shared: Arc<Shared>) {
    let mut ep = PeerEndpoint::new(side);
    let mut c = PeerConnection::new(conn);
    let mut broken = false;
    while !shared.stop.load(Ordering::Acquire) {
        for cmd in rx.try_iter() {
            match cmd {
                Command::EndpointSends(n) => ep.owed += n,
                Command::ConnectionSends(n) => c.owed += n,
            }
        }
        if broken || shared.closing.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let turn = ep
            .turn(&shared.endpoint_got)
            .and_then(|a| Ok(c.turn(&shared.connection_got)? | a));
        match turn {
            Ok(true) => {}
            Ok(false) => std::thread::yield_now(),
            Err(e) => {
                // Errors after this side began closing are its doing.
                if !shared.closing.load(Ordering::Acquire) {
                    *shared.failure.lock().unwrap() = Some(format!("peer: {e}"));
                }
                broken = true;
            }
        }
    }
}

/// The peer's endpoint: receives for this side's SENDs, its own SENDs of
/// numbered messages, and WRITEs into this side's exposed region.
struct PeerEndpoint {
    side: Side,
    spare: Vec<MemoryRegion>,
    sends: VecDeque<Posted>,
    owed: u64,
    next_message: u64,
    expect: u64,
    noise: u64,
}

impl PeerEndpoint {
    fn new(side: Side) -> PeerEndpoint {
        PeerEndpoint {
            side,
            spare: Vec::new(),
            sends: VecDeque::new(),
            owed: 0,
            next_message: 0,
            expect: 0,
            noise: 0,
        }
    }

    fn region(&mut self) -> Result<MemoryRegion, String> {
        match self.spare.pop() {
            Some(r) => Ok(r),
            None => self
                .side
                .ep
                .register(RECV_SLOT, PageSize::Base, Access::LOCAL_WRITE)
                .map_err(|e| format!("register: {e}")),
        }
    }

    /// One round of everything; whether anything happened.
    fn turn(&mut self, got: &AtomicU64) -> Result<bool, String> {
        let mut progress = false;
        if let Some(p) = self.side.receives.pop_front() {
            match complete_now(&mut self.side, p)? {
                Ok((region, len)) => {
                    check_message(
                        Stream::EndpointToPeer,
                        self.expect,
                        &region.as_slice()[..len],
                    )?;
                    self.expect += 1;
                    got.fetch_add(1, Ordering::AcqRel);
                    let again = self
                        .side
                        .ep
                        .post_recv(Some(region))
                        .map_err(|e| format!("post_recv: {e}"))?;
                    self.side.receives.push_back(again);
                    progress = true;
                }
                Err(p) => self.side.receives.push_front(p),
            }
        }
        if let Some(p) = self.sends.pop_front() {
            match complete_now(&mut self.side, p)? {
                Ok((region, _)) => {
                    self.spare.push(region);
                    progress = true;
                }
                Err(p) => self.sends.push_front(p),
            }
        }
        if self.sends.len() < EP_SENDS && self.owed > 0 {
            let k = self.next_message;
            let len = peer_message_len(k);
            let mut region = self.region()?;
            region.as_mut_slice()[..len].copy_from_slice(&message(Stream::PeerToEndpoint, k, len));
            let p = self
                .side
                .ep
                .post(region, len, RegionOp::Send)
                .map_err(|e| format!("post SEND: {e}"))?;
            self.sends.push_back(p);
            self.owed -= 1;
            self.next_message += 1;
            progress = true;
        } else if self.sends.len() < 2 {
            // Noise: a WRITE somewhere into this side's exposed region.
            self.noise += 1;
            let len = 64 + (self.noise * 193 % 960) as usize;
            let at = self.noise * 4099 % (self.side.remote.len - len as u64);
            let region = self.region()?;
            let remote = self
                .side
                .remote
                .sub(at, len as u64)
                .map_err(|e| e.to_string())?;
            let op = RegionOp::Write { remote, imm: None };
            let p = self
                .side
                .ep
                .post(region, len, op)
                .map_err(|e| format!("post WRITE: {e}"))?;
            self.sends.push_back(p);
        }
        Ok(progress)
    }
}

/// `complete` without waiting: the region and the length transferred, or
/// the request back while its completion is not there.
#[allow(clippy::result_large_err)]
fn complete_now(
    side: &mut Side,
    p: Posted,
) -> Result<Result<(MemoryRegion, usize), Posted>, String> {
    match side.ep.complete(p, Duration::ZERO) {
        Ok(done) => {
            let region = done.region.ok_or("a completion without its region")?;
            Ok(Ok((region, done.done.byte_len as usize)))
        }
        Err(CompleteError::Pending {
            error: pinpoll::Error::Timeout { .. },
            posted,
        }) => Ok(Err(posted)),
        Err(e) => Err(format!("complete: {e}")),
    }
}

/// The peer's connection: takes this side's messages, sends its own,
/// and WRITEs into this side's target ring.
struct PeerConnection {
    conn: Connection,
    owed: u64,
    next_message: u64,
    expect: u64,
    noise: u64,
}

impl PeerConnection {
    fn new(conn: Connection) -> PeerConnection {
        PeerConnection {
            conn,
            owed: 0,
            next_message: 0,
            expect: 0,
            noise: 0,
        }
    }

    fn turn(&mut self, got: &AtomicU64) -> Result<bool, String> {
        let mut bad = None;
        let expect = &mut self.expect;
        let n = self
            .conn
            .poll(|ev| match ev {
                pinpoll::Event::Received { data } => {
                    match check_message(Stream::ConnectionToPeer, *expect, data) {
                        Ok(()) => {
                            *expect += 1;
                            got.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(e) => bad = bad.take().or(Some(e)),
                    }
                }
                pinpoll::Event::Completed { .. } => {}
                other => bad = bad.take().or(Some(format!("peer connection: {other:?}"))),
            })
            .map_err(|e| format!("poll: {e}"))?;
        if let Some(e) = bad {
            return Err(e);
        }
        let mut progress = n > 0;
        if self.owed > 0 {
            let k = self.next_message;
            match self
                .conn
                .try_send(&message(Stream::PeerToConnection, k, peer_message_len(k)))
            {
                Ok(_) => {
                    self.owed -= 1;
                    self.next_message += 1;
                    progress = true;
                }
                Err(pinpoll::Error::Full { .. }) => {}
                Err(e) => return Err(format!("try_send: {e}")),
            }
        }
        self.noise += 1;
        if self.noise.is_multiple_of(4) {
            let len = 32 + (self.noise * 131 % 2000) as usize;
            let ring = self.conn.peer_ring().len;
            let at = self.noise * 8191 % (ring - len as u64);
            match self.conn.try_write(&vec![self.noise as u8; len], at, None) {
                Ok(_) | Err(pinpoll::Error::Full { .. }) => {}
                Err(e) => return Err(format!("try_write: {e}")),
            }
        }
        Ok(progress)
    }
}
