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
use pinpoll_apps::filexfer::protocol::Msg;
use pinpoll_apps::filexfer::server_core::{Action, Event, Outcome, ServerCore};
use pinpoll_apps::filexfer::TRAILER;
use pinpoll_apps::filexfer::server_script::{Op, Script};

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
    let position = oracle.verifies.get(usize::from(stream)).copied().unwrap_or(0);
    let index = u64::from(stream) + position * u64::from(streams);
    match ChunkGeometry::v3(size).chunk_range(index) {
        Ok(r) => (r.end - r.start) as u32 + TRAILER as u32,
        Err(_) => 1,
    }
}

fn step(core: &mut ServerCore, o: &mut Oracle, slots: u32, slot_size: u32, event: Event) {
    let ended_before = core.outcome().cloned();
    let digest_in = match &event {
        Event::Digest(Ok(d)) => Some(*d),
        _ => None,
    };
    let stored_ok = matches!(event, Event::Stored(Ok(())));
    let admitted_event = matches!(event, Event::Admitted { .. });
    let finish_in = match &event {
        Event::Message {
            stream: 0,
            msg: Msg::Finish { size, digest },
        } => Some((*size, *digest)),
        _ => None,
    };
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
    } else if finish_in.is_some() {
        o.finish = finish_in;
    }
    for (i, action) in actions.iter().enumerate() {
        match action {
            Action::Fail(_) => assert_eq!(i + 1, actions.len(), "{actions:?}: Fail not last"),
            Action::Admit { size, streams, .. } => {
                assert!(o.admitted.is_none(), "admitted twice");
                o.admitted = Some((*size, *streams));
                let n = usize::from(*streams);
                (o.verifies, o.credits, o.last_slot) = (vec![0; n], vec![0; n], vec![0; n]);
            }
            Action::Send {
                stream: 0,
                msg: Msg::Ready { slots: s, .. },
            } => {
                assert!(admitted_event && !o.ready_sent, "Ready out of turn");
                assert_eq!(*s, slots);
                o.ready_sent = true;
            }
            Action::Verify {
                stream,
                slot,
                index,
                range,
            } => {
                let (size, streams) = o.admitted.expect("a chunk verified before Start");
                assert!(o.ready_sent, "a chunk verified before Ready");
                assert!(*stream < streams && *slot < slots, "{action:?}");
                assert_eq!(u64::from(*stream), index % u64::from(streams), "{action:?}");
                let chunk = ChunkGeometry::v3(size)
                    .chunk_range(*index)
                    .unwrap_or_else(|_| panic!("{action:?}: a chunk past {size} bytes"));
                let start = *slot as usize * slot_size as usize;
                assert_eq!(
                    *range,
                    start..start + (chunk.end - chunk.start) as usize + TRAILER,
                    "{action:?}"
                );
                assert!(range.end <= slots as usize * slot_size as usize, "{action:?}");
                assert!(o.verified.insert(*index), "chunk {index} verified twice");
                let s = usize::from(*stream);
                o.verifies[s] += 1;
                o.last_slot[s] = *slot;
            }
            Action::Credit { stream } => {
                let s = usize::from(*stream);
                o.credits[s] += 1;
                assert!(
                    o.credits[s] <= o.verifies[s],
                    "stream {stream}: a credit for no chunk"
                );
            }
            Action::CollectDigest => {
                assert!(o.finish.is_some(), "the digest collected before Finish");
            }
            Action::Store => {
                assert!(!o.stored, "stored twice");
                let (size, _) = o.admitted.expect("stored before Start");
                let (finished, declared) = o.finish.expect("stored before Finish");
                assert_eq!(finished, size, "stored a Finish of another size");
                assert_eq!(
                    o.verified.len() as u64,
                    ChunkGeometry::v3(size).chunk_count(),
                    "stored with chunks never verified"
                );
                assert_eq!(o.credits, o.verifies, "stored with a chunk still in its slot");
                assert_eq!(digest_in, Some(declared), "stored without the declared digest");
                o.stored = true;
            }
            Action::Send {
                stream: 0,
                msg: Msg::Complete { size },
            } => {
                assert!(o.stored && stored_ok, "Complete without a store");
                assert_eq!(Some(*size), o.admitted.map(|(s, _)| s));
                assert_eq!(core.outcome(), Some(&Outcome::Complete { size: *size }));
            }
            Action::Send { .. } => panic!("{action:?}: not the server's to send"),
        }
    }
    for (stream, verifies) in o.verifies.iter().enumerate() {
        let credits = core.credits(stream as u16);
        assert!(credits <= slots, "stream {stream}: {credits} credits for {slots} slots");
        if o.ready_sent {
            // The client holds every slot but those whose chunk the
            // server has not handed off.
            let held = verifies - o.credits[stream];
            assert_eq!(u64::from(credits) + held, u64::from(slots), "stream {stream}");
        }
    }
    if let Some((size, _)) = o.admitted {
        assert!(core.received() <= size, "{} bytes of {size}", core.received());
    }
}
