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
//! The accept loop only checks that and hands the request over; the
//! transfer's own thread completes its handshake, so a join that never
//! completes holds that transfer (until `--timeout`), never the loop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::bail;
use pinpoll::connect::cm::Request;
use pinpoll::Connection;

use crate::filexfer::explain_link;
use crate::filexfer::protocol::{FailCode, Msg};
use crate::filexfer::server::refusal;
use crate::run::error_line;

/// The transfers of one server waiting for their further streams.
#[derive(Clone, Default)]
pub struct Joins {
    waiting: Arc<Mutex<HashMap<u64, Waiting>>>,
}

struct Waiting {
    peer: Option<IpAddr>,
    streams: u16,
    joined: Vec<u16>,
    deliver: mpsc::Sender<(u16, Request)>,
}

/// A stream's request no transfer waits for, and why: to be rejected.
pub struct NotWaited(pub Box<(Request, String)>);

/// One transfer waiting for its streams `1..N`; it stops waiting when
/// dropped.
pub struct Gathering {
    joins: Joins,
    token: u64,
    streams: u16,
    arrived: mpsc::Receiver<(u16, Request)>,
}

impl Joins {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Waiting>> {
        // Inserts and removes cannot leave the map half-changed.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for streams `1..streams` of a transfer whose first stream
    /// came from `peer`.
    pub fn open(&self, peer: Option<IpAddr>, streams: u16) -> std::io::Result<Gathering> {
        let (deliver, arrived) = mpsc::channel();
        let mut waiting = self.lock();
        // From the OS's random source: a token a peer cannot predict.
        let token = loop {
            let token = pinpoll_appkit::random_u64()?;
            // 0 is "no token" in Ready.
            if token != 0 && !waiting.contains_key(&token) {
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
        Ok(Gathering {
            joins: self.clone(),
            token,
            streams,
            arrived,
        })
    }

    /// Whether a connection from `peer` may join as stream `stream` of
    /// the transfer of `token`; the reason if not.
    pub fn admits(&self, token: u64, stream: u16, peer: Option<IpAddr>) -> Result<(), String> {
        admits(&self.lock(), token, stream, peer)
    }

    /// Hands `req`, the connect request of stream `stream` of the transfer
    /// of `token`, to that transfer, whose thread completes its handshake.
    /// Never waits. A request the transfer does not wait for comes back,
    /// with the reason, to be rejected.
    pub fn hand_over(&self, token: u64, stream: u16, req: Request) -> Result<(), NotWaited> {
        let mut waiting = self.lock();
        let peer = req.peer_addr().map(|a| a.ip());
        let w = match admits(&waiting, token, stream, peer) {
            Ok(()) => waiting.get_mut(&token).expect("admitted: it waits"),
            Err(why) => return Err(NotWaited(Box::new((req, why)))),
        };
        w.joined.push(stream);
        w.deliver.send((stream, req)).map_err(|back| {
            let (_, req) = back.0;
            let why = "the transfer stopped waiting for its streams".to_owned();
            NotWaited(Box::new((req, why)))
        })
    }
}

fn admits(
    waiting: &HashMap<u64, Waiting>,
    token: u64,
    stream: u16,
    peer: Option<IpAddr>,
) -> Result<(), String> {
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

impl Gathering {
    /// The token the client's further streams name.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The connections of streams `1..N`, in order, once all have joined
    /// within `timeout`; `accept` completes each one's handshake, here on
    /// the transfer's thread. A join whose handshake fails fails the
    /// transfer.
    pub fn gather(
        self,
        timeout: Duration,
        mut accept: impl FnMut(Request) -> anyhow::Result<Connection>,
    ) -> anyhow::Result<Vec<Connection>> {
        let deadline = Instant::now() + timeout;
        let mut streams: Vec<Option<Connection>> = (1..self.streams).map(|_| None).collect();
        for joined in 1..self.streams {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok((stream, req)) = self.arrived.recv_timeout(left) else {
                return Err(refusal(
                    FailCode::Protocol,
                    format!(
                        "{} of the transfer's {} streams joined within --timeout",
                        joined, self.streams
                    ),
                ));
            };
            let conn = accept(req).map_err(|e| {
                refusal(
                    FailCode::Protocol,
                    format!("stream {stream} could not join: {}", error_line(&e)),
                )
            })?;
            streams[usize::from(stream) - 1] = Some(conn);
        }
        Ok(streams.into_iter().flatten().collect())
    }
}

impl Drop for Gathering {
    fn drop(&mut self) {
        self.joins.lock().remove(&self.token);
    }
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
        let gathering = joins.open(here, 3).unwrap();
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
        let other = joins.open(here, 2).unwrap();
        assert_ne!(other.token(), token);
        drop(gathering);
        assert!(joins.admits(token, 1, here).is_err(), "no longer waiting");
        assert_eq!(joins.admits(other.token(), 1, here), Ok(()));
    }

    #[test]
    fn a_transfer_waits_for_its_streams_only_until_the_timeout() {
        let joins = Joins::default();
        let gathering = joins.open(None, 2).unwrap();
        let err = gathering
            .gather(Duration::from_millis(20), |_| {
                unreachable!("no stream came")
            })
            .unwrap_err();
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
