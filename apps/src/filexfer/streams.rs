//! `--streams N` on the server: one transfer over N queue pairs.
//!
//! The client's first connection sends `Start{streams: N}`; the server
//! opens a [`Gathering`] under a fresh random token and answers it in
//! `Ready`. The client connects N-1 more times with
//! [`join_hello`](super::protocol::join_hello) (the token and the stream's
//! index) as private data; the accept loop hands each such connection to
//! the waiting transfer ([`Joins::deliver`]) without counting it as a
//! client. Stream `s` carries chunks `s, s+N, s+2N, ...`, each into its
//! own connection's ring; the transfer receives every stream on its own
//! thread and verifies them as one file. A stream that fails stops the
//! others ([`next_arrival`] gives up once told to) and fails the transfer.
//!
//! A join is accepted only for a token being gathered, from the address
//! of the transfer's first connection, for a stream index not yet joined.

use std::collections::hash_map::{HashMap, RandomState};
use std::hash::{BuildHasher as _, Hasher as _};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::bail;
use pinpoll::Connection;

use crate::filexfer::explain_link;
use crate::filexfer::protocol::{FailCode, Msg};
use crate::filexfer::server::refusal;

/// The transfers of one server waiting for their further streams.
#[derive(Clone, Default)]
pub struct Joins {
    waiting: Arc<Mutex<HashMap<u64, Waiting>>>,
}

struct Waiting {
    peer: Option<IpAddr>,
    streams: u16,
    joined: Vec<u16>,
    deliver: mpsc::Sender<(u16, Connection)>,
}

/// One transfer waiting for its streams `1..N`; it stops waiting when
/// dropped.
pub struct Gathering {
    joins: Joins,
    token: u64,
    streams: u16,
    arrived: mpsc::Receiver<(u16, Connection)>,
}

impl Joins {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Waiting>> {
        // Inserts and removes cannot leave the map half-changed.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for streams `1..streams` of a transfer whose first stream
    /// came from `peer`.
    pub fn open(&self, peer: Option<IpAddr>, streams: u16) -> Gathering {
        let (deliver, arrived) = mpsc::channel();
        let mut waiting = self.lock();
        let token = loop {
            let token = random_token();
            if !waiting.contains_key(&token) {
                break token;
            }
        };
        waiting.insert(
            token,
            Waiting {
                peer,
                streams,
                joined: Vec::new(),
                deliver,
            },
        );
        Gathering {
            joins: self.clone(),
            token,
            streams,
            arrived,
        }
    }

    /// Whether a connection from `peer` may join as stream `stream` of
    /// the transfer of `token` (checked before it is accepted); the
    /// reason if not.
    pub fn admits(&self, token: u64, stream: u16, peer: Option<IpAddr>) -> Result<(), String> {
        let waiting = self.lock();
        let Some(w) = waiting.get(&token) else {
            return Err("no transfer of this server is waiting for that stream".into());
        };
        if w.peer != peer {
            return Err("a stream must come from the address of its transfer's first one".into());
        }
        if !(1..w.streams).contains(&stream) || w.joined.contains(&stream) {
            return Err(format!(
                "stream {stream} is not one the transfer still waits for (it has {} streams)",
                w.streams
            ));
        }
        Ok(())
    }

    /// Hands the accepted connection of stream `stream` to its transfer.
    pub fn deliver(&self, token: u64, stream: u16, conn: Connection) -> Result<(), String> {
        let mut waiting = self.lock();
        let Some(w) = waiting.get_mut(&token) else {
            return Err("the transfer stopped waiting for its streams".into());
        };
        if w.joined.contains(&stream) {
            return Err(format!("stream {stream} joined twice"));
        }
        w.joined.push(stream);
        w.deliver
            .send((stream, conn))
            .map_err(|_| "the transfer stopped waiting for its streams".to_owned())
    }
}

impl Gathering {
    /// The token the client's further streams name.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The connections of streams `1..N`, in order, once all have joined
    /// within `timeout`.
    pub fn gather(self, timeout: Duration) -> anyhow::Result<Vec<Connection>> {
        let deadline = Instant::now() + timeout;
        let mut streams: Vec<Option<Connection>> = (1..self.streams).map(|_| None).collect();
        for joined in 1..self.streams {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.arrived.recv_timeout(left) {
                Ok((stream, conn)) => streams[usize::from(stream) - 1] = Some(conn),
                Err(_) => {
                    return Err(refusal(
                        FailCode::Protocol,
                        format!(
                            "{} of the transfer's {} streams joined within --timeout",
                            joined, self.streams
                        ),
                    ))
                }
            }
        }
        Ok(streams.into_iter().flatten().collect())
    }
}

impl Drop for Gathering {
    fn drop(&mut self) {
        self.joins.lock().remove(&self.token);
    }
}

/// A token no one outside this process can predict: std's hasher keys
/// come from the operating system's random source.
fn random_token() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    hasher.write_u128(now.map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// What arrived on a stream.
pub enum Arrival {
    /// A WRITE_WITH_IMM: its slot (the immediate) and length.
    Chunk { slot: u32, len: u32 },
    /// A control message.
    Message(Msg),
}

/// The error of a stream that stopped because another one failed (that
/// one's error is the transfer's).
#[derive(Debug, thiserror::Error)]
#[error("stopped: another stream of the transfer failed")]
pub struct Stopped;

/// The error that ended a transfer's streams: the first that is not a
/// [`Stopped`] (which only follows another stream's failure).
pub fn first_failure(errors: impl IntoIterator<Item = anyhow::Error>) -> Option<anyhow::Error> {
    let mut stopped = None;
    for e in errors {
        if e.downcast_ref::<Stopped>().is_none() {
            return Some(e);
        }
        stopped.get_or_insert(e);
    }
    stopped
}

/// The next arrival on `conn`, waiting up to `timeout` (with heartbeats,
/// and noticing a client that left, as the engine's own waits do); gives
/// up with [`Stopped`] once `stop` is set.
pub fn next_arrival(
    conn: &mut Connection,
    stop: &AtomicBool,
    timeout: Duration,
) -> anyhow::Result<Arrival> {
    let link = |e| explain_link(e, "client");
    let began = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(m) = conn.try_recv().map_err(link)? {
            return match m.imm {
                Some(slot) => Ok(Arrival::Chunk { slot, len: m.len }),
                None => Msg::decode(m.data)
                    .map(Arrival::Message)
                    .map_err(|e| refusal(FailCode::Protocol, e.to_string())),
            };
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        if stop.load(Ordering::Acquire) {
            bail!(Stopped);
        }
        let waited = began.elapsed();
        if waited >= timeout {
            let what = "a chunk or message from the client";
            return Err(link(pinpoll::Error::Timeout { what, waited }));
        }
        if conn.outstanding() > 0 {
            conn.reap().map_err(link)?;
        }
        if waited >= Duration::from_millis(1) {
            conn.peer_gone().map_err(link)?;
            conn.keepalive().map_err(link)?;
        }
        // As the engine's waits do: after a millisecond let other threads
        // (and rxe's kernel work) run; after 10 ms, nap.
        if waited >= Duration::from_millis(10) {
            std::thread::sleep(Duration::from_micros(50));
        } else if waited >= Duration::from_millis(1) {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_streams_a_transfer_waits_for_may_join_it() {
        let joins = Joins::default();
        let here: Option<IpAddr> = Some("169.254.0.1".parse().unwrap());
        let elsewhere: Option<IpAddr> = Some("169.254.0.2".parse().unwrap());
        let gathering = joins.open(here, 3);
        let token = gathering.token();
        assert_eq!(joins.admits(token, 1, here), Ok(()));
        assert_eq!(joins.admits(token, 2, here), Ok(()));
        for stream in [0, 3, 9] {
            let why = joins.admits(token, stream, here).unwrap_err();
            assert!(why.contains("it has 3 streams"), "{stream}: {why}");
        }
        let why = joins.admits(token, 1, elsewhere).unwrap_err();
        assert!(why.contains("address of its transfer's first one"), "{why}");
        let why = joins.admits(token ^ 1, 1, here).unwrap_err();
        assert!(why.contains("no transfer"), "{why}");
        // Another transfer gets another token.
        let other = joins.open(here, 2);
        assert_ne!(other.token(), token);
        drop(gathering);
        assert!(joins.admits(token, 1, here).is_err(), "no longer waiting");
        assert_eq!(joins.admits(other.token(), 1, here), Ok(()));
    }

    #[test]
    fn a_transfer_waits_for_its_streams_only_until_the_timeout() {
        let joins = Joins::default();
        let gathering = joins.open(None, 2);
        let err = gathering.gather(Duration::from_millis(20)).unwrap_err();
        assert!(
            err.to_string()
                .contains("1 of the transfer's 2 streams joined within --timeout"),
            "{err}"
        );
        assert!(joins.lock().is_empty(), "it stopped waiting");
    }

    #[test]
    fn the_first_real_failure_names_the_transfer_s_end() {
        let real = || anyhow::anyhow!("stream 2: the client disconnected");
        let errors = [
            anyhow::Error::new(Stopped),
            real(),
            anyhow::anyhow!("later"),
        ];
        let first = first_failure(errors).unwrap();
        assert_eq!(first.to_string(), "stream 2: the client disconnected");
        let only_stopped = first_failure([anyhow::Error::new(Stopped).context("stream 0")]);
        assert!(only_stopped.unwrap().downcast_ref::<Stopped>().is_some());
        assert!(first_failure(Vec::new()).is_none());
    }
}
