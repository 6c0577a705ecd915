//! The reference model: what the public API must do, as plain data and
//! rules, with no device. The runner asks it what to expect before each
//! call and tells it what happened after; a difference is a failure.
//!
//! - [`Regions`]: where every region is (this side's, posted, lent,
//!   parked, gone); each comes back at most once, only from where it
//!   went, and no live region's memory is handed out again.
//! - [`Queues`]: an endpoint's two queues, the requests on each in
//!   posting order: which completion `complete` must meet next, which
//!   the endpoint keeps for a request waited for later, and which only
//!   free a dropped request's region.
//! - [`Ledger`]: a connection's send queue as its documentation states
//!   it: sequence numbers, room, the rings' slots, the batch, the lent
//!   regions, and which event may retire what.

use std::collections::{HashMap, VecDeque};

use pinpoll::{Remedy, WcOpcode};

/// Where a region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// Safe code holds it (stamped, checked).
    Ours,
    /// A request holds it (its wr_id).
    Posted(u64),
    /// A connection holds it until request `seq` retires.
    Lent(u64),
    /// A dropped request's region, kept by the queue pair.
    Parked,
    /// Freed.
    Gone,
}

#[derive(Debug, Default)]
pub struct Regions {
    /// Each region's address (once known) and whereabouts.
    all: HashMap<u32, (Option<usize>, Where)>,
    next: u32,
}

impl Regions {
    /// A region made by registering: its id. Its memory must not be any
    /// live region's.
    pub fn registered(&mut self, addr: Option<usize>, at: Where) -> Result<u32, String> {
        if let Some(addr) = addr {
            self.not_live(addr)?;
        }
        let id = self.next;
        self.next += 1;
        self.all.insert(id, (addr, at));
        Ok(id)
    }

    fn not_live(&self, addr: usize) -> Result<(), String> {
        match self
            .all
            .iter()
            .find(|(_, (a, w))| *a == Some(addr) && *w != Where::Gone)
        {
            Some((id, (_, w))) => Err(format!(
                "a new registration got the memory of region {id}, which is {w:?}: it was freed while a request may still reach it"
            )),
            None => Ok(()),
        }
    }

    /// Region `id` comes back to safe code at `addr`, from `from`.
    pub fn back(&mut self, id: u32, addr: usize, from: Where) -> Result<(), String> {
        let (known, at) = self.all.get(&id).copied().ok_or("no such region")?;
        if at != from {
            return Err(format!(
                "region {id} came back from {from:?}, but it is {at:?} (a region comes back exactly once)"
            ));
        }
        match known {
            Some(known) if known != addr => {
                return Err(format!(
                    "region {id} came back at {addr:#x}, not at its own {known:#x}: another request's memory"
                ))
            }
            Some(_) => {}
            None => {
                self.all.insert(id, (None, Where::Gone));
                self.not_live(addr)?;
            }
        }
        self.all.insert(id, (Some(addr), Where::Ours));
        Ok(())
    }

    pub fn moved(&mut self, id: u32, to: Where) {
        if let Some(entry) = self.all.get_mut(&id) {
            entry.1 = to;
        }
    }

    /// Every region is gone: the connection closed, its queue pair was
    /// destroyed (what it kept is freed) and safe code let go of the rest.
    pub fn all_gone(&mut self) {
        for (_, at) in self.all.values_mut() {
            *at = Where::Gone;
        }
    }
}

// ---------------------------------------------------------------------
// The endpoint

/// What a posted request does, so what its completion must bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Send,
    Write,
    Read {
        at: usize,
        len: usize,
    },
    /// The `index`th receive posted on this connection: the peer's
    /// message `index` lands in it.
    Recv {
        index: u64,
    },
}

impl Work {
    pub fn opcode(self) -> WcOpcode {
        match self {
            Work::Send => WcOpcode::SEND,
            Work::Write => WcOpcode::RDMA_WRITE,
            Work::Read { .. } => WcOpcode::RDMA_READ,
            Work::Recv { .. } => WcOpcode::RECV,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub wr_id: u64,
    pub region: u32,
    pub work: Work,
    /// Safe code holds its `Posted` (false: dropped, its region parked).
    pub held: bool,
}

/// What one `complete` call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Completed { wr_id: u64 },
    TimedOut,
    OtherCompletion { got: u64 },
}

/// One queue of an endpoint.
#[derive(Debug, Default)]
struct Queue {
    /// Posted, completion not yet polled, oldest first.
    unpolled: VecDeque<Request>,
    /// Completion polled while waiting for another request, kept for it.
    kept: Vec<Request>,
}

/// An endpoint's two queues.
#[derive(Debug, Default)]
pub struct Queues {
    send: Queue,
    recv: Queue,
    /// Receives posted on this connection.
    receives: u64,
    /// Messages the peer was told to send (message i lands in receive i).
    sent_by_peer: u64,
}

impl Queues {
    fn queue(&mut self, receive: bool) -> &mut Queue {
        if receive {
            &mut self.recv
        } else {
            &mut self.send
        }
    }

    /// The work a receive posted now will do.
    pub fn next_receive(&mut self) -> Work {
        self.receives += 1;
        Work::Recv {
            index: self.receives - 1,
        }
    }

    pub fn posted(&mut self, request: Request) {
        let receive = matches!(request.work, Work::Recv { .. });
        self.queue(receive).unpolled.push_back(request);
    }

    /// Held requests, oldest first per queue, sends before receives.
    pub fn held(&self) -> Vec<Request> {
        let all = [&self.send, &self.recv];
        all.iter()
            .flat_map(|q| q.kept.iter().chain(&q.unpolled))
            .filter(|r| r.held)
            .copied()
            .collect()
    }

    /// The oldest held request of each queue.
    pub fn oldest_held(&self) -> Vec<Request> {
        [&self.send, &self.recv]
            .iter()
            .filter_map(|q| q.kept.iter().chain(&q.unpolled).find(|r| r.held))
            .copied()
            .collect()
    }

    /// Requests whose completion has not been polled (the queue depth in use).
    pub fn in_flight(&self, receive: bool) -> usize {
        let q = if receive { &self.recv } else { &self.send };
        q.unpolled.len()
    }

    /// Receives the peer may still send into.
    pub fn unclaimed_receives(&self) -> u64 {
        self.receives - self.sent_by_peer
    }

    pub fn peer_sends(&mut self, n: u64) {
        self.sent_by_peer += n;
    }

    /// Whether `r`'s completion is coming (a receive needs its message).
    fn coming(&self, r: &Request) -> bool {
        match r.work {
            Work::Recv { index } => index < self.sent_by_peer,
            _ => true,
        }
    }

    /// Whether `wr_id`'s completion was polled for another request and
    /// kept for it.
    pub fn is_kept(&self, wr_id: u64) -> bool {
        [&self.send, &self.recv]
            .iter()
            .any(|q| q.kept.iter().any(|r| r.wr_id == wr_id))
    }

    /// Whether a `complete(wr_id)` that waits long enough meets a
    /// completion (its own or another held request's); if not, waiting
    /// long would only time out later.
    pub fn meets_a_completion(&self, wr_id: u64) -> bool {
        if self.is_kept(wr_id) {
            return true;
        }
        let q = if self.recv.unpolled.iter().any(|r| r.wr_id == wr_id) {
            &self.recv
        } else {
            &self.send
        };
        q.unpolled
            .iter()
            .find(|r| r.held || !self.coming(r))
            .is_some_and(|r| self.coming(r))
    }

    /// Regions the queue pair keeps for dropped requests.
    pub fn parked(&self) -> usize {
        [&self.send, &self.recv]
            .iter()
            .flat_map(|q| q.kept.iter().chain(&q.unpolled))
            .filter(|r| !r.held)
            .count()
    }

    /// `wr_id`'s `Posted` was dropped: its region is parked.
    pub fn dropped(&mut self, wr_id: u64) -> Option<Request> {
        for q in [&mut self.send, &mut self.recv] {
            if let Some(r) = q
                .kept
                .iter_mut()
                .chain(q.unpolled.iter_mut())
                .find(|r| r.wr_id == wr_id)
            {
                r.held = false;
                return Some(*r);
            }
        }
        None
    }

    /// Judges one `complete(wr_id)` that saw `seen` and freed `freed`
    /// parked regions on the way (`long`: it waited long enough for
    /// whatever is coming). Returns the request when its region is back,
    /// and the dropped requests whose regions were freed.
    pub fn complete(
        &mut self,
        wr_id: u64,
        long: bool,
        seen: Seen,
        freed: usize,
    ) -> Result<(Option<Request>, Vec<Request>), String> {
        // First the completions kept for requests dropped since: their
        // regions are freed, on both queues.
        let mut released = Vec::new();
        for q in [&mut self.send, &mut self.recv] {
            released.extend(q.kept.iter().filter(|r| !r.held).copied());
            q.kept.retain(|r| r.held);
        }
        let freed = freed.checked_sub(released.len()).ok_or(format!(
            "complete({wr_id:#x}) freed {freed} parked regions; {} dropped requests' completions were kept, and are freed first",
            released.len()
        ))?;
        let (request, mut polled) = self.complete_polling(wr_id, long, seen, freed)?;
        released.append(&mut polled);
        Ok((request, released))
    }

    /// [`complete`](Queues::complete) once the kept completions of dropped
    /// requests are gone: from the kept ones, else polling its queue.
    fn complete_polling(
        &mut self,
        wr_id: u64,
        long: bool,
        seen: Seen,
        freed: usize,
    ) -> Result<(Option<Request>, Vec<Request>), String> {
        let receive = self
            .recv
            .kept
            .iter()
            .chain(&self.recv.unpolled)
            .any(|r| r.wr_id == wr_id);
        let q = if receive { &self.recv } else { &self.send };
        if let Some(at) = q.kept.iter().position(|r| r.wr_id == wr_id) {
            // Kept for it: handed over at once, nothing polled.
            if seen != (Seen::Completed { wr_id }) || freed != 0 {
                return Err(format!("complete({wr_id:#x}): its completion was kept for it, yet the call saw {seen:?} and freed {freed} parked regions"));
            }
            let r = self.queue(receive).kept.swap_remove(at);
            return Ok((Some(r), Vec::new()));
        }
        let dropped_ahead = q.unpolled.iter().take_while(|r| !r.held).count();
        let coming_ahead = q
            .unpolled
            .iter()
            .take_while(|r| !r.held && self.coming(r))
            .count();
        if freed > coming_ahead {
            return Err(format!("complete({wr_id:#x}) freed {freed} parked regions; only {coming_ahead} dropped requests ahead of it can have completed"));
        }
        let next = q.unpolled.get(freed).copied();
        let next_coming = next.is_some_and(|r| self.coming(&r));
        if seen != Seen::TimedOut && freed != dropped_ahead {
            return Err(format!("complete({wr_id:#x}) saw {seen:?} after freeing {freed} of the {dropped_ahead} dropped requests ahead of it"));
        }
        let freed_requests: Vec<Request> = self.queue(receive).unpolled.drain(..freed).collect();
        match seen {
            Seen::TimedOut if long && next_coming => Err(format!(
                "complete({wr_id:#x}) timed out on a long wait, though the completion of {:#x} was coming",
                next.unwrap().wr_id
            )),
            Seen::TimedOut => Ok((None, freed_requests)),
            Seen::Completed { wr_id: got } if got == wr_id && next.is_some_and(|r| r.wr_id == wr_id) && next_coming => {
                let r = self.queue(receive).unpolled.pop_front();
                Ok((r, freed_requests))
            }
            Seen::OtherCompletion { got } if next.is_some_and(|r| r.wr_id == got && r.held && got != wr_id) && next_coming => {
                let r = self.queue(receive).unpolled.pop_front().unwrap();
                self.queue(receive).kept.push(r);
                Ok((None, freed_requests))
            }
            _ => Err(format!(
                "complete({wr_id:#x}) saw {seen:?}; the next completion on its queue is {}",
                match next {
                    Some(r) if next_coming => format!("{:#x} ({:?}, {})", r.wr_id, r.work, if r.held { "held" } else { "dropped" }),
                    Some(r) => format!("none yet ({:#x}, {:?}, waits for the peer)", r.wr_id, r.work),
                    None => "none".into(),
                }
            )),
        }
    }

    /// Everything held, for the end of the connection.
    pub fn take_all(&mut self) -> Vec<Request> {
        let mut out = Vec::new();
        for q in [&mut self.send, &mut self.recv] {
            out.append(&mut q.kept);
            out.extend(q.unpolled.drain(..));
        }
        out
    }
}

// ---------------------------------------------------------------------
// The connection

/// A connection's send-queue request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Our message `k` to the peer.
    Send {
        k: u64,
    },
    Write,
    /// A write from a lent region.
    WriteRegion,
    Read {
        at: usize,
        len: usize,
    },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    seq: u64,
    kind: Kind,
    /// Asked for with `signal_next`: its completion must be reported.
    forced: bool,
    send_slot: bool,
    read_slot: bool,
}

/// Why a push or a single post is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `Error::Full` naming this, and what makes room.
    Full(&'static str, Remedy),
    /// `Error::BatchFull`: the batch carries all it can.
    BatchFull,
    TooLarge,
    /// Outside the peer's ring (`Error::OutOfRegion`, checked first).
    OutOfRegion,
    /// Longer than the lent region (`Error::OutOfRegion` too).
    RegionTooShort,
}

/// What a request to be pushed needs.
#[derive(Debug, Clone, Copy)]
pub enum Push {
    /// SEND (`write_at: None`) or WRITE of bytes: inline or through a slot.
    Bytes {
        len: usize,
        write_at: Option<usize>,
    },
    /// A SEND whose bytes a closure writes into a send-ring slot.
    Filled {
        len: usize,
    },
    Read {
        at: usize,
        len: usize,
    },
    Region {
        len: usize,
        region_len: usize,
        at: usize,
    },
}

/// The shape of a connection (its `EngineConfig`).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub depth: u64,
    pub batch: usize,
    pub slot_size: usize,
    pub slot_count: u64,
    pub inline: usize,
    pub ring: usize,
}

/// A connection's send queue, lent regions and receives.
#[derive(Debug)]
pub struct Ledger {
    pub shape: Shape,
    posted: u64,
    retired: u64,
    /// Outstanding requests: seq in `retired..posted`.
    entries: VecDeque<Entry>,
    /// Lent regions, oldest first: (request seq, region id).
    lent: VecDeque<(u64, u32)>,
    /// Our messages sent, and the peer's received and allowed.
    pub ours_sent: u64,
    received: u64,
    allowed: u64,
    /// The batch being built: its first seq and length.
    batch: Option<(u64, usize)>,
    force_next: bool,
}

impl Ledger {
    pub fn new(shape: Shape) -> Ledger {
        Ledger {
            shape,
            posted: 0,
            retired: 0,
            entries: VecDeque::new(),
            lent: VecDeque::new(),
            ours_sent: 0,
            received: 0,
            allowed: 0,
            batch: None,
            force_next: false,
        }
    }

    pub fn posted(&self) -> u64 {
        self.posted
    }

    pub fn outstanding(&self) -> u64 {
        self.posted - self.retired
    }

    pub fn lent(&self) -> usize {
        self.lent.len()
    }

    /// Lending capacity: every outstanding request, and as many again.
    fn lent_capacity(&self) -> usize {
        2 * self.shape.depth as usize
    }

    fn slots(&self, f: impl Fn(&Entry) -> bool) -> u64 {
        self.entries.iter().filter(|e| f(e)).count() as u64
    }

    /// What pushing (in a batch, or alone) must do: the seq it gets.
    pub fn predict(&self, push: Push, in_batch: bool) -> Result<u64, Refusal> {
        let s = self.shape;
        let range_ok = |at: usize, len: usize| at.checked_add(len).is_some_and(|end| end <= s.ring);
        match push {
            Push::Bytes {
                len,
                write_at: Some(at),
            }
            | Push::Region { len, at, .. }
                if !range_ok(at, len) =>
            {
                return Err(Refusal::OutOfRegion)
            }
            Push::Read { at, len } if !range_ok(at, len) => return Err(Refusal::OutOfRegion),
            Push::Region {
                len, region_len, ..
            } if len > region_len => return Err(Refusal::RegionTooShort),
            _ => {}
        }
        if in_batch && self.batch.is_some_and(|(_, n)| n == s.batch) {
            return Err(Refusal::BatchFull);
        }
        // Inside a batch nothing retires before it is posted.
        let remedy = if in_batch {
            Remedy::PostBatch
        } else {
            Remedy::Poll
        };
        if self.outstanding() >= s.depth {
            return Err(Refusal::Full("the send queue", remedy));
        }
        match push {
            Push::Bytes { len, .. } if len <= s.inline => {}
            Push::Bytes { len, .. } | Push::Filled { len } | Push::Read { len, .. }
                if len > s.slot_size =>
            {
                return Err(Refusal::TooLarge)
            }
            Push::Bytes { .. } | Push::Filled { .. }
                if self.slots(|e| e.send_slot) == s.slot_count =>
            {
                return Err(Refusal::Full("the send ring", remedy))
            }
            Push::Read { .. } if self.slots(|e| e.read_slot) == s.slot_count => {
                return Err(Refusal::Full("the read ring", remedy))
            }
            Push::Region { .. } if self.lent.len() == self.lent_capacity() => {
                return Err(Refusal::Full("the lent regions", Remedy::Reclaim))
            }
            _ => {}
        }
        Ok(self.posted)
    }

    pub fn begin_batch(&mut self) {
        self.batch = Some((self.posted, 0));
        self.force_next = false;
    }

    pub fn signal_next(&mut self) {
        self.force_next = true;
    }

    /// The push was refused; `signal_next` is used up unless the check
    /// of the peer's range, which comes first, refused it.
    pub fn refused(&mut self, refusal: Refusal) {
        if refusal != Refusal::OutOfRegion {
            self.force_next = false;
        }
    }

    /// `push` went in as `kind` (lending region `lent`, if any).
    pub fn pushed(&mut self, push: Push, kind: Kind, lent: Option<u32>) -> u64 {
        let seq = self.posted;
        let inline = matches!(push, Push::Bytes { len, .. } if len <= self.shape.inline);
        self.entries.push_back(Entry {
            seq,
            kind,
            forced: std::mem::take(&mut self.force_next) || matches!(kind, Kind::Read { .. }),
            send_slot: matches!(push, Push::Bytes { .. } | Push::Filled { .. }) && !inline,
            read_slot: matches!(push, Push::Read { .. }),
        });
        if let Some(id) = lent {
            self.lent.push_back((seq, id));
        }
        if let Kind::Send { .. } = kind {
            self.ours_sent += 1;
        }
        if let Some((_, n)) = &mut self.batch {
            *n += 1;
        }
        self.posted += 1;
        seq
    }

    /// The batch was posted (`true`) or dropped: dropped, its requests
    /// never went and their sequence numbers are taken again.
    pub fn end_batch(&mut self, posted: bool) -> Result<usize, String> {
        let (first, n) = self.batch.take().ok_or("no batch")?;
        self.force_next = false;
        if !posted {
            for e in self.entries.iter().filter(|e| e.seq >= first) {
                if let Kind::Send { .. } = e.kind {
                    self.ours_sent -= 1;
                }
            }
            self.entries.retain(|e| e.seq < first);
            self.posted = first;
        }
        Ok(n)
    }

    /// Whether `reclaim` must give a region back now, and which: the
    /// oldest lent, once its sequence number retired or is not posted (a
    /// dropped batch's; its number may be taken again by a later request,
    /// and then it waits for that one).
    pub fn reclaimable(&self) -> Option<(u64, u32)> {
        let (seq, id) = *self.lent.front()?;
        (seq < self.retired || seq >= self.posted).then_some((seq, id))
    }

    /// The regions still lent, oldest first: (request seq, region id).
    pub fn still_lent(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.lent.iter().copied()
    }

    pub fn reclaimed(&mut self) {
        self.lent.pop_front();
    }

    /// The peer may send `n` more messages, up to `window` unread.
    pub fn allow(&mut self, n: u64, window: u64) -> u64 {
        let room = window.saturating_sub(self.allowed - self.received);
        let n = n.min(room);
        self.allowed += n;
        n
    }

    /// Judges one event.
    pub fn event(&mut self, ev: &Event) -> Result<(), String> {
        match ev {
            Event::Received(data) => {
                if self.received >= self.allowed {
                    return Err(format!(
                        "a message arrived beyond the {} the peer was allowed",
                        self.allowed
                    ));
                }
                crate::bytes::check_message(
                    crate::bytes::Stream::PeerToConnection,
                    self.received,
                    data,
                )?;
                self.received += 1;
                Ok(())
            }
            Event::Completed { seq, opcode } => {
                let e = self.retire_through(*seq)?;
                let expected = match e.kind {
                    Kind::Send { .. } => WcOpcode::SEND,
                    Kind::Write | Kind::WriteRegion => WcOpcode::RDMA_WRITE,
                    Kind::Read { .. } => {
                        return Err(format!("Completed {{ seq: {seq} }} for {:?}", e.kind))
                    }
                };
                if *opcode != expected {
                    return Err(format!(
                        "Completed {{ seq: {seq} }} says {opcode:?}; the request was {:?}",
                        e.kind
                    ));
                }
                Ok(())
            }
            Event::ReadCompleted { seq, data } => {
                let e = self.retire_through(*seq)?;
                let Kind::Read { at, len } = e.kind else {
                    return Err(format!("ReadCompleted {{ seq: {seq} }} for {:?}", e.kind));
                };
                if data[..] != crate::bytes::static_area()[at..at + len] {
                    return Err(format!("ReadCompleted {{ seq: {seq} }}: {} bytes, not the {len} at {at} of the peer's ring", data.len()));
                }
                Ok(())
            }
            Event::Other(what) => Err(format!("unexpected event on a healthy connection: {what}")),
        }
    }

    /// A completion reported for `seq` retires it and everything before.
    fn retire_through(&mut self, seq: u64) -> Result<Entry, String> {
        if seq < self.retired || seq >= self.posted {
            return Err(format!(
                "an event names request {seq}, not outstanding ({}..{})",
                self.retired, self.posted
            ));
        }
        while let Some(e) = self.entries.pop_front() {
            if e.seq == seq {
                self.retired = seq + 1;
                return Ok(e);
            }
            if e.forced {
                return Err(format!(
                    "request {} ({:?}) was signaled, yet it retired silently behind {seq}",
                    e.seq, e.kind
                ));
            }
        }
        Err(format!("request {seq} missing from the model"))
    }

    /// Whether `wait_idle`, called now, may post a marker: only behind a
    /// newest request not known to be signaled (the interval's own
    /// signals are the connection's business). One is needed then, or the
    /// requests after the last signal would never complete.
    pub fn marker_allowed(&self) -> bool {
        self.entries.back().is_some_and(|e| !e.forced)
    }

    /// `wait_idle` returned with `posted` requests posted in all: a
    /// marker may have gone behind unsignaled ones (if `marker_allowed`
    /// when it was called); all retired now.
    pub fn idle(&mut self, posted: u64, marker_allowed: bool) -> Result<(), String> {
        let marker = posted == self.posted + 1 && marker_allowed;
        if posted != self.posted && !marker {
            return Err(format!(
                "wait_idle left {posted} requests posted; {} were, with {} outstanding",
                self.posted,
                self.outstanding()
            ));
        }
        if let Some(e) = self.entries.iter().find(|e| e.forced) {
            return Err(format!(
                "wait_idle retired request {} ({:?}) without its completion event",
                e.seq, e.kind
            ));
        }
        self.entries.clear();
        self.posted = posted;
        self.retired = posted;
        Ok(())
    }
}

/// A connection event, copied out of the callback.
#[derive(Debug, Clone)]
pub enum Event {
    Received(Vec<u8>),
    Completed { seq: u64, opcode: WcOpcode },
    ReadCompleted { seq: u64, data: Vec<u8> },
    Other(String),
}

impl Event {
    pub fn of(ev: &pinpoll::Event<'_>) -> Event {
        match ev {
            pinpoll::Event::Received { data } => Event::Received(data.to_vec()),
            pinpoll::Event::Completed { seq, opcode } => Event::Completed {
                seq: *seq,
                opcode: *opcode,
            },
            pinpoll::Event::ReadCompleted { seq, data } => Event::ReadCompleted {
                seq: *seq,
                data: data.to_vec(),
            },
            other => Event::Other(format!("{other:?}")),
        }
    }
}
