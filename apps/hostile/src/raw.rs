//! A native filexfer client that sends what the real one never would.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use pinpoll::connect::cm::{Connector, HalfOpen};
use pinpoll::connect::RegionDescriptor;
use pinpoll::{Access, Connection, RemoteSlice};
use pinpoll_apps::filexfer::digest::ChunkGeometry;
use pinpoll_apps::filexfer::protocol::{Msg, HELLO};
use pinpoll_apps::filexfer::{engine_config, SLOT_SIZE};

/// Private data that decodes as a ring descriptor followed by `hello`: the
/// server gets as far as its handshake with it.
pub fn with_descriptor(hello: &[u8]) -> Vec<u8> {
    let ring = RegionDescriptor(RemoteSlice {
        addr: 0x10_0000,
        len: 1 << 20,
        rkey: 1,
    });
    let mut private = ring.encode().to_vec();
    private.extend_from_slice(hello);
    private
}

/// Sends a connect request with `private` and never answers the reply.
pub fn half_open(addr: SocketAddr, timeout: Duration, private: &[u8]) -> anyhow::Result<HalfOpen> {
    let qp = engine_config(timeout, false).qp;
    Ok(Connector::resolve(addr, &qp)?.connect_half_open(private)?)
}

/// A connected first stream.
pub fn connect(addr: SocketAddr, timeout: Duration) -> anyhow::Result<Connection> {
    Ok(Connection::builder(&engine_config(timeout, false))
        .remote_access(Access::LOCAL_READ)
        .private_data(&HELLO)
        .connect(addr)?)
}

/// The server's next message.
pub fn next_msg(conn: &mut Connection) -> anyhow::Result<Msg> {
    let m = conn.recv().context("waiting for the server")?;
    if m.imm.is_some() {
        bail!("the server wrote into this side's memory");
    }
    Ok(Msg::decode(m.data)?)
}

/// Sends `Start` and returns the server's answer.
pub fn start(conn: &mut Connection, name: &str, size: u64, streams: u16) -> anyhow::Result<Msg> {
    let start = Msg::Start {
        size,
        streams,
        name: name.as_bytes().to_vec(),
    };
    conn.send(&start.encode())?;
    next_msg(conn)
}

/// Keeps `conn` alive (heartbeats answered) without sending for `pause`.
fn idle(conn: &mut Connection, pause: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + pause;
    while Instant::now() < until {
        conn.reap()?;
        if conn.peer_gone()? {
            bail!("the server left");
        }
        conn.keepalive()?;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Sends `data` as chunks into the `slots` of the server's ring, one
/// every `pause`, then `Finish`; returns the server's last answer.
pub fn send_slowly(
    conn: &mut Connection,
    slots: u32,
    data: &[u8],
    pause: Duration,
) -> anyhow::Result<Msg> {
    let geometry = ChunkGeometry::v3(data.len() as u64);
    let chunk_len = pinpoll_apps::filexfer::CHUNK as usize;
    for (i, chunk) in data.chunks(chunk_len).enumerate() {
        let cv = geometry.chunk_cv(i as u64, chunk)?;
        let mut bytes = chunk.to_vec();
        bytes.extend_from_slice(&cv);
        let slot = i as u32 % slots;
        conn.write(&bytes, u64::from(slot) * u64::from(SLOT_SIZE), Some(slot))?;
        match next_msg(conn)? {
            Msg::Credit { .. } => {}
            other => return Ok(other),
        }
        idle(conn, pause)?;
    }
    let digest = *blake3::hash(data).as_bytes();
    conn.send(
        &Msg::Finish {
            size: data.len() as u64,
            digest,
        }
        .encode(),
    )?;
    next_msg(conn)
}
