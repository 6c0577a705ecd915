//! One transfer's server side of the native protocol as an I/O-free state
//! machine: events in (a message or a chunk from the client, what the
//! server's own I/O found), actions out (send, hand a chunk to the
//! verifier, store, fail). It reads no clock (time comes with the events),
//! touches no file or connection and starts no thread, so that tests and
//! the `filexfer_server` fuzz target drive every sequence a client can make
//! without a device, and what they check is what the server runs
//! ([`super::server`] feeds it and performs its actions).
//!
//! What it guarantees, whatever the events: [`Action::Store`] only once
//! every chunk of the declared size was handed to the verifier exactly
//! once, the client's `Finish` named that size, and the verifier's digest
//! is the one `Finish` declared; no chunk outside the declared size or in
//! a slot its stream holds no credit for; never more credits owed to a
//! stream than its ring has slots; nothing after the end.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::digest::ChunkGeometry;
use super::name;
use super::pace::Pace;
use super::protocol::{FailCode, Msg, MAX_STREAMS};
use super::read_ahead::Lane;
use super::TRAILER;
use crate::output::printable;

/// Why a transfer failed, as the client is told (`Fail{code, message}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub code: FailCode,
    pub message: String,
}

impl Failure {
    pub fn new(code: FailCode, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// The server's side of the geometry and its bounds on a slow client.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Chunk slots in each stream's ring.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_size: u32,
    /// `--min-rate`, bytes/s; 0: no bound.
    pub min_rate: u64,
    /// `--deadline`; zero: no bound.
    pub deadline: Duration,
}

/// What happened.
#[derive(Debug, Clone)]
pub enum Event {
    /// A control message arrived on `stream`.
    Message { stream: u16, msg: Msg },
    /// A SEND on `stream` that is no message (the decoder's reason).
    Undecodable { stream: u16, why: String },
    /// A WRITE_WITH_IMM of `len` bytes naming `slot` arrived on `stream`
    /// at `now`.
    Chunk {
        stream: u16,
        slot: u32,
        len: u32,
        now: Instant,
    },
    /// The server took the file ([`Action::Admit`]): its name is reserved,
    /// its space too; `token` is what further streams join with.
    Admitted { token: u64 },
    /// Every stream is connected, at `now`: the bounds on a slow client
    /// count from here.
    Joined { now: Instant },
    /// The chunk in `slot` of `stream` was copied out to the verifier: the
    /// slot is the client's again.
    HandedOff { stream: u16, slot: u32 },
    /// The verifier's end ([`Action::CollectDigest`]): the file's BLAKE3
    /// digest once every chunk matched its value and was written, or why
    /// not.
    Digest(Result<[u8; 32], Failure>),
    /// The store's end ([`Action::Store`]).
    Stored(Result<(), Failure>),
    /// The server's own work failed (a disk, the verifier, a refusal of
    /// the file): the client is told why.
    Failed(Failure),
    /// A stream's connection failed: nobody can be told anything.
    Gone,
}

/// What the server must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Decide whether to take the file: `--max-size`, the free space, an
    /// existing target, a temp file. Answered by [`Event::Admitted`] or
    /// [`Event::Failed`].
    Admit {
        size: u64,
        streams: u16,
        name: String,
    },
    /// SEND `msg` on `stream` (Ready, Complete).
    Send { stream: u16, msg: Msg },
    /// Copy chunk `index` (data then value, `range` of the ring) out of
    /// `slot` of `stream` into a verifier buffer and submit it; then
    /// [`Event::HandedOff`].
    Verify {
        stream: u16,
        slot: u32,
        index: u64,
        range: Range<usize>,
    },
    /// SEND `Credit{1}` on `stream`.
    Credit { stream: u16 },
    /// Every chunk was handed over: wait for the verifier's digest
    /// ([`Event::Digest`]).
    CollectDigest,
    /// Make the file durable and put it in place ([`Event::Stored`]).
    Store,
    /// Tell the client (on the first stream) and end: keep nothing.
    Fail(Failure),
}

/// How a transfer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Complete { size: u64 },
    Failed(Failure),
    Gone,
}

#[derive(Debug)]
enum Phase {
    AwaitStart,
    Admitting,
    /// Ready was sent; chunks and, on the first stream, `Finish`.
    Receiving,
    Verifying,
    Storing,
    Ended(Outcome),
}

/// One stream's ring, as the server sees it.
#[derive(Debug)]
struct Stream {
    lane: Lane,
    /// Chunks of this lane that arrived.
    position: u64,
    /// The slot whose chunk is not yet handed to the verifier, if any.
    held: Option<u32>,
    /// Credits the client holds for this ring.
    credits: u32,
    received: u64,
}

/// One transfer's protocol state.
#[derive(Debug)]
pub struct ServerCore {
    cfg: Config,
    phase: Phase,
    size: u64,
    shown: String,
    geometry: ChunkGeometry,
    streams: Vec<Stream>,
    /// `Finish`'s digest, once it came.
    finish: Option<[u8; 32]>,
    pace: Option<Pace>,
}

impl ServerCore {
    pub fn new(cfg: Config) -> Self {
        ServerCore {
            cfg,
            phase: Phase::AwaitStart,
            size: 0,
            shown: String::new(),
            geometry: ChunkGeometry::v3(0),
            streams: Vec::new(),
            finish: None,
            pace: None,
        }
    }

    /// How the transfer ended, once it has.
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.phase {
            Phase::Ended(outcome) => Some(outcome),
            _ => None,
        }
    }

    /// The file's size, as `Start` declared it (0 before).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The streams `Start` asked for (none before).
    pub fn stream_count(&self) -> u16 {
        self.streams.len() as u16
    }

    /// Data bytes that arrived on `stream`.
    pub fn received_on(&self, stream: u16) -> u64 {
        self.streams
            .get(usize::from(stream))
            .map_or(0, |s| s.received)
    }

    /// Data bytes that arrived on every stream.
    pub fn received(&self) -> u64 {
        self.streams.iter().map(|s| s.received).sum()
    }

    /// Credits the client holds for `stream`'s ring.
    pub fn credits(&self, stream: u16) -> u32 {
        self.streams
            .get(usize::from(stream))
            .map_or(0, |s| s.credits)
    }

    /// Whether the server has nothing more to read on `stream`: the
    /// transfer ended or moved past receiving, the first stream brought
    /// `Finish`, a further one every chunk of its lane.
    pub fn stream_done(&self, stream: u16) -> bool {
        if !matches!(self.phase, Phase::Receiving) {
            return !matches!(self.phase, Phase::AwaitStart | Phase::Admitting);
        }
        match self.streams.get(usize::from(stream)) {
            None => true,
            Some(_) if stream == 0 => self.finish.is_some(),
            Some(s) => self.lane_in(s),
        }
    }

    /// Feeds one event; returns what to do, in order. Nothing once the
    /// transfer ended.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        if matches!(self.phase, Phase::Ended(_)) {
            return Vec::new();
        }
        let done = match event {
            Event::Gone => {
                self.phase = Phase::Ended(Outcome::Gone);
                return Vec::new();
            }
            Event::Failed(failure) => Err(failure),
            Event::Undecodable { why, .. } => Err(protocol(why)),
            Event::Message { stream, msg } => self.message(stream, msg),
            Event::Chunk {
                stream,
                slot,
                len,
                now,
            } => self.chunk(stream, slot, len, now),
            Event::Admitted { token } => Ok(self.admitted(token)),
            Event::Joined { now } => {
                if matches!(self.phase, Phase::Receiving) && self.pace.is_none() {
                    self.pace = Some(Pace::starting_at(self.cfg.min_rate, self.cfg.deadline, now));
                }
                Ok(Vec::new())
            }
            Event::HandedOff { stream, slot } => Ok(self.handed_off(stream, slot)),
            Event::Digest(digest) => self.digest(digest),
            Event::Stored(stored) => Ok(self.stored(stored)),
        };
        done.unwrap_or_else(|failure| {
            self.phase = Phase::Ended(Outcome::Failed(failure.clone()));
            vec![Action::Fail(failure)]
        })
    }

    fn message(&mut self, stream: u16, msg: Msg) -> Result<Vec<Action>, Failure> {
        match self.phase {
            Phase::AwaitStart => self.start(msg),
            Phase::Admitting => Err(protocol(format!("{} before Ready", msg.name()))),
            Phase::Receiving if stream != 0 => {
                Err(protocol(format!("{} on stream {stream}", msg.name())))
            }
            Phase::Receiving if self.finish.is_some() => {
                Err(protocol(format!("{} after Finish", msg.name())))
            }
            Phase::Receiving => match msg {
                Msg::Finish { size, digest } => self.finished(size, digest),
                Msg::Fail { message, .. } => Err(Failure::new(
                    FailCode::Io,
                    format!(
                        "the client stopped sending {}: {}; nothing was kept",
                        self.shown,
                        printable(message.as_bytes())
                    ),
                )),
                other => Err(protocol(format!("{} during the transfer", other.name()))),
            },
            Phase::Verifying | Phase::Storing | Phase::Ended(_) => {
                Err(protocol(format!("{} after Finish", msg.name())))
            }
        }
    }

    fn start(&mut self, msg: Msg) -> Result<Vec<Action>, Failure> {
        let Msg::Start {
            size,
            streams,
            name,
        } = msg
        else {
            return Err(protocol(format!("{} before Start", msg.name())));
        };
        // The decoder's bound, checked again: the machine trusts no caller.
        if !(1..=MAX_STREAMS).contains(&streams) {
            return Err(protocol(format!(
                "Start with {streams} streams, expected 1 to {MAX_STREAMS}"
            )));
        }
        let name = name::validate(&name)
            .map_err(|e| Failure::new(FailCode::BadRequest, e.to_string()))?
            .to_owned();
        self.size = size;
        self.shown = printable(name.as_bytes());
        self.geometry = ChunkGeometry::v3(size);
        let count = u64::from(streams);
        self.streams = (0..count)
            .map(|index| Stream {
                lane: Lane { index, count },
                position: 0,
                held: None,
                credits: 0,
                received: 0,
            })
            .collect();
        self.phase = Phase::Admitting;
        Ok(vec![Action::Admit {
            size,
            streams,
            name,
        }])
    }

    fn admitted(&mut self, token: u64) -> Vec<Action> {
        // Out of turn it is a caller's slip, not the client's: nothing.
        if !matches!(self.phase, Phase::Admitting) {
            return Vec::new();
        }
        for s in &mut self.streams {
            s.credits = self.cfg.slots;
        }
        self.phase = Phase::Receiving;
        vec![Action::Send {
            stream: 0,
            msg: Msg::Ready {
                slots: self.cfg.slots,
                slot_size: self.cfg.slot_size,
                token,
            },
        }]
    }

    fn chunk(
        &mut self,
        stream: u16,
        slot: u32,
        len: u32,
        now: Instant,
    ) -> Result<Vec<Action>, Failure> {
        match self.phase {
            Phase::AwaitStart => return Err(protocol("a chunk before Start")),
            Phase::Admitting => return Err(protocol("a chunk before Ready")),
            Phase::Verifying | Phase::Storing | Phase::Ended(_) => {
                return Err(protocol("a chunk after Finish"))
            }
            Phase::Receiving => {}
        }
        let (slots, slot_size) = (self.cfg.slots, self.cfg.slot_size);
        let geometry = self.geometry;
        let count = self.streams.len();
        let Some(s) = self.streams.get_mut(usize::from(stream)) else {
            return Err(protocol(format!(
                "a chunk on stream {stream}; the transfer has {count}"
            )));
        };
        if slot >= slots {
            return Err(protocol(format!(
                "chunk for slot {slot}; the ring has {slots} slots"
            )));
        }
        let expected_slot = (s.position % u64::from(slots)) as u32;
        if slot != expected_slot {
            return Err(protocol(format!(
                "chunk for slot {slot}, expected slot {expected_slot}"
            )));
        }
        if s.held == Some(slot) || s.credits == 0 {
            return Err(protocol(format!(
                "chunk for slot {slot} while its previous chunk is still there (no credit for it)"
            )));
        }
        let index = s.lane.chunk(s.position);
        let Ok(bytes) = geometry.chunk_range(index) else {
            return Err(protocol(format!(
                "a chunk after all {} declared bytes",
                geometry.file_len()
            )));
        };
        let data = bytes.end - bytes.start;
        let want = data + TRAILER as u64;
        if u64::from(len) != want {
            return Err(protocol(format!(
                "chunk {index} has {len} bytes, expected {want}"
            )));
        }
        // A ring whose slot cannot hold the chunk is the server's own
        // setup, never the client's doing.
        if want > u64::from(slot_size) {
            return Err(Failure::new(
                FailCode::Io,
                format!("chunk {index} of {want} bytes does not fit a slot of {slot_size}"),
            ));
        }
        if let Some(pace) = &self.pace {
            pace.arrived_at(data, now).map_err(|slow| {
                Failure::new(FailCode::TooSlow, format!("{}: {slow}", self.shown))
            })?;
        }
        s.position += 1;
        s.received += data;
        s.credits -= 1;
        s.held = Some(slot);
        let start = slot as usize * slot_size as usize;
        Ok(vec![Action::Verify {
            stream,
            slot,
            index,
            range: start..start + len as usize,
        }])
    }

    fn handed_off(&mut self, stream: u16, slot: u32) -> Vec<Action> {
        let slots = self.cfg.slots;
        let Some(s) = self.streams.get_mut(usize::from(stream)) else {
            return Vec::new();
        };
        // Only a slot the server holds has a credit to give back: anything
        // else is a caller's slip, and a credit for it would let the
        // client overrun the ring.
        if s.held != Some(slot) || s.credits >= slots {
            return Vec::new();
        }
        s.held = None;
        s.credits += 1;
        let mut actions = vec![Action::Credit { stream }];
        actions.extend(self.collect_if_all_in());
        actions
    }

    fn finished(&mut self, size: u64, digest: [u8; 32]) -> Result<Vec<Action>, Failure> {
        // The first stream's chunks all come before its Finish (a queue
        // pair delivers in order): a chunk of it missing is one never sent.
        if size != self.size || !self.lane_in(&self.streams[0]) {
            return Err(Failure::new(
                FailCode::Integrity,
                format!(
                    "the client declared {} bytes, finished with {size}, and {} arrived",
                    self.size,
                    self.received()
                ),
            ));
        }
        self.finish = Some(digest);
        Ok(self.collect_if_all_in().into_iter().collect())
    }

    /// Whether every chunk of `s`'s lane arrived and was handed over.
    fn lane_in(&self, s: &Stream) -> bool {
        s.held.is_none() && s.position == s.lane.len(self.geometry.chunk_count())
    }

    fn collect_if_all_in(&mut self) -> Option<Action> {
        let all_in = self.streams.iter().all(|s| self.lane_in(s));
        (self.finish.is_some() && all_in).then(|| {
            self.phase = Phase::Verifying;
            Action::CollectDigest
        })
    }

    fn digest(&mut self, digest: Result<[u8; 32], Failure>) -> Result<Vec<Action>, Failure> {
        if !matches!(self.phase, Phase::Verifying) {
            return Ok(Vec::new());
        }
        if digest? != self.finish.expect("Verifying comes after Finish") {
            return Err(Failure::new(
                FailCode::Integrity,
                "the file's BLAKE3 digest does not match the client's: the file was not kept",
            ));
        }
        self.phase = Phase::Storing;
        Ok(vec![Action::Store])
    }

    fn stored(&mut self, stored: Result<(), Failure>) -> Vec<Action> {
        if !matches!(self.phase, Phase::Storing) {
            return Vec::new();
        }
        match stored {
            Ok(()) => {
                let size = self.size;
                self.phase = Phase::Ended(Outcome::Complete { size });
                vec![Action::Send {
                    stream: 0,
                    msg: Msg::Complete { size },
                }]
            }
            Err(failure) => {
                self.phase = Phase::Ended(Outcome::Failed(failure.clone()));
                vec![Action::Fail(failure)]
            }
        }
    }
}

fn protocol(message: impl Into<String>) -> Failure {
    Failure::new(FailCode::Protocol, message)
}
