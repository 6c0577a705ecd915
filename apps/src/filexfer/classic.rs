//! Serving clients of the classic "rdma-file-transfer" example, unchanged.
//!
//! Its protocol: no connect private data; control messages are a 24-byte
//! C struct `{int32 id; pad 4; uint64 addr; uint32 rkey; pad 4}` in host
//! byte order, sent with SEND (`MSG_MR=1, MSG_READY=2, MSG_DONE=3`). The
//! server registers a 10 MiB buffer (local + remote write) and SENDs
//! `MSG_MR` with its address and rkey; the client RDMA-writes the file
//! name (NUL-terminated) with WRITE_WITH_IMM whose immediate is the
//! length; the server opens the file and SENDs `MSG_READY`; each chunk of
//! up to 10 MiB goes the same way; a zero-length write ends the file and
//! the server answers `MSG_DONE`. The server posts a zero-SGE receive for
//! each write-with-imm.
//!
//! This server applies the same rules as to native clients: the name is
//! validated, the data go to a temporary file that is fsynced and linked
//! into place without overwriting (the classic protocol has no checksum,
//! so integrity rests on RC's own CRCs).

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use pinpoll::{Access, Endpoint, MemoryRegion, PageSize, Posted, RegionOp, SharedRegion, WcOpcode};

use crate::filexfer::in_flight::InFlight;
use crate::filexfer::name;
use crate::filexfer::pace::Pace;
use crate::filexfer::server_dir::ServerDir;
use crate::filexfer::source::Source;
use crate::filexfer::space::Space;
use crate::filexfer::temp::{self, TempFile};
use crate::filexfer::{explain_link, summary};
use crate::output::{printable, Output};

/// The classic server's buffer: 10 MiB.
pub const BUFFER: usize = 10 << 20;
pub const MSG_MR: i32 = 1;
pub const MSG_READY: i32 = 2;
pub const MSG_DONE: i32 = 3;
/// Bytes of a control message.
pub const MSG_LEN: usize = 24;

/// A control message in the classic layout (host byte order).
pub fn encode(id: i32, addr: u64, rkey: u32) -> [u8; MSG_LEN] {
    let mut b = [0u8; MSG_LEN];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    b[8..16].copy_from_slice(&addr.to_ne_bytes());
    b[16..20].copy_from_slice(&rkey.to_ne_bytes());
    b
}

/// `(id, addr, rkey)` of a control message.
pub fn decode(b: &[u8]) -> anyhow::Result<(i32, u64, u32)> {
    pinpoll::wire::record("classic", b);
    ensure!(
        b.len() == MSG_LEN,
        "a classic message of {} bytes, expected {MSG_LEN}",
        b.len()
    );
    Ok((
        i32::from_ne_bytes(b[0..4].try_into().expect("4 bytes")),
        u64::from_ne_bytes(b[8..16].try_into().expect("8 bytes")),
        u32::from_ne_bytes(b[16..20].try_into().expect("4 bytes")),
    ))
}

/// The file name in what a classic client wrote first: the path it sends,
/// NUL-terminated, of which only the last component counts, validated
/// ([`name::validate`]).
pub fn file_name(written: &[u8]) -> Result<&str, name::BadName> {
    pinpoll::wire::record("classic", written);
    let raw = written.strip_suffix(&[0]).unwrap_or(written);
    let base = raw.rsplit(|b| *b == b'/').next().unwrap_or(raw);
    name::validate(base)
}

/// A classic connection's memory, registered (and its first receive
/// posted) before accepting.
pub struct ClassicSide {
    /// The client RDMA-writes here: read only by copying out.
    buffer: SharedRegion,
    /// The control message to send; `None` while a send is posted (and
    /// after one failed, which ends the connection).
    msg: Option<MemoryRegion>,
    /// The receive posted for the client's next write with immediate.
    recv: Option<Posted>,
}

impl ClassicSide {
    pub fn prepare(ep: &mut Endpoint, pages: PageSize) -> anyhow::Result<ClassicSide> {
        let buffer = ep
            .register_shared(BUFFER, pages, false)
            .context("registering the classic 10 MiB buffer")?;
        let msg = ep
            .register(MSG_LEN, PageSize::Base, Access::LOCAL_READ)
            .context("registering the message buffer")?;
        let recv = ep.post_recv(None).context("posting a receive")?;
        Ok(ClassicSide {
            buffer,
            msg: Some(msg),
            recv: Some(recv),
        })
    }

    fn send(&mut self, ep: &mut Endpoint, id: i32, timeout: Duration) -> anyhow::Result<()> {
        let buffer = self.buffer.remote(0..BUFFER)?;
        let mut msg = self
            .msg
            .take()
            .context("the message buffer went with an earlier failed send")?;
        msg.as_mut_slice()
            .copy_from_slice(&encode(id, buffer.addr, buffer.rkey));
        let posted = ep
            .post(msg, MSG_LEN, RegionOp::Send)
            .context("sending a control message")?;
        let c = ep
            .complete(posted, timeout)
            .map_err(|e| explain_link(e.into(), "client"))?;
        ensure!(
            c.done.opcode == WcOpcode::SEND,
            "unexpected send completion"
        );
        self.msg = c.region;
        Ok(())
    }

    /// Waits for the next write-with-imm, re-posting the receive; returns
    /// the length written, which the immediate must announce exactly: the
    /// bytes past what the client wrote are stale, never data.
    fn next_write(&mut self, ep: &mut Endpoint, timeout: Duration) -> anyhow::Result<usize> {
        let posted = self
            .recv
            .take()
            .context("no receive is posted after an earlier failure")?;
        let c = ep
            .complete(posted, timeout)
            .map_err(|e| explain_link(e.into(), "client"))?;
        ensure!(
            c.done.opcode == WcOpcode::RECV_RDMA_WITH_IMM,
            "the classic client sent a {} instead of a write with immediate",
            c.done.opcode
        );
        self.recv = Some(ep.post_recv(None).context("posting a receive")?);
        let announced = c.done.imm.unwrap_or(0);
        ensure!(
            announced == c.done.byte_len,
            "the classic client announced {announced} bytes but wrote {}",
            c.done.byte_len
        );
        let len = announced as usize;
        ensure!(
            len <= BUFFER,
            "the classic client announced {len} bytes; the buffer has {BUFFER}"
        );
        Ok(len)
    }

    /// Serves one classic client: the file's name, its data until an
    /// empty write, then the file durable and in place, then `MSG_DONE`.
    pub fn serve(mut self, mut ep: Endpoint, job: &ClassicJob<'_>) -> anyhow::Result<()> {
        let timeout = job.timeout;
        self.send(&mut ep, MSG_MR, timeout)?;
        // What the client wrote is copied out of its reach once, and only
        // the copy is looked at: what is checked is what is stored.
        let mut copy = vec![0u8; BUFFER];
        let name = self.read_name(&mut ep, &mut copy, timeout)?;
        let shown = printable(name.as_bytes());
        // Held until the file is in place or the transfer failed.
        let _reserved = job.in_flight.reserve(&name).ok_or_else(|| {
            anyhow::anyhow!(
                "{shown} already exists on the server (another client is sending it now)"
            )
        })?;
        if job
            .dir
            .entry(&name)
            .with_context(|| format!("checking {shown} on the server"))?
            .is_some()
        {
            bail!("{shown} already exists on the server");
        }
        let mut temp =
            TempFile::create(job.dir, job.serial).context("creating a temporary file")?;
        let began = Instant::now();
        let result = self
            .receive(&mut ep, &mut temp, &mut copy, job, &shown)
            .and_then(|total| put_in_place(&temp, &name, job.dir, &shown).map(|()| total));
        // The temp name goes, whether the file is in place or not.
        drop(temp);
        let total = result?;
        self.say_done(&mut ep, timeout)?;
        job.out.progress(format_args!(
            "client {}: received {shown} (classic): {}",
            job.peer,
            summary(total, began.elapsed())
        ))?;
        // The classic client disconnects after MSG_DONE.
        if let Some(recv) = self.recv.take() {
            let _ = ep.complete(recv, timeout.min(Duration::from_secs(2)));
        }
        let _ = ep.disconnect();
        Ok(())
    }

    /// The file's name: the last component of the path the client wrote.
    fn read_name(
        &mut self,
        ep: &mut Endpoint,
        copy: &mut [u8],
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let len = self
            .next_write(ep, timeout)
            .context("waiting for the file name")?;
        let raw = &mut copy[..len];
        self.buffer.copy_to(0, raw)?;
        Ok(file_name(raw)?.to_owned())
    }

    /// Receives the file's data into `temp` until the client's empty
    /// write, within the server's size cap and pace; returns its length.
    fn receive(
        &mut self,
        ep: &mut Endpoint,
        temp: &mut TempFile,
        copy: &mut [u8],
        job: &ClassicJob<'_>,
        shown: &str,
    ) -> anyhow::Result<u64> {
        let (cap, cap_name) = job.space.classic_cap(job.dir);
        job.out.progress(format_args!(
            "client {}: receiving {shown} (classic)",
            job.peer
        ))?;
        self.send(ep, MSG_READY, job.timeout)?;
        let mut total = 0u64;
        loop {
            let len = self
                .next_write(ep, job.timeout)
                .context("receiving the file")?;
            if len == 0 {
                return Ok(total);
            }
            if total + len as u64 > cap {
                bail!("{shown} is more than {cap} bytes ({cap_name} of the server); the transfer was cut off and nothing kept");
            }
            let chunk = &mut copy[..len];
            self.buffer.copy_to(0, chunk)?;
            temp.file_mut()
                .write_all(chunk)
                .context("writing the file")?;
            total += len as u64;
            job.pace
                .arrived(len as u64)
                .map_err(|slow| anyhow::anyhow!("{shown}: {slow}; nothing kept"))?;
            self.send(ep, MSG_READY, job.timeout)?;
        }
    }

    /// Sends `MSG_DONE`: the file is in place.
    fn say_done(&mut self, ep: &mut Endpoint, timeout: Duration) -> anyhow::Result<()> {
        match self.send(ep, MSG_DONE, timeout) {
            Ok(()) => Ok(()),
            // The file is in place. A classic client disconnects the moment
            // MSG_DONE arrives, and its DREQ can overtake the ACK of that
            // very SEND, flushing it here: the client has it all the same.
            Err(e)
                if matches!(
                    e.downcast_ref::<pinpoll::Error>(),
                    Some(pinpoll::Error::Disconnected)
                ) =>
            {
                tracing::debug!("classic client left before MSG_DONE's completion");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// What the server gives one classic transfer.
pub struct ClassicJob<'a> {
    pub dir: &'a ServerDir,
    /// Names the temporary file.
    pub serial: u64,
    pub timeout: Duration,
    pub peer: &'a str,
    pub out: Output,
    /// `--min-rate` and `--deadline`, over the whole transfer.
    pub pace: Pace,
    /// `--max-size` and `--min-free`.
    pub space: &'a Space,
    /// The names being received: this one is held until it is in place.
    pub in_flight: &'a InFlight,
}

/// Makes the received `temp` durable and links the file written (by its
/// descriptor, whatever its temp name is now) as `target` in `dir`, then
/// makes the directory entry durable.
fn put_in_place(temp: &TempFile, target: &str, dir: &ServerDir, shown: &str) -> anyhow::Result<()> {
    temp.file().sync_all().context("fsync")?;
    temp.link_as(target)
        .with_context(|| format!("linking {shown} into place"))?;
    temp::sync_dir_after_link(dir, shown).map_err(anyhow::Error::msg)
}

/// `filexfer send --classic`: sends `path` (under the name `name`) to a
/// classic rdma-file-transfer server.
pub fn send(
    source: &Source,
    name: &str,
    addr: std::net::SocketAddr,
    cfg: &pinpoll::EngineConfig,
    device: Option<&str>,
    out: Output,
) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let shown = printable(name.as_bytes());
    let (file, size) = (source.file(), source.size());
    let mut client = ClassicClient::connect(addr, cfg, device)?;
    out.progress(format_args!(
        "connected to {addr} on {} (classic)",
        client.ep.device_name()
    ))?;
    let began = Instant::now();
    let (raddr, rkey) = client.next_msg(MSG_MR, "the server's buffer (MSG_MR)")?;
    let remote = pinpoll::RemoteSlice {
        addr: raddr,
        len: BUFFER as u64,
        rkey,
    };
    client.write(remote, name.len() + 1, |buf| {
        let (text, nul) = buf.split_at_mut(name.len());
        text.copy_from_slice(name.as_bytes());
        nul[0] = 0;
        Ok(())
    })?;
    client.next_msg(MSG_READY, "the server to open the file (MSG_READY)")?;
    let mut offset = 0u64;
    while offset < size {
        let len = (size - offset).min(BUFFER as u64) as usize;
        client.write(remote, len, |buf| {
            file.read_exact_at(buf, offset)
                .with_context(|| format!("reading {shown} at byte {offset}"))
        })?;
        client.next_msg(MSG_READY, "the server to store a chunk (MSG_READY)")?;
        offset += len as u64;
    }
    // The classic protocol cannot abort a file: a file that changed
    // meanwhile ends the connection before the empty write that would
    // complete it, and the server keeps nothing.
    source.check_unchanged()?;
    client.write(remote, 0, |_| Ok(()))?;
    client.next_msg(MSG_DONE, "the server to finish the file (MSG_DONE)")?;
    let elapsed = began.elapsed();
    if let Err(e) = client.ep.disconnect() {
        tracing::debug!(error = %e, "disconnecting");
    }
    out.progress(format_args!(
        "sent {shown} (classic): {}",
        summary(size, elapsed)
    ))?;
    Ok(())
}

/// The classic client's connection: the receive posted for the server's
/// next message, and the buffer the file goes out of, each `None` while
/// the NIC has it (and after a failure, which ends the transfer).
struct ClassicClient {
    ep: Endpoint,
    recv: Option<Posted>,
    src: Option<MemoryRegion>,
    timeout: Duration,
}

impl ClassicClient {
    /// Connects with no private data, a receive posted first.
    fn connect(
        addr: std::net::SocketAddr,
        cfg: &pinpoll::EngineConfig,
        device: Option<&str>,
    ) -> anyhow::Result<ClassicClient> {
        let mut connector = pinpoll::connect::cm::Connector::resolve(addr, &cfg.qp)
            .with_context(|| format!("connecting to {addr}"))?;
        crate::session::check_device(connector.endpoint(), device)
            .with_context(|| format!("connecting to {addr}"))?;
        let ep = connector.endpoint();
        let recv = ep
            .register(MSG_LEN, PageSize::Base, Access::LOCAL_WRITE)
            .context("registering the message buffer")?;
        let src = ep
            .register(BUFFER, cfg.pages, Access::LOCAL_READ)
            .context("registering the 10 MiB send buffer")?;
        let recv = ep.post_recv(Some(recv)).context("posting a receive")?;
        let ep = connector
            .connect(&[])
            .with_context(|| format!("connecting to {addr}"))?;
        Ok(ClassicClient {
            ep,
            recv: Some(recv),
            src: Some(src),
            timeout: cfg.completion_timeout,
        })
    }

    /// Waits for the server's next message, which must be `want`, and
    /// posts the receive again; returns the message's address and rkey.
    fn next_msg(&mut self, want: i32, what: &str) -> anyhow::Result<(u64, u32)> {
        let posted = self
            .recv
            .take()
            .context("no receive is posted after an earlier failure")?;
        let c = self
            .ep
            .complete(posted, self.timeout)
            .map_err(|e| explain_link(e.into(), "server"))
            .with_context(|| format!("waiting for {what}"))?;
        ensure!(
            c.done.opcode == WcOpcode::RECV,
            "the server sent a {} instead of a message",
            c.done.opcode
        );
        let recv = c.region.context("the receive gave no buffer back")?;
        let (id, raddr, rkey) = decode(&recv.as_slice()[..c.done.byte_len as usize])?;
        ensure!(
            id == want,
            "the server sent message {id} instead of {what} ({want})"
        );
        self.recv = Some(self.ep.post_recv(Some(recv)).context("posting a receive")?);
        Ok((raddr, rkey))
    }

    /// RDMA-writes `len` bytes, which `fill` puts into the send buffer,
    /// to `remote` with the immediate `len`.
    fn write(
        &mut self,
        remote: pinpoll::RemoteSlice,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut src = self
            .src
            .take()
            .context("the send buffer went with an earlier failed write")?;
        fill(&mut src.as_mut_slice()[..len])?;
        let write = RegionOp::Write {
            remote,
            imm: Some(len as u32),
        };
        let posted = self
            .ep
            .post(src, len, write)
            .context("posting an RDMA write")?;
        let c = self
            .ep
            .complete(posted, self.timeout)
            .map_err(|e| explain_link(e.into(), "server"))
            .context("writing into the server's buffer")?;
        ensure!(
            c.done.opcode == WcOpcode::RDMA_WRITE,
            "unexpected {} completion",
            c.done.opcode
        );
        self.src = c.region;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_use_the_c_layout() {
        let m = encode(MSG_MR, 0x1122_3344_5566_7788, 0xabcd);
        assert_eq!(&m[0..4], &1i32.to_ne_bytes());
        assert_eq!(&m[4..8], &[0; 4]);
        assert_eq!(decode(&m).unwrap(), (1, 0x1122_3344_5566_7788, 0xabcd));
        assert!(decode(&m[..23]).is_err());
    }

    #[test]
    fn the_file_name_is_the_last_component_of_the_path_written() {
        assert_eq!(file_name(b"/home/user/data.bin\0"), Ok("data.bin"));
        assert_eq!(file_name(b"data.bin"), Ok("data.bin"));
        assert_eq!(file_name(b"../../etc/passwd\0"), Ok("passwd"));
        assert_eq!(file_name(b"dir/\0"), Err(name::BadName::Empty));
        assert_eq!(file_name(b"dir/..\0"), Err(name::BadName::DotDot));
        assert_eq!(file_name(b"a\0b\0"), Err(name::BadName::Nul));
        assert_eq!(file_name(b"\0"), Err(name::BadName::Empty));
    }
}
