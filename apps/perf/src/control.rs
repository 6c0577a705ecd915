//! The client and server agree on every measurement over a control
//! channel: the TCP stream of the out-of-band exchange (`--oob`), or a
//! small rdma_cm connection of its own. Messages are JSON; the client
//! sends [`Msg::Params`], the server answers [`Msg::Ready`] and follows,
//! or [`Msg::Error`] saying why not. What arrives is decoded strictly
//! ([`decode`]): at most [`MAX_MSG`] bytes, no unknown field, every
//! number in its range.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use pinpoll::{Connection, EngineConfig, Event, QpConfig};
use serde::{Deserialize, Serialize};

use crate::plan::Params;

/// Largest control message.
pub const MAX_MSG: usize = 4096;
/// How long a waiting side naps between two looks at the channel.
const NAP: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Msg {
    /// The client's next measurement.
    Params(Params),
    /// The server has its side ready; connect, with `nonce` in the data
    /// connection's handshake (rdma_cm): the server takes no other.
    Ready { nonce: u64 },
    /// The client finished the measurement.
    Done,
    /// The server finished its side (it answered this many pings or
    /// consumed this many messages).
    Served { messages: u64 },
    /// No more measurements.
    End,
    /// The sender cannot go on.
    Error { message: String },
}

/// `msg` as it travels.
pub fn encode(msg: &Msg) -> Result<Vec<u8>> {
    let bytes = serde_json::to_vec(msg).context("encoding a control message")?;
    if bytes.len() > MAX_MSG {
        bail!("control message of {} bytes is too long", bytes.len());
    }
    Ok(bytes)
}

/// A message that arrived but is not one this side accepts: the text
/// says why, for the peer too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMessage(pub String);

impl std::fmt::Display for BadMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadMessage {}

/// The message in `bytes`, checked: a known type with exactly its fields,
/// and for [`Msg::Params`] every field in its range ([`Params::check`]).
pub fn decode(bytes: &[u8]) -> std::result::Result<Msg, BadMessage> {
    pinpoll::wire::record("perf_control", bytes);
    if bytes.len() > MAX_MSG {
        return Err(BadMessage(format!(
            "control message of {} bytes is too long (at most {MAX_MSG})",
            bytes.len()
        )));
    }
    let shown = || {
        format!(
            "{:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        )
    };
    let bad = |e: serde_json::Error| BadMessage(format!("bad control message {}: {e}", shown()));
    let msg: Msg = serde_json::from_slice(bytes).map_err(bad)?;
    // Nothing sent is ignored: a field the message's type does not have
    // (which serde skips for the types without fields) is refused too.
    let sent: serde_json::Value = serde_json::from_slice(bytes).map_err(bad)?;
    if serde_json::to_value(&msg).ok().as_ref() != Some(&sent) {
        return Err(BadMessage(format!(
            "bad control message {}: fields its type does not have",
            shown()
        )));
    }
    if let Msg::Params(p) = &msg {
        p.check()
            .map_err(|e| BadMessage(format!("bad parameters {}: {e}", shown())))?;
    }
    Ok(msg)
}

/// `text` with control and format characters escaped: what a peer sends
/// reaches the terminal only as visible text, in the order it was sent.
pub use pinpoll_appkit::run::escape_controls as printable;

/// The control connection's own small configuration.
pub fn control_config(timeout: Duration) -> EngineConfig {
    let mut built = EngineConfig::default();
    built.qp = QpConfig::default();
    built.qp.max_send_wr = 16;
    built.qp.max_recv_wr = 16;
    built.qp.cq_depth = 32;
    built.qp.max_inline_data = 0;
    built.qp.connect_timeout = timeout;
    built.batch_size = 1;
    built.signal_interval = 1;
    built.inline_threshold = 0;
    built.slot_size = MAX_MSG as u32;
    built.slot_count = 16;
    built.completion_timeout = timeout;
    built
}

#[derive(Debug)]
pub enum Control {
    Tcp(TcpStream),
    Rdma(Box<Connection>),
}

impl Control {
    /// Sends `msg`. Over rdma_cm it returns once the message is
    /// delivered, so a side that sends and then closes (a refusal) never
    /// flushes its own last words.
    pub fn send(&mut self, msg: &Msg) -> Result<()> {
        let bytes = encode(msg)?;
        match self {
            Control::Tcp(s) => {
                s.set_nonblocking(false)?;
                let mut frame = (bytes.len() as u32).to_le_bytes().to_vec();
                frame.extend_from_slice(&bytes);
                s.write_all(&frame)
                    .context("sending on the control stream")?;
            }
            Control::Rdma(c) => {
                c.send(&bytes)
                    .and_then(|_| c.wait_idle(|_| {}))
                    .context("sending on the control connection")?;
            }
        }
        Ok(())
    }

    /// The next message, if one has arrived; never waits.
    pub fn try_recv(&mut self) -> Result<Option<Msg>> {
        let bytes = match self {
            Control::Tcp(s) => {
                s.set_nonblocking(true)?;
                let mut len = [0u8; 4];
                match s.peek(&mut len) {
                    Ok(0) => bail!("the peer closed the control stream"),
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                    Err(e) => return Err(e).context("reading the control stream"),
                }
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                s.read_exact(&mut len)
                    .context("reading the control stream")?;
                let len = u32::from_le_bytes(len) as usize;
                if len > MAX_MSG {
                    return Err(BadMessage(format!(
                        "control message of {len} bytes is too long (at most {MAX_MSG})"
                    ))
                    .into());
                }
                let mut buf = vec![0u8; len];
                s.read_exact(&mut buf)
                    .context("reading the control stream")?;
                buf
            }
            Control::Rdma(c) => {
                let mut got = None;
                let mut failed = None;
                c.poll(|ev| match ev {
                    Event::Received { data } if got.is_none() => got = Some(data.to_vec()),
                    Event::Failed(e) => failed = Some(e),
                    _ => {}
                })?;
                if let Some(e) = failed {
                    return Err(anyhow!(e)).context("the control connection failed");
                }
                match got {
                    Some(bytes) => bytes,
                    None => {
                        if c.peer_gone()? {
                            bail!("the peer closed the control connection");
                        }
                        return Ok(None);
                    }
                }
            }
        };
        Ok(Some(decode(&bytes)?))
    }

    /// The next message, waiting (napping) up to `timeout` for it.
    pub fn recv(&mut self, timeout: Duration, what: &str) -> Result<Msg> {
        let start = Instant::now();
        loop {
            if let Some(msg) = self.try_recv()? {
                if let Msg::Error { message } = &msg {
                    bail!("the peer reported: {}", printable(message));
                }
                return Ok(msg);
            }
            if start.elapsed() > timeout {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
            std::thread::sleep(NAP);
        }
    }

    /// The TCP stream, for the out-of-band exchange of a data connection.
    pub fn stream(&mut self) -> Option<&mut TcpStream> {
        match self {
            Control::Tcp(s) => {
                let _ = s.set_nonblocking(false);
                Some(s)
            }
            Control::Rdma(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{data_config, Kind, Mode, Overrides, WireConfig};

    #[test]
    fn messages_travel_over_a_tcp_control_stream() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut ctl = Control::Tcp(s);
            let got = ctl.recv(Duration::from_secs(5), "params").unwrap();
            ctl.send(&Msg::Ready { nonce: 7 }).unwrap();
            got
        });
        let mut ctl = Control::Tcp(TcpStream::connect(addr).unwrap());
        assert!(ctl.try_recv().unwrap().is_none());
        let cfg = data_config(
            &EngineConfig::default(),
            Kind::WriteLat,
            8,
            &Overrides::default(),
        )
        .unwrap();
        let params = Msg::Params(Params {
            kind: Kind::WriteLat,
            mode: Mode::Direct,
            size: 8,
            iters: 10,
            warmup: 1,
            await_sends: false,
            config: WireConfig::from_config(&cfg),
        });
        ctl.send(&params).unwrap();
        assert_eq!(
            ctl.recv(Duration::from_secs(5), "ready").unwrap(),
            Msg::Ready { nonce: 7 }
        );
        assert_eq!(t.join().unwrap(), params);
    }
}
