//! A transfer's events as the bytes of a script: the input of the
//! `filexfer_server` fuzz target, and what a debug build of the server
//! records of each transfer under `$PINPOLL_RECORD_WIRE/filexfer_server/`
//! (`scripts/record-corpus.sh`), so that its seeds are real sequences.
//!
//! A script is a server configuration (three bytes), then ops, each a tag
//! byte and its fields (big-endian). Every byte string is a script: what
//! runs out ends it.
//!
//! | tag % 10 | op | fields |
//! |---|---|---|
//! | 0 | a SEND on a stream | stream, length (u16), the bytes |
//! | 1 | a chunk | stream, slot, k: k < 128 the length the next chunk of that stream has, else a u32 length |
//! | 2 | a chunk handed to the verifier | stream, s: s < 128 the slot of that stream's last chunk, else slot s - 128 |
//! | 3 | the file admitted | token |
//! | 4 | every stream joined | |
//! | 5 | time passes | seconds |
//! | 6 | the verifier's digest | d: < 128 the digest `Finish` declared, < 254 32 bytes of d, else a failure |
//! | 7 | the store's end | even: stored, odd: failed |
//! | 8 | the server's own work failed | |
//! | 9 | a stream's connection gone | |

use std::time::{Duration, Instant};

use super::protocol::{FailCode, Msg};
use super::server_core::{Config, Event, Failure};
use super::SLOT_SIZE;

/// The longest script recorded: what `scripts/fuzz.sh` gives an input.
pub const MAX_RECORDED: usize = 8192;

/// One step of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Message {
        stream: u16,
        bytes: Vec<u8>,
    },
    /// `len: None`: the length the stream's next chunk has.
    Chunk {
        stream: u16,
        slot: u32,
        len: Option<u32>,
    },
    /// `slot: None`: the slot of the stream's last chunk.
    HandedOff {
        stream: u16,
        slot: Option<u32>,
    },
    Admitted {
        token: u64,
    },
    Joined,
    Advance(Duration),
    /// `Ok(None)`: the digest `Finish` declared.
    Digest(Result<Option<[u8; 32]>, Failure>),
    Stored(Result<(), Failure>),
    Failed(Failure),
    Gone,
}

/// The ops of a script's bytes.
pub struct Script<'a> {
    bytes: &'a [u8],
}

impl<'a> Script<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Script { bytes }
    }

    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.bytes.split_first()?;
        self.bytes = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        (self.bytes.len() >= n).then(|| {
            let (taken, rest) = self.bytes.split_at(n);
            self.bytes = rest;
            taken
        })
    }

    /// The server's configuration, from the first three bytes: 1 to 16
    /// slots, `--min-rate` in steps of 64 KiB/s, `--deadline` in seconds
    /// (0: none).
    pub fn config(&mut self) -> Config {
        let (slots, rate, deadline) = (
            self.byte().unwrap_or(15),
            self.byte().unwrap_or(0),
            self.byte().unwrap_or(0),
        );
        Config {
            slots: 1 + u32::from(slots % 16),
            slot_size: SLOT_SIZE,
            min_rate: u64::from(rate) << 16,
            deadline: Duration::from_secs(u64::from(deadline)),
        }
    }

    /// The next op, `None` once the script runs out.
    pub fn next_op(&mut self) -> Option<Op> {
        let failure = |what: &str| Failure::new(FailCode::Io, what);
        Some(match self.byte()? % 10 {
            0 => {
                let stream = u16::from(self.byte()?);
                let len = u16::from_be_bytes(self.take(2)?.try_into().ok()?);
                let bytes = self.take(usize::from(len))?.to_vec();
                Op::Message { stream, bytes }
            }
            1 => {
                let (stream, slot) = (u16::from(self.byte()?), u32::from(self.byte()?));
                let len = match self.byte()? {
                    0..128 => None,
                    _ => Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?)),
                };
                Op::Chunk { stream, slot, len }
            }
            2 => {
                let stream = u16::from(self.byte()?);
                let slot = match self.byte()? {
                    0..128 => None,
                    s => Some(u32::from(s - 128)),
                };
                Op::HandedOff { stream, slot }
            }
            3 => Op::Admitted {
                token: u64::from(self.byte()?),
            },
            4 => Op::Joined,
            5 => Op::Advance(Duration::from_secs(u64::from(self.byte()?))),
            6 => Op::Digest(match self.byte()? {
                0..128 => Ok(None),
                d @ 128..254 => Ok(Some([d; 32])),
                _ => Err(Failure::new(FailCode::Integrity, "a chunk did not match")),
            }),
            7 => Op::Stored(match self.byte()? % 2 {
                0 => Ok(()),
                _ => Err(failure("the store failed")),
            }),
            8 => Op::Failed(failure("the server's own work failed")),
            _ => Op::Gone,
        })
    }
}

/// The script of a transfer's events as the server feeds them, bounded by
/// [`MAX_RECORDED`] (a longer transfer's script is its first part: once
/// an op does not fit, nothing more is recorded). A script only has room
/// for so much, so what does not fit its byte is clamped: 1 to 16 slots,
/// `--min-rate` in whole 64 KiB/s under 16 MiB/s, `--deadline` up to
/// 255 s, stream and slot numbers up to 255 (a slot a client named past
/// that is still past every ring, so it replays as refused too). Time is
/// kept in whole seconds and failures as fixed codes, so a decision near
/// a second's edge (`--min-rate`, `--deadline`) can replay differently:
/// seeds need the path, not the exact verdict.
#[derive(Debug)]
pub struct Recorder {
    bytes: Vec<u8>,
    /// An op did not fit: the script ends where it stopped.
    full: bool,
    /// When the last event recorded happened, to record time passing.
    last: Option<Instant>,
    /// The digest of the last `Finish`, which the verifier's is checked
    /// against.
    finish: Option<[u8; 32]>,
}

impl Recorder {
    pub fn new(cfg: &Config) -> Self {
        let byte = |n: u64| n.min(255) as u8;
        Recorder {
            bytes: vec![
                byte(u64::from(cfg.slots.clamp(1, 16) - 1)),
                byte(cfg.min_rate >> 16),
                byte(cfg.deadline.as_secs()),
            ],
            full: false,
            last: None,
            finish: None,
        }
    }

    /// The script so far.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Appends `event`. An undecodable message is recorded as an empty
    /// one: its bytes are gone by then.
    pub fn record(&mut self, event: &Event) {
        // A stream or slot past a byte stays past every ring: never
        // wrapped to one that replays as accepted.
        let byte = |n: u32| n.min(255) as u8;
        let mut op = Vec::new();
        match event {
            Event::Message { stream, msg } => {
                if let Msg::Finish { digest, .. } = msg {
                    self.finish = Some(*digest);
                }
                let bytes = msg.encode();
                op.extend([0, byte(u32::from(*stream))]);
                op.extend((bytes.len() as u16).to_be_bytes());
                op.extend(bytes);
            }
            // Its bytes are gone by now: an empty SEND, which no more
            // decodes on replay than they did.
            Event::Undecodable { stream, .. } => op.extend([0, byte(u32::from(*stream)), 0, 0]),
            Event::Chunk {
                stream,
                slot,
                len,
                now,
            } => {
                self.advance(*now);
                op.extend([1, byte(u32::from(*stream)), byte(*slot), 128]);
                op.extend(len.to_be_bytes());
            }
            Event::HandedOff { stream, slot } => {
                op.extend([2, byte(u32::from(*stream)), 128 + (*slot).min(127) as u8]);
            }
            Event::Admitted { token } => op.extend([3, *token as u8]),
            Event::Joined { now } => {
                self.last = Some(*now);
                op.push(4);
            }
            Event::Digest(Ok(d)) if Some(*d) == self.finish => op.extend([6, 0]),
            Event::Digest(Ok(_)) => op.extend([6, 128]),
            Event::Digest(Err(_)) => op.extend([6, 255]),
            Event::Stored(s) => op.extend([7, u8::from(s.is_err())]),
            Event::Failed(_) => op.push(8),
            Event::Gone => op.push(9),
        }
        self.append(&op);
    }

    /// Appends `op` if it fits; once one does not, nothing more.
    fn append(&mut self, op: &[u8]) {
        self.full = self.full || self.bytes.len() + op.len() > MAX_RECORDED;
        if !self.full {
            self.bytes.extend_from_slice(op);
        }
    }

    /// Records the whole seconds passed since the last event timed.
    fn advance(&mut self, now: Instant) {
        let Some(last) = self.last else {
            return;
        };
        let secs = now.saturating_duration_since(last).as_secs().min(255);
        if secs > 0 {
            self.append(&[5, secs as u8]);
            self.last = Some(last + Duration::from_secs(secs));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filexfer::server_core::{Action, ServerCore};
    use crate::filexfer::{CHUNK, TRAILER};

    /// What the server records of a transfer reads back as the same
    /// steps, and driving a fresh machine with them ends as it did.
    #[test]
    fn a_recorded_transfer_replays_to_the_same_end() {
        let cfg = Config {
            slots: 16,
            slot_size: SLOT_SIZE,
            min_rate: 3 << 16,
            deadline: Duration::from_secs(60),
        };
        let t0 = Instant::now();
        let size = CHUNK + 5;
        let start = Msg::Start {
            size,
            streams: 1,
            name: b"f.bin".to_vec(),
        };
        let finish = Msg::Finish {
            size,
            digest: [3; 32],
        };
        let len = |bytes: u64| bytes as u32 + TRAILER as u32;
        let events = [
            Event::Message {
                stream: 0,
                msg: start.clone(),
            },
            Event::Admitted { token: 4 },
            Event::Joined { now: t0 },
            Event::Chunk {
                stream: 0,
                slot: 0,
                len: len(CHUNK),
                now: t0 + Duration::from_millis(2500),
            },
            Event::HandedOff { stream: 0, slot: 0 },
            Event::Chunk {
                stream: 0,
                slot: 1,
                len: len(5),
                now: t0 + Duration::from_millis(2600),
            },
            Event::HandedOff { stream: 0, slot: 1 },
            Event::Message {
                stream: 0,
                msg: finish.clone(),
            },
            Event::Digest(Ok([3; 32])),
            Event::Stored(Ok(())),
        ];
        let mut core = ServerCore::recording(cfg);
        for e in events {
            core.handle(e);
        }
        let ended = core.outcome().cloned();
        assert!(
            matches!(
                ended,
                Some(crate::filexfer::server_core::Outcome::Complete { .. })
            ),
            "{ended:?}"
        );
        let script = core.script().expect("recording").to_vec();
        let mut read = Script::new(&script);
        let replayed_cfg = read.config();
        assert_eq!(
            (
                replayed_cfg.slots,
                replayed_cfg.min_rate,
                replayed_cfg.deadline
            ),
            (16, 3 << 16, Duration::from_secs(60))
        );
        let ops: Vec<Op> = std::iter::from_fn(|| read.next_op()).collect();
        assert_eq!(
            ops,
            [
                Op::Message {
                    stream: 0,
                    bytes: start.encode()
                },
                Op::Admitted { token: 4 },
                Op::Joined,
                Op::Advance(Duration::from_secs(2)),
                Op::Chunk {
                    stream: 0,
                    slot: 0,
                    len: Some(len(CHUNK))
                },
                Op::HandedOff {
                    stream: 0,
                    slot: Some(0)
                },
                Op::Chunk {
                    stream: 0,
                    slot: 1,
                    len: Some(len(5))
                },
                Op::HandedOff {
                    stream: 0,
                    slot: Some(1)
                },
                Op::Message {
                    stream: 0,
                    bytes: finish.encode()
                },
                Op::Digest(Ok(None)),
                Op::Stored(Ok(())),
            ]
        );
        // Nothing is recorded after the end.
        assert_eq!(core.handle(Event::Gone), Vec::<Action>::new());
        assert_eq!(core.script().unwrap(), &script[..]);
    }

    /// Every byte string is a script, each op taking what it says; an op
    /// cut short (here a message without its stream) ends it.
    #[test]
    fn any_bytes_read_as_ops_until_they_run_out() {
        let mut read = Script::new(&[0, 0, 0, 1, 2, 3, 0, 11, 2, 200, 13, 5, 15, 16, 0, 0]);
        read.config();
        let ops: Vec<Op> = std::iter::from_fn(|| read.next_op()).collect();
        assert_eq!(
            ops,
            [
                Op::Chunk {
                    stream: 2,
                    slot: 3,
                    len: None
                },
                Op::Chunk {
                    stream: 2,
                    slot: 200,
                    len: None
                },
                Op::Advance(Duration::from_secs(15)),
                Op::Digest(Ok(None)),
            ]
        );
    }

    fn recorder() -> Recorder {
        Recorder::new(&Config {
            slots: 16,
            slot_size: SLOT_SIZE,
            min_rate: 0,
            deadline: Duration::ZERO,
        })
    }

    /// A slot a client named past a byte is recorded past every ring
    /// (255), never wrapped to one that replays as an accepted chunk.
    #[test]
    fn a_slot_past_a_byte_replays_as_past_every_ring() {
        let mut rec = recorder();
        rec.record(&Event::Chunk {
            stream: 300,
            slot: 256,
            len: 9,
            now: Instant::now(),
        });
        let mut read = Script::new(rec.bytes());
        read.config();
        assert_eq!(
            read.next_op(),
            Some(Op::Chunk {
                stream: 255,
                slot: 255,
                len: Some(9)
            })
        );
    }

    /// Once an op does not fit, nothing more is recorded: the script is
    /// the transfer's first part, not a part with later steps of chunks
    /// it never recorded.
    #[test]
    fn a_full_script_records_nothing_after_the_op_that_did_not_fit() {
        let mut rec = recorder();
        let chunk = |slot| Event::Chunk {
            stream: 0,
            slot,
            len: 9,
            now: Instant::now(),
        };
        while rec.bytes().len() + 8 <= MAX_RECORDED {
            rec.record(&chunk(0));
        }
        let full = rec.bytes().to_vec();
        assert!(full.len() + 3 <= MAX_RECORDED, "room left for a hand-off");
        rec.record(&chunk(1));
        rec.record(&Event::HandedOff { stream: 0, slot: 1 });
        rec.record(&Event::Gone);
        // Lengths, not 8 KiB of bytes, in a failure's message.
        assert_eq!(rec.bytes().len(), full.len(), "ops appended once full");
        assert!(rec.bytes() == &full[..]);
    }

    /// An undecodable message is recorded as an empty SEND, which replays
    /// as undecodable too (it was left out, and the transfer it failed
    /// replayed as one still open).
    #[test]
    fn an_undecodable_message_replays_as_undecodable() {
        let mut rec = recorder();
        rec.record(&Event::Undecodable {
            stream: 2,
            why: "wrong magic".into(),
        });
        let mut read = Script::new(rec.bytes());
        read.config();
        let Some(Op::Message { stream: 2, bytes }) = read.next_op() else {
            panic!("no message recorded: {:?}", rec.bytes());
        };
        assert!(Msg::decode(&bytes).is_err(), "{bytes:?}");
    }
}
