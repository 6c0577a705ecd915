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

/// A wait on the peer that its deadline ended: what was awaited, and
/// the whole time it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    pub waited: Duration,
    pub what: String,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timed out after {} s waiting for {}",
            self.waited.as_secs_f64(),
            self.what
        )
    }
}

impl std::error::Error for TimedOut {}

/// Whether `err` ended a wait on a silent or too slow peer: a deadline of
/// the control stream ([`TimedOut`]) or of the engine (a handshake, a
/// completion, an idle data connection).
pub fn is_timeout(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.is::<TimedOut>()
            || matches!(
                cause.downcast_ref::<pinpoll::Error>(),
                Some(pinpoll::Error::Timeout { .. })
            )
            || cause
                .downcast_ref::<std::io::Error>()
                .and_then(|e| e.get_ref())
                .is_some_and(|inner| inner.is::<TimedOut>())
    })
}

/// A TCP stream on which every read and write of one wait falls within
/// one deadline. A socket timeout alone restarts with each read, so a
/// peer sending a byte just within it could stretch one message over
/// hours; here each read's socket timeout is what is left of the
/// deadline, which only [`DeadlineStream::start`] moves.
#[derive(Debug)]
pub struct DeadlineStream {
    stream: TcpStream,
    budget: Duration,
    waited: Duration,
    deadline: Instant,
    what: String,
}

impl DeadlineStream {
    /// `stream`, whose waits are each given `budget` unless
    /// [`DeadlineStream::start_within`] says otherwise.
    pub fn new(stream: TcpStream, budget: Duration) -> DeadlineStream {
        DeadlineStream {
            stream,
            budget,
            waited: budget,
            deadline: Instant::now() + budget,
            what: "the peer".to_owned(),
        }
    }

    /// Starts a wait for `what` of the stream's budget: what is read and
    /// written until the next start must be done by then.
    pub fn start(&mut self, what: &str) {
        self.start_within(self.budget, what);
    }

    /// Starts a wait for `what` that must be done within `within`.
    pub fn start_within(&mut self, within: Duration, what: &str) {
        self.waited = within;
        self.deadline = Instant::now() + within;
        what.clone_into(&mut self.what);
    }

    /// The stream itself, blocking, for an exchange that sets its own
    /// timeouts (the out-of-band handshake of a data connection).
    pub fn get_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// The stream itself, to be used without the deadline.
    pub fn into_inner(self) -> TcpStream {
        self.stream
    }

    /// What is left of the deadline, or the error saying it passed.
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                TimedOut {
                    waited: self.waited,
                    what: self.what.clone(),
                },
            ));
        }
        Ok(left)
    }

    /// Whether a message has begun to arrive; never waits.
    fn has_data(&mut self) -> std::io::Result<bool> {
        self.stream.set_nonblocking(true)?;
        let mut first = [0u8; 1];
        let peeked = self.stream.peek(&mut first);
        self.stream.set_nonblocking(false)?;
        match peeked {
            Ok(0) => Err(std::io::Error::new(
                ErrorKind::UnexpectedEof,
                "the peer closed the control stream",
            )),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Whether `e` is a socket timeout (which the deadline then judges).
fn socket_timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    ) && e.get_ref().is_none()
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            self.stream.set_read_timeout(Some(self.left()?))?;
            match self.stream.read(buf) {
                Err(e) if socket_timed_out(&e) => continue,
                done => return done,
            }
        }
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            self.stream.set_write_timeout(Some(self.left()?))?;
            match self.stream.write(buf) {
                Err(e) if socket_timed_out(&e) => continue,
                done => return done,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// An I/O error of the control stream as the error chain should show it:
/// a passed deadline as the [`TimedOut`] it carries.
fn stream_error(e: std::io::Error, doing: &'static str) -> anyhow::Error {
    if e.get_ref().is_some_and(|inner| inner.is::<TimedOut>()) {
        if let Some(Ok(timed_out)) = e.into_inner().map(|inner| inner.downcast::<TimedOut>()) {
            return anyhow::Error::new(*timed_out);
        }
        unreachable!("checked to be a TimedOut");
    }
    anyhow::Error::new(e).context(doing)
}

#[derive(Debug)]
pub enum Control {
    Tcp(DeadlineStream),
    Rdma(Box<Connection>),
}

impl Control {
    /// The control stream of `--oob` on `stream`, each wait on the peer
    /// bounded by `timeout`.
    pub fn tcp(stream: TcpStream, timeout: Duration) -> Control {
        Control::Tcp(DeadlineStream::new(stream, timeout))
    }

    /// Sends `msg`. Over rdma_cm it returns once the message is
    /// delivered, so a side that sends and then closes (a refusal) never
    /// flushes its own last words.
    pub fn send(&mut self, msg: &Msg) -> Result<()> {
        let bytes = encode(msg)?;
        match self {
            Control::Tcp(s) => {
                let mut frame = (bytes.len() as u32).to_le_bytes().to_vec();
                frame.extend_from_slice(&bytes);
                s.start("the peer to take a control message");
                s.write_all(&frame)
                    .map_err(|e| stream_error(e, "sending on the control stream"))?;
            }
            Control::Rdma(c) => {
                c.send(&bytes)
                    .and_then(|_| c.wait_idle(|_| {}))
                    .context("sending on the control connection")?;
            }
        }
        Ok(())
    }

    /// The next message, if one has begun to arrive (then the rest of it
    /// within the stream's timeout); never waits for its start.
    pub fn try_recv(&mut self) -> Result<Option<Msg>> {
        let bytes = match self {
            Control::Tcp(s) => {
                if !s
                    .has_data()
                    .map_err(|e| stream_error(e, "reading the control stream"))?
                {
                    return Ok(None);
                }
                s.start("the rest of a control message");
                read_frame(s)?
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
                            return Err(std::io::Error::new(
                                ErrorKind::UnexpectedEof,
                                "the peer closed the control connection",
                            )
                            .into());
                        }
                        return Ok(None);
                    }
                }
            }
        };
        Ok(Some(decode(&bytes)?))
    }

    /// The next message, all of it within `timeout`.
    pub fn recv(&mut self, timeout: Duration, what: &str) -> Result<Msg> {
        let msg = match self {
            Control::Tcp(s) => {
                s.start_within(timeout, what);
                decode(&read_frame(s)?)?
            }
            Control::Rdma(_) => {
                let start = Instant::now();
                loop {
                    if let Some(msg) = self.try_recv()? {
                        break msg;
                    }
                    if start.elapsed() > timeout {
                        return Err(TimedOut {
                            waited: timeout,
                            what: what.to_owned(),
                        }
                        .into());
                    }
                    std::thread::sleep(NAP);
                }
            }
        };
        if let Msg::Error { message } = &msg {
            bail!("the peer reported: {}", printable(message));
        }
        Ok(msg)
    }

    /// The TCP stream, for the out-of-band exchange of a data connection.
    pub fn stream(&mut self) -> Option<&mut TcpStream> {
        match self {
            Control::Tcp(s) => Some(s.get_mut()),
            Control::Rdma(_) => None,
        }
    }
}

/// One length-prefixed message of the control stream, within the wait
/// the stream is in.
fn read_frame(s: &mut DeadlineStream) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(|e| {
        // std's "failed to fill whole buffer" would not say who ended it.
        let e = if e.kind() == ErrorKind::UnexpectedEof {
            std::io::Error::new(
                ErrorKind::UnexpectedEof,
                "the peer closed the control stream",
            )
        } else {
            e
        };
        stream_error(e, "reading the control stream")
    })?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MSG {
        return Err(BadMessage(format!(
            "control message of {len} bytes is too long (at most {MAX_MSG})"
        ))
        .into());
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)
        .map_err(|e| stream_error(e, "reading the control stream"))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{data_config, Kind, Mode, Overrides, WireConfig};

    /// Two ends of a loopback TCP connection: (ours, the peer's).
    fn pair() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (peer, _) = listener.accept().unwrap();
        (ours, peer)
    }

    /// `bytes` sent one at a time, `gap` apart, until the other end closes.
    fn trickle(mut peer: TcpStream, bytes: usize, gap: Duration) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for _ in 0..bytes {
                if peer.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(gap);
            }
        })
    }

    fn timed_out(e: &std::io::Error) -> &TimedOut {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<TimedOut>())
            .unwrap_or_else(|| panic!("not a passed deadline: {e}"))
    }

    #[test]
    fn a_read_that_would_block_past_the_deadline_fails_naming_what_it_awaited() {
        let (ours, _silent) = pair();
        let mut s = DeadlineStream::new(ours, Duration::from_millis(200));
        s.start("the peer's greeting");
        let err = s.read(&mut [0; 4]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut);
        assert_eq!(
            timed_out(&err).to_string(),
            "timed out after 0.2 s waiting for the peer's greeting"
        );
    }

    #[test]
    fn a_slow_but_steady_peer_within_the_deadline_is_read_whole() {
        let (ours, peer) = pair();
        let sender = trickle(peer, 10, Duration::from_millis(20));
        let mut s = DeadlineStream::new(ours, Duration::from_secs(60));
        s.start("ten slow bytes");
        let mut got = [0u8; 10];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"xxxxxxxxxx");
        sender.join().unwrap();
    }

    /// Each byte comes well within a socket timeout of the whole budget;
    /// the reads share one deadline, which they pass.
    #[test]
    fn the_deadline_is_not_reset_by_each_read() {
        let (ours, peer) = pair();
        let sender = trickle(peer, 120, Duration::from_millis(25));
        let mut s = DeadlineStream::new(ours, Duration::from_millis(500));
        s.start("120 bytes");
        let err = s.read_exact(&mut [0u8; 120]).unwrap_err();
        assert_eq!(timed_out(&err).what, "120 bytes");
        drop(s);
        sender.join().unwrap();
    }

    /// A peer that never reads cannot hold a write either.
    #[test]
    fn a_write_the_peer_never_takes_fails_at_the_deadline() {
        let (ours, _never_reads) = pair();
        let mut s = DeadlineStream::new(ours, Duration::from_millis(300));
        s.start("the peer to take 64 MiB");
        let err = s.write_all(&vec![0u8; 64 << 20]).unwrap_err();
        assert_eq!(timed_out(&err).what, "the peer to take 64 MiB");
    }

    /// A peer that sends a frame a byte at a time, each byte well within
    /// any per-read timeout, is given up when the wait's one deadline
    /// passes, not when the last byte comes.
    #[test]
    fn a_peer_trickling_a_message_is_given_up_at_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let trickler = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut body = encode(&Msg::Done).unwrap();
            body.resize(120, b' ');
            let mut frame = (body.len() as u32).to_le_bytes().to_vec();
            frame.extend_from_slice(&body);
            for b in frame {
                if s.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        let mut ctl = Control::tcp(TcpStream::connect(addr).unwrap(), Duration::from_secs(5));
        let got = ctl.recv(Duration::from_millis(500), "the trickled message");
        let err = format!("{:#}", got.expect_err("the whole frame takes 3 s"));
        assert!(
            err.contains("timed out after 0.5 s waiting for the trickled message"),
            "{err}"
        );
        drop(ctl);
        trickler.join().unwrap();
    }

    #[test]
    fn messages_travel_over_a_tcp_control_stream() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut ctl = Control::tcp(s, Duration::from_secs(5));
            let got = ctl.recv(Duration::from_secs(5), "params").unwrap();
            ctl.send(&Msg::Ready { nonce: 7 }).unwrap();
            got
        });
        let mut ctl = Control::tcp(TcpStream::connect(addr).unwrap(), Duration::from_secs(5));
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
