//! The low-level `Endpoint`: your own `MemoryRegion`s, moved to the NIC
//! with each request and handed back with its completion — no rings, no
//! batching, stop-and-wait. One process, two sides over loopback TCP for
//! the set-up; the RDMA device is the first whose port 1 is active
//! (`PINPOLL_DEVICE` names another).
//!
//! The server exposes a `SharedRegion` (memory the peer may write: safe
//! code only copies out of it) and posts a receive; the client WRITEs
//! 64 KiB into it from a region of its own, then SENDs a message saying
//! how much it wrote. Both regions come back to their owners.
//!
//! ```text
//! scripts/softroce-vm -- cargo run -p pinpoll --example raw_endpoint
//! ```

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use pinpoll::connect::oob::Prepared;
use pinpoll::{Access, PageSize, QpConfig, RegionOp};

const TIMEOUT: Duration = Duration::from_secs(10);
const LEN: usize = 64 * 1024;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Res<()> {
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = tcp.local_addr()?;
    let server = std::thread::spawn(move || -> Res<Vec<u8>> {
        let (mut stream, _) = tcp.accept()?;
        serve(&mut stream)
    });
    let mut stream = TcpStream::connect(addr)?;
    let sent = client(&mut stream)?;
    let got = server.join().map_err(|_| "the server thread panicked")??;
    if got != sent {
        return Err("the server's region does not hold what the client wrote".into());
    }
    println!("{LEN} bytes written into the peer's region and checked; both regions returned");
    Ok(())
}

fn device() -> Option<String> {
    std::env::var("PINPOLL_DEVICE").ok()
}

/// Exposes a region for the peer's WRITE, waits for the SEND that says
/// it is done, and copies the region out.
fn serve(stream: &mut TcpStream) -> Res<Vec<u8>> {
    let mut prepared = Prepared::new(
        device().as_deref(),
        &QpConfig::default(),
        Access::REMOTE_WRITE,
    )?;
    let ep = prepared.endpoint();
    let exposed = ep.register_shared(LEN, PageSize::Base, false)?;
    // A receive must be posted before the peer's SEND can arrive.
    let inbox = ep.register(64, PageSize::Base, Access::LOCAL_WRITE)?;
    let receive = ep.post_recv(Some(inbox)).map_err(|r| r.error)?;
    let mut ep = prepared.handshake(stream, Some(exposed.remote(0..LEN)?))?;

    let done = ep.complete(receive, TIMEOUT)?;
    let inbox = done.region.ok_or("the receive's region came back")?;
    let said = &inbox.as_slice()[..done.done.byte_len as usize];
    let written: usize = std::str::from_utf8(said)?.trim().parse()?;
    let mut copy = vec![0u8; written];
    // The peer may write `exposed` at any time: copy out, never borrow.
    exposed.copy_to(0, &mut copy)?;
    Ok(copy)
}

/// WRITEs a region of its own into the peer's, then SENDs how much.
fn client(stream: &mut TcpStream) -> Res<Vec<u8>> {
    let prepared = Prepared::new(
        device().as_deref(),
        &QpConfig::default(),
        Access::LOCAL_READ,
    )?;
    let mut ep = prepared.handshake(stream, None)?;
    let remote = ep.remote_region().ok_or("the server exposed no region")?;

    let mut data = ep.register(LEN, PageSize::Base, Access::LOCAL_READ)?;
    let bytes: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    data.as_mut_slice().copy_from_slice(&bytes);
    // The region moves to the NIC with the request: nothing can touch it
    // until its completion hands it back (or a refusal does, in the error).
    let op = RegionOp::Write {
        remote: remote.sub(0, LEN as u64)?,
        imm: None,
    };
    let posted = ep.post(data, LEN, op).map_err(|r| r.error)?;
    let written = ep.complete(posted, TIMEOUT)?;
    let data = written.region.ok_or("the WRITE's region came back")?;
    if data.as_slice() != bytes.as_slice() {
        return Err("the WRITE's source changed".into());
    }

    // An RC WRITE completes once placed in the peer's memory; the SEND
    // after it says so.
    let mut note = ep.register(64, PageSize::Base, Access::LOCAL_READ)?;
    let text = LEN.to_string();
    note.as_mut_slice()[..text.len()].copy_from_slice(text.as_bytes());
    let posted = ep
        .post(note, text.len(), RegionOp::Send)
        .map_err(|r| r.error)?;
    ep.complete(posted, TIMEOUT)?;
    Ok(bytes)
}
