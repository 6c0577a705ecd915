//! The endpoint's operations: regions registered, posted, completed
//! (waiting long or not at all), dropped; each outcome judged by the
//! model's queues, each region that comes back checked byte for byte.

use pinpoll::{
    Access, CompleteError, Endpoint, Error, MemoryRegion, PageSize, RegionOp, RegionRefused,
};
use pinpoll_testkit::pair::{RECV_SLOT, REGION};

use crate::bytes::{check_message, message, peer_message_len, static_area, Stream, HEADER, STATIC};
use crate::canary::{address, Owned, Shadow, Stamper};
use crate::gen::Verb;
use crate::rig::{Rig, ENDPOINT_WINDOW, LONG, SHORT};
use crate::spec::{Regions, Request, Seen, Where, Work};

/// Region sizes: a page's parts, a page, and two pages' odd part.
pub const SIZES: [usize; 4] = [256, 1024, 4096, 6000];
/// Regions in hand at most, per connection.
const POOL: usize = 12;
/// Requests on one queue at most (below every queue's depth).
const IN_FLIGHT: usize = 24;

/// `frac` 65535ths of the way from `min` to `max`; the top value is one
/// past `limit`: a length that does not fit.
pub fn length(frac: u16, min: usize, max: usize, limit: usize) -> usize {
    if frac == u16::MAX {
        limit + 1
    } else {
        min + (max.saturating_sub(min)) * usize::from(frac) / 65535
    }
}

/// `word` 65535ths of the way through `span`.
pub fn offset(word: u16, span: usize) -> usize {
    span * usize::from(word) / 65535
}

/// A fresh region of size class `class` on `ep`, stamped; its memory must
/// be no live region's.
pub fn registered(
    ep: &Endpoint,
    class: u8,
    regions: &mut Regions,
    stamper: &mut Stamper,
) -> Result<Owned, String> {
    let len = SIZES[usize::from(class) % SIZES.len()];
    let region = ep
        .register(len, PageSize::Base, Access::LOCAL_WRITE)
        .map_err(|e| format!("register: {e}"))?;
    let id = regions.registered(Some(address(&region)), Where::Ours)?;
    Ok(stamper.stamp(id, region))
}

impl Rig {
    pub(crate) fn register(&mut self, class: u8) -> Result<(), String> {
        if self.ep.pool.len() < POOL {
            let ep = &self.ep.side.ep;
            let owned = registered(ep, class, &mut self.regions, &mut self.stamper)?;
            self.ep.pool.push(owned);
        }
        Ok(())
    }

    pub(crate) fn free(&mut self, pick: u8) -> Result<(), String> {
        if self.ep.pool.is_empty() {
            return Ok(());
        }
        let owned = self
            .ep
            .pool
            .swap_remove(usize::from(pick) % self.ep.pool.len());
        owned.check("freed")?;
        self.regions.moved(owned.id, Where::Gone);
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, pick: u8) -> Result<(), String> {
        if self.ep.pool.is_empty() || self.ep.queues.in_flight(true) >= IN_FLIGHT {
            return Ok(());
        }
        let owned = self
            .ep
            .pool
            .swap_remove(usize::from(pick) % self.ep.pool.len());
        let (region, shadow) = owned.lend();
        let posted = self
            .ep
            .side
            .ep
            .post_recv(Some(region))
            .map_err(|e| format!("post_recv refused: {}", e.error))?;
        let work = self.ep.queues.next_receive();
        self.held(posted, shadow, work);
        Ok(())
    }

    fn held(&mut self, posted: pinpoll::Posted, shadow: Shadow, work: Work) {
        let wr_id = posted.wr_id();
        self.ep.queues.posted(Request {
            wr_id,
            region: shadow.id,
            work,
            held: true,
        });
        self.regions.moved(shadow.id, Where::Posted(wr_id));
        self.ep.held.insert(wr_id, (posted, shadow));
    }

    pub(crate) fn post(&mut self, pick: u8, verb: Verb, len: u16, at: u16) -> Result<(), String> {
        if self.ep.pool.is_empty() || self.ep.queues.in_flight(false) >= IN_FLIGHT {
            return Ok(());
        }
        let mut owned = self
            .ep
            .pool
            .swap_remove(usize::from(pick) % self.ep.pool.len());
        let size = owned.region.len();
        let (len, op, work) = match verb {
            Verb::Send => {
                let len = length(len, HEADER, size.min(RECV_SLOT), size);
                if len <= size {
                    self.peer.wait_room(true, self.ep.sent, ENDPOINT_WINDOW)?;
                    owned.write(&message(Stream::EndpointToPeer, self.ep.sent, len));
                }
                (len, RegionOp::Send, Work::Send)
            }
            Verb::Write | Verb::Read => {
                let len = length(len, 1, size.min(RECV_SLOT), size);
                // WRITEs past the peer's static area, READs inside it.
                let at = match verb {
                    Verb::Write => STATIC + offset(at, REGION - STATIC - len),
                    _ => offset(at, STATIC - len),
                };
                let remote = self
                    .ep
                    .side
                    .remote
                    .sub(at as u64, len as u64)
                    .map_err(|e| e.to_string())?;
                match verb {
                    Verb::Write => (len, RegionOp::Write { remote, imm: None }, Work::Write),
                    _ => (len, RegionOp::Read { remote }, Work::Read { at, len }),
                }
            }
        };
        let (region, shadow) = owned.lend();
        match (self.ep.side.ep.post(region, len, op), len <= size) {
            (Ok(posted), true) => {
                if work == Work::Send {
                    self.ep.sent += 1;
                }
                self.held(posted, shadow, work);
                Ok(())
            }
            (
                Err(RegionRefused {
                    error: Error::OutOfRegion { .. },
                    region,
                }),
                false,
            ) => {
                self.tally.refused_posts += 1;
                self.regions
                    .back(shadow.id, address(&region), Where::Ours)?;
                self.ep.pool.push(shadow.back(region, "refused post")?);
                Ok(())
            }
            (Ok(_), false) => Err(format!("a post of {len} bytes from a {size} B region went")),
            (Err(e), _) => Err(format!("post of {len} of {size} B refused: {}", e.error)),
        }
    }

    pub(crate) fn complete(&mut self, pick: u8, oldest: bool, long: bool) -> Result<(), String> {
        let candidates = if oldest {
            self.ep.queues.oldest_held()
        } else {
            self.ep.queues.held()
        };
        if candidates.is_empty() {
            return Ok(());
        }
        let r = candidates[usize::from(pick) % candidates.len()];
        // A long wait for nothing would only time out later.
        let long = long && self.ep.queues.meets_a_completion(r.wr_id);
        let (posted, shadow) = self
            .ep
            .held
            .remove(&r.wr_id)
            .ok_or("a held request not held")?;
        self.tally.kept_handed_over += u64::from(self.ep.queues.is_kept(r.wr_id));
        let before = self.ep.side.ep.parked_regions();
        let result = self
            .ep
            .side
            .ep
            .complete(posted, if long { LONG } else { SHORT });
        let after = self.ep.side.ep.parked_regions();
        let freed = before.checked_sub(after).ok_or(format!(
            "complete parked regions: {before} before, {after} after"
        ))?;
        let (seen, back) = match result {
            Ok(done) => (
                Seen::Completed {
                    wr_id: done.done.wr_id,
                },
                Some(done),
            ),
            Err(CompleteError::Pending { error, posted }) => {
                let seen = match error {
                    Error::Timeout { .. } => Seen::TimedOut,
                    Error::UnexpectedCompletion { got, .. } => Seen::OtherCompletion { got },
                    e => return Err(format!("complete: {e}")),
                };
                self.ep.held.insert(r.wr_id, (posted, shadow.clone()));
                (seen, None)
            }
            Err(CompleteError::Failed { error, .. }) => {
                return Err(format!("complete failed: {error}"))
            }
        };
        let (done, freed_requests) = self.ep.queues.complete(r.wr_id, long, seen, freed)?;
        self.tally.parked_freed += freed_requests.len() as u64;
        for f in &freed_requests {
            self.regions.moved(f.region, Where::Gone);
        }
        match seen {
            Seen::TimedOut => self.tally.timed_out += 1,
            Seen::OtherCompletion { .. } => self.tally.other_completion += 1,
            _ => {}
        }
        let (Some(done), Some(back)) = (done, back) else {
            return Ok(());
        };
        self.tally.completed += 1;
        self.came_back(done, back, shadow)
    }

    /// Request `r` completed: checks what it brought and takes its region
    /// back (stamped afresh).
    fn came_back(
        &mut self,
        r: Request,
        done: pinpoll::Completed,
        mut shadow: Shadow,
    ) -> Result<(), String> {
        if done.done.opcode != r.work.opcode() {
            return Err(format!(
                "{:#x} ({:?}) completed as {:?}",
                r.wr_id, r.work, done.done.opcode
            ));
        }
        let region: MemoryRegion = done.region.ok_or("a completion without its region")?;
        match r.work {
            Work::Recv { index } => {
                let len = done.done.byte_len as usize;
                if len != peer_message_len(index) || len > region.len() {
                    return Err(format!(
                        "receive {index}: {len} bytes, not the {} of message {index}",
                        peer_message_len(index)
                    ));
                }
                check_message(Stream::PeerToEndpoint, index, &region.as_slice()[..len])?;
                self.tally.messages_in += 1;
                shadow.landed(&region.as_slice()[..len]);
            }
            Work::Read { at, len } => {
                self.tally.reads += 1;
                shadow.landed(&static_area()[at..at + len]);
            }
            Work::Send | Work::Write => {}
        }
        self.regions
            .back(r.region, address(&region), Where::Posted(r.wr_id))?;
        let owned = shadow.back(region, "completed")?;
        self.ep
            .pool
            .push(self.stamper.stamp(owned.id, owned.into_region()));
        Ok(())
    }

    pub(crate) fn drop_posted(&mut self, pick: u8) -> Result<(), String> {
        let held = self.ep.queues.held();
        if held.is_empty() {
            return Ok(());
        }
        let r = held[usize::from(pick) % held.len()];
        let (posted, _) = self
            .ep
            .held
            .remove(&r.wr_id)
            .ok_or("a held request not held")?;
        drop(posted);
        self.ep
            .queues
            .dropped(r.wr_id)
            .ok_or("dropped an unknown request")?;
        self.regions.moved(r.region, Where::Parked);
        self.tally.dropped += 1;
        Ok(())
    }

    /// Ends the endpoint's connection: what completes now brings its
    /// region back (done, or flushed: checked either way); what does not
    /// is dropped and stays parked until the queue pair is destroyed.
    pub(crate) fn close_endpoint(&mut self) -> Result<(), String> {
        self.ep
            .side
            .ep
            .disconnect()
            .map_err(|e| format!("disconnect: {e}"))?;
        for r in self.ep.queues.take_all() {
            let Some((posted, mut shadow)) = self.ep.held.remove(&r.wr_id) else {
                continue;
            };
            let region = match self.ep.side.ep.complete(posted, SHORT) {
                Ok(done) => done.region,
                Err(CompleteError::Failed { region, .. }) => region,
                Err(CompleteError::Pending { posted, .. }) => {
                    drop(posted);
                    continue;
                }
            };
            let region = region.ok_or("a completion without its region")?;
            // Data may have landed before the end, whole or in part.
            if let Work::Recv { .. } | Work::Read { .. } = r.work {
                let len = region.len().min(RECV_SLOT);
                shadow.anything_in(&region, len);
            }
            self.regions
                .back(r.region, address(&region), Where::Posted(r.wr_id))?;
            self.ep
                .pool
                .push(shadow.back(region, "completed at close")?);
        }
        Ok(())
    }
}
