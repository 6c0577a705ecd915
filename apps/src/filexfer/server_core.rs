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
//! is the one `Finish` declared; no chunk outside the declared size, or
//! taken into a slot whose previous chunk was not yet handed off (a guard
//! on the driver: an RDMA WRITE lands without a credit, and the server
//! hands each chunk off before it takes the next, so a client's write
//! without credit is caught by verification instead); never more credits
//! owed to a stream than its ring has slots; nothing after the end.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::digest::ChunkGeometry;
use super::name;
use super::pace::Pace;
use super::protocol::{FailCode, Msg, MAX_STREAMS};
use super::read_ahead::Lane;
use super::server_script::Recorder;
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
    /// The slots whose chunk is not yet handed to the verifier: the
    /// server's I/O may take more than one chunk before it hands them off.
    held: Vec<bool>,
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
    /// The events fed, as a script, when recording.
    recorder: Option<Recorder>,
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
            recorder: None,
        }
    }

    /// A machine that keeps the events it is fed as a script
    /// ([`script`](Self::script)).
    pub fn recording(cfg: Config) -> Self {
        ServerCore {
            recorder: Some(Recorder::new(&cfg)),
            ..Self::new(cfg)
        }
    }

    /// The events fed so far as a script, when recording.
    pub fn script(&self) -> Option<&[u8]> {
        self.recorder.as_ref().map(Recorder::bytes)
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
        let mut out = Vec::new();
        self.handle_into(event, &mut out);
        out
    }

    /// [`handle`](Self::handle), the actions into `out` (emptied first):
    /// a caller that keeps `out` allocates nothing per chunk, as the
    /// server's busy-poll threads must not.
    pub fn handle_into(&mut self, event: Event, out: &mut Vec<Action>) {
        out.clear();
        if matches!(self.phase, Phase::Ended(_)) {
            return;
        }
        if let Some(recorder) = &mut self.recorder {
            recorder.record(&event);
        }
        let done = match event {
            Event::Gone => {
                self.phase = Phase::Ended(Outcome::Gone);
                Ok(())
            }
            Event::Failed(failure) => Err(failure),
            Event::Undecodable { why, .. } => Err(protocol(why)),
            Event::Message { stream, msg } => self.message(stream, msg, out),
            Event::Chunk {
                stream,
                slot,
                len,
                now,
            } => self.chunk(stream, slot, len, now, out),
            Event::Admitted { token } => {
                self.admitted(token, out);
                Ok(())
            }
            Event::Joined { now } => {
                if matches!(self.phase, Phase::Receiving) && self.pace.is_none() {
                    self.pace = Some(Pace::starting_at(self.cfg.min_rate, self.cfg.deadline, now));
                }
                Ok(())
            }
            Event::HandedOff { stream, slot } => {
                self.handed_off(stream, slot, out);
                Ok(())
            }
            Event::Digest(digest) => self.digest(digest, out),
            Event::Stored(stored) => self.stored(stored, out),
        };
        if let Err(failure) = done {
            self.phase = Phase::Ended(Outcome::Failed(failure.clone()));
            out.clear();
            out.push(Action::Fail(failure));
        }
    }

    fn message(&mut self, stream: u16, msg: Msg, out: &mut Vec<Action>) -> Result<(), Failure> {
        match self.phase {
            // Before Start there is one stream, the transfer's first: a
            // driver that names another is refused like a client would be.
            Phase::AwaitStart if stream != 0 => Err(protocol(format!(
                "{} on stream {stream} before Start",
                msg.name()
            ))),
            Phase::AwaitStart => self.start(msg, out),
            Phase::Admitting => Err(protocol(format!("{} before Ready", msg.name()))),
            Phase::Receiving if stream != 0 => {
                Err(protocol(format!("{} on stream {stream}", msg.name())))
            }
            Phase::Receiving if self.finish.is_some() => {
                Err(protocol(format!("{} after Finish", msg.name())))
            }
            Phase::Receiving => match msg {
                Msg::Finish { size, digest } => self.finished(size, digest, out),
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

    fn start(&mut self, msg: Msg, out: &mut Vec<Action>) -> Result<(), Failure> {
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
                held: Vec::new(),
                credits: 0,
                received: 0,
            })
            .collect();
        self.phase = Phase::Admitting;
        out.push(Action::Admit {
            size,
            streams,
            name,
        });
        Ok(())
    }

    fn admitted(&mut self, token: u64, out: &mut Vec<Action>) {
        // Out of turn it is a caller's slip, not the client's: nothing.
        if !matches!(self.phase, Phase::Admitting) {
            return;
        }
        for s in &mut self.streams {
            s.credits = self.cfg.slots;
            s.held = vec![false; self.cfg.slots as usize];
        }
        self.phase = Phase::Receiving;
        out.push(Action::Send {
            stream: 0,
            msg: Msg::Ready {
                slots: self.cfg.slots,
                slot_size: self.cfg.slot_size,
                token,
            },
        });
    }

    fn chunk(
        &mut self,
        stream: u16,
        slot: u32,
        len: u32,
        now: Instant,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
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
        if s.held[slot as usize] || s.credits == 0 {
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
        s.held[slot as usize] = true;
        let start = slot as usize * slot_size as usize;
        out.push(Action::Verify {
            stream,
            slot,
            index,
            range: start..start + len as usize,
        });
        Ok(())
    }

    fn handed_off(&mut self, stream: u16, slot: u32, out: &mut Vec<Action>) {
        let slots = self.cfg.slots;
        let Some(s) = self.streams.get_mut(usize::from(stream)) else {
            return;
        };
        // Only a slot the server holds has a credit to give back: anything
        // else is a caller's slip, and a credit for it would let the
        // client overrun the ring.
        if !s.held.get(slot as usize).copied().unwrap_or(false) || s.credits >= slots {
            return;
        }
        s.held[slot as usize] = false;
        s.credits += 1;
        out.push(Action::Credit { stream });
        out.extend(self.collect_if_all_in());
    }

    fn finished(
        &mut self,
        size: u64,
        digest: [u8; 32],
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        // The first stream's chunks all come before its Finish (a queue
        // pair delivers in order): a chunk of it missing is one never sent.
        if size != self.size || !self.lane_arrived(&self.streams[0]) {
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
        out.extend(self.collect_if_all_in());
        Ok(())
    }

    /// Whether every chunk of `s`'s lane arrived.
    fn lane_arrived(&self, s: &Stream) -> bool {
        s.position == s.lane.len(self.geometry.chunk_count())
    }

    /// Whether every chunk of `s`'s lane arrived and was handed over.
    fn lane_in(&self, s: &Stream) -> bool {
        self.lane_arrived(s) && !s.held.contains(&true)
    }

    fn collect_if_all_in(&mut self) -> Option<Action> {
        let all_in = self.streams.iter().all(|s| self.lane_in(s));
        (self.finish.is_some() && all_in).then(|| {
            self.phase = Phase::Verifying;
            Action::CollectDigest
        })
    }

    fn digest(
        &mut self,
        digest: Result<[u8; 32], Failure>,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        if !matches!(self.phase, Phase::Verifying) {
            return Ok(());
        }
        if digest? != self.finish.expect("Verifying comes after Finish") {
            return Err(Failure::new(
                FailCode::Integrity,
                "the file's BLAKE3 digest does not match the client's: the file was not kept",
            ));
        }
        self.phase = Phase::Storing;
        out.push(Action::Store);
        Ok(())
    }

    fn stored(
        &mut self,
        stored: Result<(), Failure>,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        if !matches!(self.phase, Phase::Storing) {
            return Ok(());
        }
        stored?;
        let size = self.size;
        self.phase = Phase::Ended(Outcome::Complete { size });
        out.push(Action::Send {
            stream: 0,
            msg: Msg::Complete { size },
        });
        Ok(())
    }
}

fn protocol(message: impl Into<String>) -> Failure {
    Failure::new(FailCode::Protocol, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filexfer::{CHUNK, SLOT_SIZE};

    const DIGEST: [u8; 32] = [7; 32];

    /// A client and the server's I/O, as far as a test needs: every action
    /// the machine asked for is kept, and a chunk's hand-off to the
    /// verifier follows it at once, as in the server.
    struct Peer {
        core: ServerCore,
        actions: Vec<Action>,
        now: Instant,
    }

    impl Peer {
        fn with(cfg: Config) -> Self {
            Peer {
                core: ServerCore::new(cfg),
                actions: Vec::new(),
                now: Instant::now(),
            }
        }

        fn new(slots: u32) -> Self {
            Self::with(Config {
                slots,
                slot_size: SLOT_SIZE,
                min_rate: 0,
                deadline: Duration::ZERO,
            })
        }

        /// A transfer of `size` bytes on `streams` streams, Ready given
        /// and every stream joined.
        fn started(slots: u32, size: u64, streams: u16) -> Self {
            let mut p = Self::new(slots);
            let start = p.message(0, start(size, streams));
            assert!(matches!(&start[..], [Action::Admit { .. }]), "{start:?}");
            let ready = p.feed(Event::Admitted { token: 9 });
            assert!(
                matches!(
                    &ready[..],
                    [Action::Send {
                        stream: 0,
                        msg: Msg::Ready { token: 9, .. }
                    }]
                ),
                "{ready:?}"
            );
            assert_eq!(p.feed(Event::Joined { now: p.now }), []);
            p
        }

        fn feed(&mut self, event: Event) -> Vec<Action> {
            let actions = self.core.handle(event);
            self.actions.extend(actions.iter().cloned());
            actions
        }

        fn message(&mut self, stream: u16, msg: Msg) -> Vec<Action> {
            self.feed(Event::Message { stream, msg })
        }

        fn raw_chunk(&mut self, stream: u16, slot: u32, len: u32) -> Vec<Action> {
            let now = self.now;
            self.feed(Event::Chunk {
                stream,
                slot,
                len,
                now,
            })
        }

        /// Chunk `index` of a `size`-byte file over `streams` streams, in
        /// its slot with its length; handed off when the machine asks.
        fn chunk(&mut self, size: u64, streams: u16, index: u64) -> Vec<Action> {
            let stream = (index % u64::from(streams)) as u16;
            let position = index / u64::from(streams);
            let slot = (position % u64::from(self.core.cfg.slots)) as u32;
            let mut actions = self.raw_chunk(stream, slot, chunk_len(size, index));
            if let [Action::Verify { index: asked, .. }] = &actions[..] {
                assert_eq!(*asked, index);
                actions.extend(self.feed(Event::HandedOff { stream, slot }));
            }
            actions
        }

        fn all_chunks(&mut self, size: u64, streams: u16) {
            for index in 0..ChunkGeometry::v3(size).chunk_count() {
                let got = self.chunk(size, streams, index);
                assert!(matches!(got[0], Action::Verify { .. }), "{index}: {got:?}");
            }
        }

        /// The transfer's failure, checked to be the last action and
        /// never to follow a store.
        fn failure(&self) -> &Failure {
            assert!(!self.actions.contains(&Action::Store), "{:?}", self.actions);
            match (self.actions.last(), self.core.outcome()) {
                (Some(Action::Fail(f)), Some(Outcome::Failed(g))) if f == g => f,
                other => panic!("no failure: {other:?}"),
            }
        }

        fn assert_fails(&self, code: FailCode, says: &str) {
            let f = self.failure();
            assert_eq!(f.code, code, "{f:?}");
            assert!(
                f.message.contains(says),
                "{:?} does not say {says:?}",
                f.message
            );
        }
    }

    fn start(size: u64, streams: u16) -> Msg {
        Msg::Start {
            size,
            streams,
            name: b"f.bin".to_vec(),
        }
    }

    fn finish(size: u64) -> Msg {
        Msg::Finish {
            size,
            digest: DIGEST,
        }
    }

    fn chunk_len(size: u64, index: u64) -> u32 {
        let range = ChunkGeometry::v3(size).chunk_range(index).unwrap();
        (range.end - range.start) as u32 + TRAILER as u32
    }

    #[test]
    fn a_transfer_by_the_rules_is_stored_then_completed_and_nothing_follows() {
        let size = 2 * CHUNK + 5;
        let mut p = Peer::started(2, size, 1);
        for index in 0..3 {
            let slot = (index % 2) as u32;
            let got = p.chunk(size, 1, index);
            let start = slot as usize * SLOT_SIZE as usize;
            let len = chunk_len(size, index) as usize;
            assert_eq!(
                got,
                [
                    Action::Verify {
                        stream: 0,
                        slot,
                        index,
                        range: start..start + len
                    },
                    Action::Credit { stream: 0 }
                ]
            );
            assert_eq!(p.core.credits(0), 2);
        }
        assert_eq!(p.core.received(), size);
        assert!(!p.core.stream_done(0));
        assert_eq!(p.message(0, finish(size)), [Action::CollectDigest]);
        assert!(p.core.stream_done(0));
        assert_eq!(p.feed(Event::Digest(Ok(DIGEST))), [Action::Store]);
        assert_eq!(
            p.feed(Event::Stored(Ok(()))),
            [Action::Send {
                stream: 0,
                msg: Msg::Complete { size }
            }]
        );
        assert_eq!(p.core.outcome(), Some(&Outcome::Complete { size }));
        // The end is the end, whatever comes.
        let now = p.now;
        for event in [
            Event::Message {
                stream: 0,
                msg: finish(size),
            },
            Event::Chunk {
                stream: 0,
                slot: 0,
                len: 1,
                now,
            },
            Event::Stored(Ok(())),
            Event::Failed(Failure::new(FailCode::Io, "late")),
            Event::Gone,
        ] {
            assert_eq!(p.feed(event), []);
        }
        assert_eq!(p.core.outcome(), Some(&Outcome::Complete { size }));
    }

    #[test]
    fn an_empty_file_needs_only_finish() {
        let mut p = Peer::started(4, 0, 1);
        assert_eq!(p.message(0, finish(0)), [Action::CollectDigest]);
        assert_eq!(p.feed(Event::Digest(Ok(DIGEST))), [Action::Store]);
    }

    /// Finish on the first stream may overtake the other streams' last
    /// chunks: the digest is collected after the last of them.
    #[test]
    fn striped_streams_are_collected_after_the_last_chunk_of_any_stream() {
        let size = 5 * CHUNK;
        let mut p = Peer::started(2, size, 3);
        for index in [0, 1, 3, 2] {
            p.chunk(size, 3, index);
        }
        assert!(p.core.stream_done(2), "stream 2 has all its chunks");
        assert!(!p.core.stream_done(1));
        assert_eq!(p.message(0, finish(size)), []);
        assert_eq!(
            p.chunk(size, 3, 4),
            [
                Action::Verify {
                    stream: 1,
                    slot: 1,
                    index: 4,
                    range: SLOT_SIZE as usize..SLOT_SIZE as usize + chunk_len(size, 4) as usize
                },
                Action::Credit { stream: 1 },
                Action::CollectDigest
            ]
        );
    }

    /// Every way a client can break the protocol fails the transfer with
    /// the code it deserves, and nothing is stored.
    #[test]
    fn every_protocol_violation_fails_with_its_code_and_stores_nothing() {
        use FailCode::*;
        type Case = (&'static str, fn(&mut Peer), FailCode, &'static str);
        let cases: &[Case] = &[
            (
                "a chunk first",
                |p| {
                    p.raw_chunk(0, 0, 10);
                },
                Protocol,
                "a chunk before Start",
            ),
            (
                "Finish first",
                |p| {
                    p.message(0, finish(0));
                },
                Protocol,
                "Finish before Start",
            ),
            (
                "undecodable",
                |p| {
                    p.feed(Event::Undecodable {
                        stream: 0,
                        why: "unknown message kind 42".into(),
                    });
                },
                Protocol,
                "unknown message kind 42",
            ),
            (
                "a bad name",
                |p| {
                    p.message(
                        0,
                        Msg::Start {
                            size: 1,
                            streams: 1,
                            name: b"../x".to_vec(),
                        },
                    );
                },
                BadRequest,
                "",
            ),
            (
                "Start on a stream other than the first",
                |p| {
                    p.message(1, start(1, 4));
                },
                Protocol,
                "Start on stream 1 before Start",
            ),
            (
                "no streams",
                |p| {
                    p.message(0, start(1, 0));
                },
                Protocol,
                "0 streams",
            ),
            (
                "a message before Ready",
                |p| {
                    p.message(0, start(1, 1));
                    p.message(0, finish(1));
                },
                Protocol,
                "Finish before Ready",
            ),
            (
                "a chunk before Ready",
                |p| {
                    p.message(0, start(1, 1));
                    p.raw_chunk(0, 0, 1 + TRAILER as u32);
                },
                Protocol,
                "a chunk before Ready",
            ),
            (
                "a slot beyond the ring",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.raw_chunk(0, 4, chunk_len(3 * CHUNK, 0));
                },
                Protocol,
                "chunk for slot 4; the ring has 4 slots",
            ),
            (
                "the wrong slot",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.raw_chunk(0, 1, chunk_len(3 * CHUNK, 0));
                },
                Protocol,
                "chunk for slot 1, expected slot 0",
            ),
            (
                "a slot with no credit",
                |p| {
                    *p = Peer::started(1, 3 * CHUNK, 1);
                    let len = chunk_len(3 * CHUNK, 0);
                    p.raw_chunk(0, 0, len);
                    p.raw_chunk(0, 0, len);
                },
                Protocol,
                "no credit",
            ),
            (
                "a chunk too short",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.raw_chunk(0, 0, 100);
                },
                Protocol,
                "chunk 0 has 100 bytes",
            ),
            (
                "a chunk past the size (one sent twice)",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.all_chunks(3 * CHUNK, 1);
                    // The last chunk again, into the slot next in turn.
                    p.raw_chunk(0, 3, chunk_len(3 * CHUNK, 2));
                },
                Protocol,
                "a chunk after all 786432 declared bytes",
            ),
            (
                "a chunk on a stream the transfer lacks",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 2);
                    p.raw_chunk(2, 0, chunk_len(3 * CHUNK, 0));
                },
                Protocol,
                "stream 2; the transfer has 2",
            ),
            (
                "a message on a further stream",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 2);
                    p.message(1, finish(3 * CHUNK));
                },
                Protocol,
                "Finish on stream 1",
            ),
            (
                "Start during the transfer",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.message(0, start(1, 1));
                },
                Protocol,
                "Start during the transfer",
            ),
            (
                "Credit during the transfer",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.message(0, Msg::Credit { count: 1 });
                },
                Protocol,
                "Credit during the transfer",
            ),
            (
                "Finish with another size",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.all_chunks(3 * CHUNK, 1);
                    p.message(0, finish(3 * CHUNK - 1));
                },
                Integrity,
                "declared 786432 bytes, finished with 786431, and 786432 arrived",
            ),
            (
                "Finish before every byte",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.chunk(3 * CHUNK, 1, 0);
                    p.message(0, finish(3 * CHUNK));
                },
                Integrity,
                "and 262144 arrived",
            ),
            (
                "a message after Finish",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 2);
                    p.chunk(3 * CHUNK, 2, 0);
                    p.chunk(3 * CHUNK, 2, 2);
                    p.message(0, finish(3 * CHUNK));
                    p.message(0, finish(3 * CHUNK));
                },
                Protocol,
                "Finish after Finish",
            ),
            (
                "a chunk after Finish",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.all_chunks(3 * CHUNK, 1);
                    p.message(0, finish(3 * CHUNK));
                    p.raw_chunk(0, 3, 10);
                },
                Protocol,
                "a chunk after Finish",
            ),
            (
                "the wrong digest",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.all_chunks(3 * CHUNK, 1);
                    p.message(0, finish(3 * CHUNK));
                    p.feed(Event::Digest(Ok([8; 32])));
                },
                Integrity,
                "BLAKE3 digest does not match",
            ),
            (
                "the client gives up",
                |p| {
                    *p = Peer::started(4, 3 * CHUNK, 1);
                    p.message(
                        0,
                        Msg::Fail {
                            code: Io,
                            message: "changed\n".into(),
                        },
                    );
                },
                Io,
                "the client stopped sending f.bin: changed\\n; nothing was kept",
            ),
        ];
        for (what, act, code, says) in cases {
            let mut p = Peer::new(4);
            act(&mut p);
            let f = p.failure();
            assert_eq!(f.code, *code, "{what}: {f:?}");
            assert!(f.message.contains(says), "{what}: {:?}", f.message);
        }
    }

    #[test]
    fn a_failure_of_the_servers_own_work_is_told_and_nothing_is_stored() {
        let size = CHUNK;
        let refused = Failure::new(FailCode::TooLarge, "too large");
        let mut p = Peer::new(4);
        p.message(0, start(size, 1));
        assert_eq!(
            p.feed(Event::Failed(refused.clone())),
            [Action::Fail(refused)]
        );
        assert_eq!(p.feed(Event::Admitted { token: 1 }), []);

        let mismatch = Failure::new(FailCode::Integrity, "chunk 0 does not match");
        let mut p = Peer::started(4, size, 1);
        p.all_chunks(size, 1);
        p.message(0, finish(size));
        p.feed(Event::Digest(Err(mismatch)));
        p.assert_fails(FailCode::Integrity, "chunk 0 does not match");

        let mut p = Peer::started(4, size, 1);
        p.all_chunks(size, 1);
        p.message(0, finish(size));
        p.feed(Event::Digest(Ok(DIGEST)));
        p.feed(Event::Stored(Err(Failure::new(
            FailCode::Exists,
            "appeared",
        ))));
        assert_eq!(
            p.core.outcome(),
            Some(&Outcome::Failed(Failure::new(FailCode::Exists, "appeared")))
        );
        assert_eq!(
            p.actions.last(),
            Some(&Action::Fail(Failure::new(FailCode::Exists, "appeared")))
        );

        let mut p = Peer::started(4, size, 1);
        assert_eq!(p.feed(Event::Gone), []);
        assert_eq!(p.core.outcome(), Some(&Outcome::Gone));
        assert_eq!(p.message(0, finish(size)), []);
    }

    /// The server's I/O out of turn is ignored: it never stores, credits
    /// a slot it does not hold, or answers before its time.
    #[test]
    fn events_out_of_turn_change_nothing() {
        let size = 2 * CHUNK;
        let mut p = Peer::started(2, size, 1);
        assert_eq!(p.feed(Event::Digest(Ok(DIGEST))), []);
        assert_eq!(p.feed(Event::Stored(Ok(()))), []);
        assert_eq!(p.feed(Event::Admitted { token: 1 }), []);
        assert_eq!(p.feed(Event::HandedOff { stream: 0, slot: 0 }), []);
        assert_eq!(p.feed(Event::HandedOff { stream: 5, slot: 0 }), []);
        assert_eq!(p.core.credits(0), 2);
        let held = p.raw_chunk(0, 0, chunk_len(size, 0));
        assert!(matches!(held[..], [Action::Verify { .. }]), "{held:?}");
        assert_eq!(p.core.credits(0), 1);
        assert_eq!(p.feed(Event::HandedOff { stream: 0, slot: 1 }), []);
        assert_eq!(
            p.feed(Event::HandedOff { stream: 0, slot: 0 }),
            [Action::Credit { stream: 0 }]
        );
        assert_eq!(p.feed(Event::HandedOff { stream: 0, slot: 0 }), []);
        assert_eq!(p.core.credits(0), 2);
        assert!(p.core.outcome().is_none());
        assert!(!p.actions.contains(&Action::Store));
    }

    /// Found by the fuzz target: chunks taken out of two slots before
    /// either is handed off must both be handed off before the digest is
    /// collected, and each slot credited once.
    #[test]
    fn every_chunk_still_in_its_slot_holds_back_the_digest() {
        let size = 2 * CHUNK;
        let mut p = Peer::started(4, size, 1);
        p.raw_chunk(0, 0, chunk_len(size, 0));
        p.raw_chunk(0, 1, chunk_len(size, 1));
        assert_eq!(p.core.credits(0), 2);
        assert_eq!(
            p.feed(Event::HandedOff { stream: 0, slot: 1 }),
            [Action::Credit { stream: 0 }]
        );
        assert_eq!(p.message(0, finish(size)), [], "slot 0 is still held");
        assert_eq!(
            p.feed(Event::HandedOff { stream: 0, slot: 0 }),
            [Action::Credit { stream: 0 }, Action::CollectDigest]
        );
        assert_eq!(p.feed(Event::HandedOff { stream: 0, slot: 0 }), []);
        assert_eq!(p.core.credits(0), 4);
    }

    #[test]
    fn a_client_too_slow_or_past_the_deadline_is_cut_off() {
        let size = 4 * CHUNK;
        for (min_rate, deadline, says) in [
            (1 << 20, Duration::from_secs(3600), "--min-rate"),
            (0, Duration::from_secs(5), "--deadline 5 s"),
        ] {
            let mut p = Peer::with(Config {
                slots: 4,
                slot_size: SLOT_SIZE,
                min_rate,
                deadline,
            });
            p.message(0, start(size, 1));
            p.feed(Event::Admitted { token: 0 });
            p.feed(Event::Joined { now: p.now });
            p.chunk(size, 1, 0);
            // One chunk in 11 s: 24 KiB/s, and past a 5 s deadline.
            p.now += Duration::from_secs(11);
            p.chunk(size, 1, 1);
            p.assert_fails(FailCode::TooSlow, says);
        }
    }
}
