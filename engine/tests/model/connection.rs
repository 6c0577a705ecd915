//! The connection's operations: batches (posted or dropped) of SENDs,
//! WRITEs, READs and lent regions, single posts, polls, reclaims and
//! waits. The ledger of the model predicts each push — its sequence
//! number or its refusal — and judges every event.

use pinpoll::{Error, RegionRefused};

use crate::bytes::{message, Stream, HEADER, STATIC};
use crate::canary::address;
use crate::endpoint::{length, offset, registered};
use crate::gen::Item;
use crate::rig::{Rig, CONNECTION_WINDOW};
use crate::spec::{Event, Kind, Push, Refusal, Where};

/// Lendable regions in hand at most.
const POOL: usize = 8;

/// An item with its lengths and offsets resolved against the connection.
#[derive(Debug, Clone, Copy)]
enum Resolved {
    Send {
        len: usize,
    },
    Write {
        len: usize,
        at: usize,
    },
    Read {
        len: usize,
        at: usize,
    },
    /// Its length and offset are resolved once the region is picked.
    WriteRegion {
        pick: u8,
        len: u16,
        at: u16,
    },
}

/// What a refused push or post returned, as the model names it.
fn refusal(e: &Error) -> Option<Refusal> {
    match e {
        Error::Full { what, remedy } => Some(Refusal::Full(what, *remedy)),
        Error::BatchFull { .. } => Some(Refusal::BatchFull),
        Error::TooLarge { .. } => Some(Refusal::TooLarge),
        Error::OutOfRegion { .. } => Some(Refusal::OutOfRegion),
        _ => None,
    }
}

/// Whether what happened is what the model predicted.
fn judge(
    expected: Result<u64, Refusal>,
    got: &Result<u64, Error>,
    what: &str,
) -> Result<(), String> {
    let same = match (expected, got) {
        (Ok(s), Ok(g)) => s == *g,
        // Both range checks say OutOfRegion.
        (Err(Refusal::RegionTooShort), Err(e)) => refusal(e) == Some(Refusal::OutOfRegion),
        (Err(r), Err(e)) => refusal(e) == Some(r),
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(format!("{what}: expected {expected:?}, got {got:?}"))
    }
}

/// Where a WRITE of `len` lands in a peer's ring of `ring` bytes: past
/// its static area, or (the top `word`) just past its end.
fn write_at(word: u16, len: usize, ring: usize) -> usize {
    if word == u16::MAX {
        ring - len + 1
    } else {
        STATIC + offset(word, ring - STATIC - len)
    }
}

/// Where a READ of `len` reads: in the static area, or just past the end.
fn read_at(word: u16, len: usize, ring: usize) -> usize {
    if word == u16::MAX {
        ring - len + 1
    } else {
        offset(word, STATIC - len)
    }
}

impl Rig {
    fn resolve(&self, item: Item) -> Resolved {
        let slot = self.cs.ledger.shape.slot_size;
        let ring = self.cs.ledger.shape.ring;
        match item {
            Item::Send { len } => Resolved::Send {
                len: length(len, HEADER, slot, slot),
            },
            Item::Write { len, at } => {
                let len = length(len, 1, slot, slot);
                Resolved::Write {
                    len,
                    at: write_at(at, len, ring),
                }
            }
            Item::Read { len, at } => {
                let len = length(len, 1, slot, slot);
                Resolved::Read {
                    len,
                    at: read_at(at, len, ring),
                }
            }
            Item::WriteRegion { pick, len, at } => Resolved::WriteRegion { pick, len, at },
        }
    }

    pub(crate) fn register_lent(&mut self, class: u8) -> Result<(), String> {
        if self.cs.pool.len() < POOL {
            let ep = self.cs.conn.endpoint();
            let owned = registered(ep, class, &mut self.regions, &mut self.stamper)?;
            self.cs.pool.push(owned);
        }
        Ok(())
    }

    pub(crate) fn batch(
        &mut self,
        items: &[Option<Item>; 4],
        signal: Option<u8>,
        post: bool,
    ) -> Result<(), String> {
        let items: Vec<Resolved> = items.iter().flatten().map(|i| self.resolve(*i)).collect();
        // Bytes a WRITE sends are borrowed until the post.
        let payloads: Vec<Vec<u8>> = items
            .iter()
            .map(|i| match i {
                Resolved::Write { len, .. } => vec![0xa5; *len],
                _ => Vec::new(),
            })
            .collect();
        let peer = &self.peer;
        let Rig {
            cs, regions, tally, ..
        } = self;
        cs.ledger.begin_batch();
        let mut batch = cs.conn.batch();
        for (i, item) in items.iter().enumerate() {
            if signal == Some(i as u8) {
                batch.signal_next();
                cs.ledger.signal_next();
            }
            let (push, kind, got) = match *item {
                Resolved::Send { len } => {
                    peer.wait_room(false, cs.ledger.ours_sent, CONNECTION_WINDOW)?;
                    let k = cs.ledger.ours_sent;
                    let got = batch.send_from(len, |slot| {
                        slot.copy_from_slice(&message(Stream::ConnectionToPeer, k, len));
                        Ok(())
                    });
                    (Push::Filled { len }, Kind::Send { k }, got)
                }
                Resolved::Write { len, at } => {
                    let got = batch.write(&payloads[i], at as u64, None);
                    (
                        Push::Bytes {
                            len,
                            write_at: Some(at),
                        },
                        Kind::Write,
                        got,
                    )
                }
                Resolved::Read { len, at } => {
                    let got = batch.read(at as u64, len);
                    (Push::Read { at, len }, Kind::Read { at, len }, got)
                }
                Resolved::WriteRegion { pick, len, at } => {
                    if cs.pool.is_empty() {
                        continue;
                    }
                    let owned = cs.pool.swap_remove(usize::from(pick) % cs.pool.len());
                    let size = owned.region.len();
                    let len = length(len, 1, size, size);
                    let at = write_at(at, len, cs.ledger.shape.ring);
                    let push = Push::Region {
                        len,
                        region_len: size,
                        at,
                    };
                    let expected = cs.ledger.predict(push, true);
                    let (region, shadow) = owned.lend();
                    match batch.write_region(region, len, at as u64, None) {
                        Ok(seq) => {
                            judge(expected, &Ok(seq), "write_region")?;
                            regions.moved(shadow.id, Where::Lent(seq));
                            cs.ledger.pushed(push, Kind::WriteRegion, Some(shadow.id));
                            cs.lent.push_back(shadow);
                        }
                        Err(RegionRefused { error, region }) => {
                            let e = Err(error);
                            judge(expected, &e, "write_region")?;
                            tally.refused_pushes += 1;
                            cs.ledger.refused(expected.err().unwrap());
                            regions.back(shadow.id, address(&region), Where::Ours)?;
                            cs.pool.push(shadow.back(region, "refused loan")?);
                        }
                    }
                    continue;
                }
            };
            let expected = cs.ledger.predict(push, true);
            judge(expected, &got, &format!("{item:?}"))?;
            match expected {
                Ok(_) => {
                    cs.ledger.pushed(push, kind, None);
                }
                Err(r) => {
                    tally.refused_pushes += 1;
                    cs.ledger.refused(r);
                }
            }
        }
        if post {
            let n = batch.post().map_err(|e| format!("post: {e}"))?;
            let pushed = cs.ledger.end_batch(true)?;
            tally.batches_posted += 1;
            if n != pushed {
                return Err(format!(
                    "the batch posted {n} requests; {pushed} were pushed"
                ));
            }
        } else {
            drop(batch);
            cs.ledger.end_batch(false)?;
            tally.batches_dropped += 1;
        }
        Ok(())
    }
}

impl Rig {
    pub(crate) fn try_send(&mut self, len: u16) -> Result<(), String> {
        let slot = self.cs.ledger.shape.slot_size;
        let len = length(len, HEADER, slot, slot);
        self.peer
            .wait_room(false, self.cs.ledger.ours_sent, CONNECTION_WINDOW)?;
        let k = self.cs.ledger.ours_sent;
        let push = Push::Bytes {
            len,
            write_at: None,
        };
        let expected = self.cs.ledger.predict(push, false);
        let got = self
            .cs
            .conn
            .try_send(&message(Stream::ConnectionToPeer, k, len.max(HEADER)));
        judge(expected, &got, "try_send")?;
        self.single(push, Kind::Send { k }, expected);
        Ok(())
    }

    pub(crate) fn try_read(&mut self, len: u16, at: u16) -> Result<(), String> {
        let shape = self.cs.ledger.shape;
        let len = length(len, 1, shape.slot_size, shape.slot_size);
        let at = read_at(at, len, shape.ring);
        let push = Push::Read { at, len };
        let expected = self.cs.ledger.predict(push, false);
        let got = self.cs.conn.try_read(at as u64, len);
        judge(expected, &got, "try_read")?;
        self.single(push, Kind::Read { at, len }, expected);
        Ok(())
    }

    /// A single post went as the model predicted: account for it.
    fn single(&mut self, push: Push, kind: Kind, expected: Result<u64, Refusal>) {
        match expected {
            Ok(_) => {
                self.cs.ledger.pushed(push, kind, None);
            }
            Err(_) => self.tally.refused_pushes += 1,
        }
    }

    /// Judges events, in the order they came.
    fn events(&mut self, events: &[Event]) -> Result<(), String> {
        for ev in events {
            if let Event::ReadCompleted { .. } = ev {
                self.tally.reads += 1;
            }
            if let Event::Received(_) = ev {
                self.tally.messages_in += 1;
            }
            self.cs.ledger.event(ev)?;
        }
        Ok(())
    }

    pub(crate) fn poll(&mut self) -> Result<(), String> {
        let mut events = Vec::new();
        self.cs
            .conn
            .poll(|ev| events.push(Event::of(&ev)))
            .map_err(|e| format!("poll: {e}"))?;
        self.events(&events)
    }

    pub(crate) fn wait_idle(&mut self) -> Result<(), String> {
        let marker_allowed = self.cs.ledger.marker_allowed();
        let mut events = Vec::new();
        self.cs
            .conn
            .wait_idle(|ev| events.push(Event::of(&ev)))
            .map_err(|e| format!("wait_idle: {e}"))?;
        self.events(&events)?;
        self.cs
            .ledger
            .idle(self.cs.conn.stats().posted, marker_allowed)
    }

    pub(crate) fn reclaim(&mut self) -> Result<(), String> {
        let expected = self.cs.ledger.reclaimable();
        match (expected, self.cs.conn.reclaim()) {
            (None, None) => Ok(()),
            (Some((seq, id)), Some(region)) => {
                let shadow = self.cs.lent.pop_front().ok_or("a loan the rig lost")?;
                if shadow.id != id {
                    return Err(format!(
                        "the model lent region {id} first; the rig {}",
                        shadow.id
                    ));
                }
                self.cs.ledger.reclaimed();
                self.regions.back(id, address(&region), Where::Lent(seq))?;
                // The NIC only read it: every byte as it was lent.
                let owned = shadow.back(region, "reclaimed")?;
                self.cs
                    .pool
                    .push(self.stamper.stamp(owned.id, owned.into_region()));
                self.tally.reclaimed += 1;
                Ok(())
            }
            (expected, got) => Err(format!(
                "reclaim gave {}; the model expected {expected:?} (lent: {:?})",
                if got.is_some() { "a region" } else { "none" },
                self.cs.ledger.still_lent().collect::<Vec<_>>()
            )),
        }
    }
}
