//! The filexfer server's protocol state (`filexfer::server_core`) driven
//! by arbitrary sequences of what a client sends and of what the server's
//! own I/O reports, with the protocol's promises checked after every step:
//! nothing stored unless every chunk of the declared size was handed to
//! the verifier exactly once and the verifier's digest is the one the
//! client's `Finish` (of that size) declared; no more credits owed to a
//! stream than its ring has slots, and none for a slot that held no chunk;
//! no chunk byte past the declared size or outside the ring; nothing after
//! the end; no panic.
//!
//! The input is a script (`filexfer::server_script`, which debug builds
//! of the server record): a configuration,
//! then events. Messages are raw bytes put through `Msg::decode`, as the
//! server does, so recorded messages make seeds.
#![no_main]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use pinpoll_apps::filexfer::digest::ChunkGeometry;
use pinpoll_apps::filexfer::name::validate;
use pinpoll_apps::filexfer::protocol::Msg;
use pinpoll_apps::filexfer::server_core::{Action, Event, Outcome, ServerCore};
use pinpoll_apps::filexfer::server_script::{Op, Script};
use pinpoll_apps::filexfer::TRAILER;

/// What the target knows independently of the machine: what it was told
/// and what it was asked to do.
#[derive(Default)]
struct Oracle {
    /// `Start`'s size and streams, once the machine asked to admit them.
    admitted: Option<(u64, u16)>,
    ready_sent: bool,
    /// Chunk indices handed to the verifier.
    verified: HashSet<u64>,
    /// Per stream: chunks handed to the verifier, credits returned, the
    /// slot of its last chunk.
    verifies: Vec<u64>,
    credits: Vec<u64>,
    last_slot: Vec<u32>,
    /// The last `Finish` the machine took without failing.
    finish: Option<(u64, [u8; 32])>,
    stored: bool,
}

fuzz_target!(|bytes: &[u8]| {
    let mut script = Script::new(bytes);
    let cfg = script.config();
    let mut core = ServerCore::new(cfg);
    let mut oracle = Oracle::default();
    let base = Instant::now();
    let mut clock = Duration::ZERO;
    while let Some(op) = script.next_op() {
        let event = match op {
            Op::Message { stream, bytes } => match Msg::decode(&bytes) {
                Ok(msg) => Event::Message { stream, msg },
                Err(e) => Event::Undecodable {
                    stream,
                    why: e.to_string(),
                },
            },
            Op::Chunk { stream, slot, len } => {
                let len = len.unwrap_or_else(|| expected_len(&oracle, stream));
                Event::Chunk {
                    stream,
                    slot,
                    len,
                    now: base + clock,
                }
            }
            Op::HandedOff { stream, slot } => {
                let slot = slot.unwrap_or_else(|| {
                    oracle
                        .last_slot
                        .get(usize::from(stream))
                        .copied()
                        .unwrap_or(0)
                });
                Event::HandedOff { stream, slot }
            }
            Op::Admitted { token } => Event::Admitted { token },
            Op::Joined => Event::Joined { now: base + clock },
            Op::Advance(by) => {
                clock += by;
                continue;
            }
            Op::Digest(digest) => {
                let finish = oracle.finish.map_or([0; 32], |(_, d)| d);
                Event::Digest(digest.map(|d| d.unwrap_or(finish)))
            }
            Op::Stored(stored) => Event::Stored(stored),
            Op::Failed(failure) => Event::Failed(failure),
            Op::Gone => Event::Gone,
        };
        step(&mut core, &mut oracle, cfg.slots, cfg.slot_size, event);
    }
});

/// The length of the next chunk of `stream` by the oracle's count (1 byte
/// where there is none), so that the fuzzer reaches the checks past the
/// length without guessing it.
fn expected_len(oracle: &Oracle, stream: u16) -> u32 {
    let Some((size, streams)) = oracle.admitted else {
        return 1;
    };
    let position = oracle
        .verifies
        .get(usize::from(stream))
        .copied()
        .unwrap_or(0);
    let index = u64::from(stream) + position * u64::from(streams);
    match ChunkGeometry::v3(size).chunk_range(index) {
        Ok(r) => (r.end - r.start) as u32 + TRAILER as u32,
        Err(_) => 1,
    }
}

fn step(core: &mut ServerCore, o: &mut Oracle, slots: u32, slot_size: u32, event: Event) {
    let ended_before = core.outcome().cloned();
    let seen = Seen::of(&event);
    let actions = core.handle(event);
    if let Some(outcome) = ended_before {
        assert!(actions.is_empty(), "{actions:?} after the end");
        assert_eq!(core.outcome(), Some(&outcome), "the end changed");
        return;
    }
    let failed = matches!(actions.last(), Some(Action::Fail(_)));
    if failed {
        assert!(
            matches!(core.outcome(), Some(Outcome::Failed(_))),
            "{actions:?} without a failed outcome"
        );
    } else if seen.finish.is_some() {
        o.finish = seen.finish;
    }
    for (i, action) in actions.iter().enumerate() {
        o.check(
            core,
            &seen,
            slots,
            slot_size,
            (i, actions.len() - 1),
            action,
        );
    }
    for (stream, verifies) in o.verifies.iter().enumerate() {
        let credits = core.credits(stream as u16);
        assert!(
            credits <= slots,
            "stream {stream}: {credits} credits for {slots} slots"
        );
        if o.ready_sent {
            // The client holds every slot but those whose chunk the
            // server has not handed off.
            let held = verifies - o.credits[stream];
            assert_eq!(
                u64::from(credits) + held,
                u64::from(slots),
                "stream {stream}"
            );
        }
    }
    if let Some((size, _)) = o.admitted {
        assert!(
            core.received() <= size,
            "{} bytes of {size}",
            core.received()
        );
    }
}

/// What the event of a step told the oracle, for judging its actions.
struct Seen {
    /// The verifier's digest, when the event was its success.
    digest: Option<[u8; 32]>,
    /// Whether the event was a store that succeeded.
    stored_ok: bool,
    /// Whether the event was the admission of `Start`.
    admitted: bool,
    /// The `Start` the event carried: its stream, size, streams and name.
    start: Option<(u16, u64, u16, Vec<u8>)>,
    /// The `Finish` on the first stream the event carried: size, digest.
    finish: Option<(u64, [u8; 32])>,
}

impl Seen {
    fn of(event: &Event) -> Seen {
        let mut seen = Seen {
            digest: None,
            stored_ok: false,
            admitted: false,
            start: None,
            finish: None,
        };
        match event {
            Event::Digest(Ok(d)) => seen.digest = Some(*d),
            Event::Stored(Ok(())) => seen.stored_ok = true,
            Event::Admitted { .. } => seen.admitted = true,
            Event::Message {
                stream,
                msg:
                    Msg::Start {
                        size,
                        streams,
                        name,
                    },
            } => seen.start = Some((*stream, *size, *streams, name.clone())),
            Event::Message {
                stream: 0,
                msg: Msg::Finish { size, digest },
            } => seen.finish = Some((*size, *digest)),
            _ => {}
        }
        seen
    }
}

impl Oracle {
    /// Checks `action`, number `i` of a step's actions (`last` the last
    /// one's), against what the machine promised so far, and records it.
    fn check(
        &mut self,
        core: &ServerCore,
        seen: &Seen,
        slots: u32,
        slot_size: u32,
        (i, last): (usize, usize),
        action: &Action,
    ) {
        match action {
            Action::Fail(_) => assert_eq!(i, last, "{action:?}: Fail not last"),
            Action::Admit {
                size,
                streams,
                name,
            } => {
                assert!(self.admitted.is_none(), "admitted twice");
                // Exactly what the client's Start carried, on its first
                // stream, under a name that passed the server's check.
                let (on, started, asked, named) =
                    seen.start.clone().expect("admitted without a Start");
                assert_eq!((on, started, asked), (0, *size, *streams), "{action:?}");
                assert_eq!(validate(&named).ok(), Some(name.as_str()), "{action:?}");
                self.admitted = Some((*size, *streams));
                let n = usize::from(*streams);
                (self.verifies, self.credits, self.last_slot) =
                    (vec![0; n], vec![0; n], vec![0; n]);
            }
            Action::Send {
                stream: 0,
                msg: Msg::Ready { slots: s, .. },
            } => {
                assert!(seen.admitted && !self.ready_sent, "Ready out of turn");
                assert_eq!(*s, slots);
                self.ready_sent = true;
            }
            Action::Verify {
                stream,
                slot,
                index,
                range,
            } => self.check_verify(slots, slot_size, (*stream, *slot, *index), range, action),
            Action::Credit { stream } => {
                let s = usize::from(*stream);
                self.credits[s] += 1;
                assert!(
                    self.credits[s] <= self.verifies[s],
                    "stream {stream}: a credit for no chunk"
                );
            }
            Action::CollectDigest => {
                assert!(self.finish.is_some(), "the digest collected before Finish");
            }
            Action::Store => self.check_store(seen),
            Action::Send {
                stream: 0,
                msg: Msg::Complete { size },
            } => {
                assert!(self.stored && seen.stored_ok, "Complete without a store");
                assert_eq!(Some(*size), self.admitted.map(|(s, _)| s));
                assert_eq!(core.outcome(), Some(&Outcome::Complete { size: *size }));
            }
            Action::Send { .. } => panic!("{action:?}: not the server's to send"),
        }
    }

    /// A store: only of a file whose every chunk was verified once and
    /// handed off, after a `Finish` of the declared size whose digest the
    /// verifier's matched.
    fn check_store(&mut self, seen: &Seen) {
        assert!(!self.stored, "stored twice");
        let (size, _) = self.admitted.expect("stored before Start");
        let (finished, declared) = self.finish.expect("stored before Finish");
        assert_eq!(finished, size, "stored a Finish of another size");
        assert_eq!(
            self.verified.len() as u64,
            ChunkGeometry::v3(size).chunk_count(),
            "stored with chunks never verified"
        );
        assert_eq!(
            self.credits, self.verifies,
            "stored with a chunk still in its slot"
        );
        assert_eq!(
            seen.digest,
            Some(declared),
            "stored without the declared digest"
        );
        self.stored = true;
    }

    /// A chunk handed to the verifier: of an admitted transfer after
    /// Ready, from its stream's lane, within the ring and the declared
    /// size, with the chunk's exact length, and each index once.
    fn check_verify(
        &mut self,
        slots: u32,
        slot_size: u32,
        (stream, slot, index): (u16, u32, u64),
        range: &std::ops::Range<usize>,
        action: &Action,
    ) {
        let (size, streams) = self.admitted.expect("a chunk verified before Start");
        assert!(self.ready_sent, "a chunk verified before Ready");
        assert!(stream < streams && slot < slots, "{action:?}");
        assert_eq!(u64::from(stream), index % u64::from(streams), "{action:?}");
        let chunk = ChunkGeometry::v3(size)
            .chunk_range(index)
            .unwrap_or_else(|_| panic!("{action:?}: a chunk past {size} bytes"));
        let start = slot as usize * slot_size as usize;
        assert_eq!(
            *range,
            start..start + (chunk.end - chunk.start) as usize + TRAILER,
            "{action:?}"
        );
        assert!(
            range.end <= slots as usize * slot_size as usize,
            "{action:?}"
        );
        assert!(self.verified.insert(index), "chunk {index} verified twice");
        let s = usize::from(stream);
        self.verifies[s] += 1;
        self.last_slot[s] = slot;
    }
}
