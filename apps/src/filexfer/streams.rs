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
//! of the transfer's first connection, for a stream index not yet joined,
//! and only until `--timeout` after the transfer opened its gathering (just
//! before its `Ready`): one deadline for the whole gathering, counted from
//! then, checked where a join is handed over and where the transfer takes
//! it. A join that comes later, or that was handed over but not yet taken
//! when the deadline passed, is refused ("not waited for"), never handed to
//! the transfer. The accept loop only checks that and hands the request
//! over; the transfer's own thread completes its handshake, within what is
//! left of the deadline, so a join that never completes holds that
//! transfer (until its deadline), never the loop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::bail;
use pinpoll::connect::cm::Request;
use pinpoll::Connection;

use crate::cli::show_addr;
use crate::filexfer::explain_link;
use crate::filexfer::protocol::{FailCode, Msg};
use crate::filexfer::server::refusal;
use crate::run::error_line;

/// A further stream's connect request, as the transfer it joins sees it
/// (a trait so that the rules of joining run on the host, without a
/// device).
pub trait JoinRequest {
    /// The address it came from, if rdma_cm says.
    fn peer_ip(&self) -> Option<IpAddr>;
    /// Rejects the request, telling the client `why`.
    fn refuse(self, stream: u16, why: &str);
}

impl JoinRequest for Request {
    fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_addr().map(|a| a.ip())
    }

    fn refuse(self, stream: u16, why: &str) {
        let peer = show_addr(self.peer_addr());
        tracing::warn!(peer, stream, why, "refusing a stream");
        if let Err(err) = self.reject(format!("{why}\0").as_bytes()) {
            tracing::warn!(error = %err, "rejecting a stream failed");
        }
    }
}

/// The transfers of one server waiting for their further streams.
pub struct Joins<R = Request> {
    waiting: Arc<Mutex<HashMap<u64, Waiting<R>>>>,
}

impl<R> Clone for Joins<R> {
    fn clone(&self) -> Self {
        Joins {
            waiting: Arc::clone(&self.waiting),
        }
    }
}

impl<R> Default for Joins<R> {
    fn default() -> Self {
        Joins {
            waiting: Arc::default(),
        }
    }
}

struct Waiting<R> {
    peer: Option<IpAddr>,
    streams: u16,
    /// No join is taken from then on.
    deadline: Instant,
    joined: Vec<u16>,
    deliver: mpsc::Sender<(u16, R)>,
}

/// A stream's request no transfer waits for, and why: to be rejected.
pub struct NotWaited<R = Request>(pub Box<(R, String)>);

/// One transfer waiting for its streams `1..N`; it stops waiting when
/// dropped.
pub struct Gathering<R: JoinRequest = Request> {
    joins: Joins<R>,
    token: u64,
    streams: u16,
    deadline: Instant,
    arrived: mpsc::Receiver<(u16, R)>,
}

impl<R> Joins<R> {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Waiting<R>>> {
        // Inserts and removes cannot leave the map half-changed.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<R: JoinRequest> Joins<R> {
    /// Waits for streams `1..streams` of a transfer whose first stream
    /// came from `peer`, for `timeout` from now.
    pub fn open(
        &self,
        peer: Option<IpAddr>,
        streams: u16,
        timeout: Duration,
    ) -> std::io::Result<Gathering<R>> {
        let deadline = Instant::now() + timeout;
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
                deadline,
                joined: Vec::new(),
                deliver,
            },
        );
        Ok(Gathering {
            joins: self.clone(),
            token,
            streams,
            deadline,
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
    pub fn hand_over(&self, token: u64, stream: u16, req: R) -> Result<(), NotWaited<R>> {
        let mut waiting = self.lock();
        let peer = req.peer_ip();
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

fn admits<R>(
    waiting: &HashMap<u64, Waiting<R>>,
    token: u64,
    stream: u16,
    peer: Option<IpAddr>,
) -> Result<(), String> {
    let Some(w) = waiting.get(&token) else {
        return Err("no transfer of this server is waiting for that stream".into());
    };
    if Instant::now() >= w.deadline {
        return Err(format!(
            "stream {stream} is not waited for: --timeout passed since its transfer began to wait for its streams"
        ));
    }
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

impl<R: JoinRequest> Gathering<R> {
    /// The token the client's further streams name.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The connections of streams `1..N`, in order, once all have joined
    /// by the deadline; `accept` completes each one's handshake, here on
    /// the transfer's thread, by the deadline it is given (the
    /// gathering's). A
    /// join whose handshake fails fails the transfer; so does the
    /// deadline, even with joins handed over and not yet taken (dropping
    /// the gathering refuses them).
    pub fn gather<C>(
        self,
        mut accept: impl FnMut(R, Instant) -> anyhow::Result<C>,
    ) -> anyhow::Result<Vec<C>> {
        let mut streams: Vec<Option<C>> = (1..self.streams).map(|_| None).collect();
        for joined in 1..self.streams {
            let left = self.deadline.saturating_duration_since(Instant::now());
            // recv_timeout takes what is queued even with no time left.
            let arrived = match left.is_zero() {
                true => None,
                false => self.arrived.recv_timeout(left).ok(),
            };
            let Some((stream, req)) = arrived else {
                return Err(refusal(
                    FailCode::Protocol,
                    format!(
                        "{} of the transfer's {} streams joined within --timeout",
                        joined, self.streams
                    ),
                ));
            };
            if Instant::now() >= self.deadline {
                // Taken as the deadline passed: no time is left for its
                // handshake.
                req.refuse(
                    stream,
                    "the transfer no longer waits for its streams (not waited for)",
                );
                return Err(refusal(
                    FailCode::Protocol,
                    format!(
                        "{} of the transfer's {} streams joined within --timeout",
                        joined, self.streams
                    ),
                ));
            }
            let conn = accept(req, self.deadline).map_err(|e| {
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

impl<R: JoinRequest> Drop for Gathering<R> {
    fn drop(&mut self) {
        // No further join can be handed over once the token is gone; those
        // handed over and never taken are told they came too late.
        self.joins.lock().remove(&self.token);
        for (stream, req) in self.arrived.try_iter() {
            req.refuse(
                stream,
                "the transfer no longer waits for its streams (not waited for)",
            );
        }
    }
}

/// What arrived on a stream.
pub enum Arrival {
    /// A WRITE_WITH_IMM: its slot (the immediate) and length.
    Chunk { slot: u32, len: u32 },
    /// A control message.
    Message(Msg),
    /// A SEND that is no message: the decoder's reason.
    Undecodable(String),
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
                None => Ok(Msg::decode(m.data)
                    .map_or_else(|e| Arrival::Undecodable(e.to_string()), Arrival::Message)),
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

    /// A join's connect request without a device: the address it came
    /// from and the stream it names.
    /// ...and where its refusal is told, if anywhere.
    struct Req(Option<IpAddr>, u16, Option<mpsc::Sender<u16>>);

    impl JoinRequest for Req {
        fn peer_ip(&self) -> Option<IpAddr> {
            self.0
        }

        fn refuse(self, stream: u16, _: &str) {
            if let Some(told) = self.2 {
                told.send(stream).unwrap();
            }
        }
    }

    const LONG: Duration = Duration::from_secs(600);

    #[test]
    fn only_the_streams_a_transfer_waits_for_may_join_it() {
        let joins = Joins::<Req>::default();
        let here: Option<IpAddr> = Some("169.254.0.1".parse().unwrap());
        let elsewhere: Option<IpAddr> = Some("169.254.0.2".parse().unwrap());
        let gathering = joins.open(here, 3, LONG).unwrap();
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
        let other = joins.open(here, 2, LONG).unwrap();
        assert_ne!(other.token(), token);
        drop(gathering);
        assert!(joins.admits(token, 1, here).is_err(), "no longer waiting");
        assert_eq!(joins.admits(other.token(), 1, here), Ok(()));
    }

    #[test]
    fn a_transfer_waits_for_its_streams_only_until_the_timeout() {
        let joins = Joins::<Req>::default();
        let gathering = joins.open(None, 2, Duration::from_millis(20)).unwrap();
        let err = gathering
            .gather(|_, _| -> anyhow::Result<()> { unreachable!("no stream came") })
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("1 of the transfer's 2 streams joined within --timeout"),
            "{err}"
        );
        assert!(joins.lock().is_empty(), "it stopped waiting");
    }

    /// The refusal of a join handed over after the transfer's deadline.
    fn refused_late(late: Result<(), NotWaited<Req>>, when: &str) -> String {
        match late {
            Ok(()) => panic!("a join {when} was handed to the transfer"),
            Err(NotWaited(refused)) => refused.1,
        }
    }

    /// `--timeout` after a transfer opened its gathering (before its
    /// `Ready` went out) it waits for no further join: one that comes
    /// later is refused, not handed to the transfer, even while the
    /// transfer is still busy with an earlier stream's handshake.
    #[test]
    fn a_join_after_the_deadline_is_refused_and_never_handed_to_the_transfer() {
        let joins = Joins::<Req>::default();
        let timeout = Duration::from_millis(50);

        let gathering = joins.open(None, 2, timeout).unwrap();
        std::thread::sleep(2 * timeout);
        let late = joins.hand_over(gathering.token(), 1, Req(None, 1, None));
        let why = refused_late(late, "past the deadline, before the transfer began to wait");
        assert!(why.contains("not waited for"), "{why}");
        drop(gathering);

        let gathering = joins.open(None, 3, timeout).unwrap();
        let token = gathering.token();
        assert!(
            joins.hand_over(token, 1, Req(None, 1, None)).is_ok(),
            "in time"
        );
        let (mut accepted, mut late) = (Vec::new(), None);
        let gathered = gathering.gather(|req, _| {
            accepted.push(req.1);
            if req.1 == 1 {
                // Stream 1's handshake outlasts the deadline; stream 2
                // connects meanwhile.
                std::thread::sleep(2 * timeout);
                late = Some(joins.hand_over(token, 2, Req(None, 2, None)));
            }
            Ok(req.1)
        });
        let why = refused_late(
            late.expect("stream 1 was accepted"),
            "during a handshake past the deadline",
        );
        assert!(why.contains("not waited for"), "{why}");
        assert_eq!(accepted, [1], "only the join that came in time");
        let err = gathered.expect_err("a stream missing at the deadline fails the transfer");
        assert!(err.to_string().contains("joined within --timeout"), "{err}");
        assert!(joins.lock().is_empty(), "it stopped waiting");

        // Handed over in time, not yet taken at the deadline: refused.
        let gathering = joins.open(None, 3, timeout).unwrap();
        let token = gathering.token();
        let (told, refusals) = mpsc::channel();
        assert!(joins.hand_over(token, 1, Req(None, 1, None)).is_ok());
        let mut accepted = Vec::new();
        let gathered = gathering.gather(|req, _| {
            accepted.push(req.1);
            let two = Req(None, 2, Some(told.clone()));
            assert!(joins.hand_over(token, 2, two).is_ok(), "in time");
            std::thread::sleep(2 * timeout);
            Ok(req.1)
        });
        assert!(gathered.is_err());
        assert_eq!(accepted, [1], "stream 2 was never taken");
        assert_eq!(refusals.try_iter().collect::<Vec<_>>(), [2]);
    }

    /// A join handed over late in the gathering gets for its handshake
    /// only what is left of the deadline when it is taken, not what was
    /// left when the transfer began to wait for it.
    #[test]
    fn a_join_s_handshake_ends_by_the_gathering_s_deadline() {
        let joins = Joins::<Req>::default();
        let timeout = Duration::from_millis(400);
        let gathering = joins.open(None, 2, timeout).unwrap();
        // The gathering's deadline is no later than this.
        let latest = Instant::now() + timeout;
        let token = gathering.token();
        let mut ends = None;
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(timeout / 2);
                assert!(joins.hand_over(token, 1, Req(None, 1, None)).is_ok());
            });
            gathering
                .gather(|_, by| {
                    ends = Some(by);
                    Ok(())
                })
                .unwrap();
        });
        let ends = ends.expect("the join was taken");
        assert!(
            ends <= latest,
            "the handshake may run {:?} past the deadline",
            ends - latest
        );
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
