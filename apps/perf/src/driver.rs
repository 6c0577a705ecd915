//! The measured loops: the client's side of every test in direct mode
//! ([`DirectClient`]) and engine mode ([`EngineClient`]), and the server's
//! side ([`serve`]), which is always direct. Nothing here allocates once
//! a driver is built, and every wait is bounded.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use pinpoll::datapath::Stats;
use pinpoll::{Connection, Engine, EngineConfig, EngineEvent, Error, Event};

use crate::clock;
use crate::plan::{Kind, Mode, Plan};

/// Spins between two reads of the clock in our own busy-waits.
const SPINS_PER_CHECK: u32 = 256;

/// A bounded busy-wait of our own, on the cheap clock. It reads no clock
/// at all until it has spun [`SPINS_PER_CHECK`] times, so a wait that
/// ends at once costs nothing.
struct Spin {
    start: u64,
    limit: Duration,
    spins: u32,
    what: &'static str,
}

impl Spin {
    #[inline]
    fn new(limit: Duration, what: &'static str) -> Spin {
        Spin {
            start: 0,
            limit,
            spins: 0,
            what,
        }
    }

    /// `Ok(true)` when the clock was read (time for slower checks).
    #[inline]
    fn tick(&mut self) -> Result<bool> {
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CHECK) {
            // No PAUSE: it would delay noticing the event (see pinpoll's
            // `wait` module).
            return Ok(false);
        }
        let now = clock::ticks();
        if self.start == 0 {
            self.start = now;
            return Ok(true);
        }
        let waited = clock::to_duration(now.saturating_sub(self.start));
        if waited >= self.limit {
            return Err(Error::Timeout {
                what: self.what,
                waited,
            }
            .into());
        }
        Ok(true)
    }

    /// Starts over (the awaited thing happened).
    #[inline]
    fn reset(&mut self) {
        self.start = 0;
        self.spins = 0;
    }

    /// How long this wait has lasted, as of the last clock read.
    fn waited(&self) -> Duration {
        if self.start == 0 {
            Duration::ZERO
        } else {
            clock::to_duration(clock::ticks().saturating_sub(self.start))
        }
    }
}

/// Posts a write-lat ping or pong, `buf` with its new last byte: inline
/// when it fits, and above the inline threshold straight from a send-ring
/// slot, as perftest posts from its registered buffer. A slot gets the
/// whole payload on its first use (`primed` counts them) and afterwards
/// only the last byte, so no operation copies the payload: a copy per
/// round trip would be measured as latency (perftest copies none either).
#[inline]
fn post_ping(
    conn: &mut Connection,
    timeout: Duration,
    buf: &[u8],
    imm: Option<u32>,
    primed: &mut u64,
    turns: &mut u64,
) -> Result<u64> {
    if buf.len() <= conn.inline_threshold() {
        return post_one(conn, timeout, turns, |c| c.try_write(buf, 0, imm));
    }
    let fill = *primed < conn.slot_count() as u64;
    let last = buf.len() - 1;
    let seq = post_one(conn, timeout, turns, |c| {
        c.try_write_from(buf.len(), 0, imm, |slot| {
            if fill {
                slot.copy_from_slice(buf);
            } else {
                slot[last] = buf[last];
            }
            Ok(())
        })
    })?;
    *primed += u64::from(fill);
    Ok(seq)
}

/// The value a ping carries in its last byte: never 0 (the ring's initial
/// contents), never equal to the previous one.
#[inline]
fn ping_value(counter: u64) -> u8 {
    (counter % 255) as u8 + 1
}

/// A latency test asked to stream, or a bandwidth test to ping-pong.
#[cold]
fn wrong_kind(kind: Kind) -> anyhow::Error {
    let (is, not) = if kind.is_latency() {
        ("latency", "bandwidth")
    } else {
        ("bandwidth", "latency")
    };
    anyhow!("{} is a {is} test, not a {not} test", kind.name())
}

/// The client side of a measurement.
pub trait Driver {
    /// One latency iteration: a ping-pong (write, send) or a READ.
    fn round_trip(&mut self) -> Result<()>;
    /// `n` operations of a bandwidth test, through to the completion of
    /// the last one.
    fn stream(&mut self, n: u64) -> Result<()>;
    /// Counters so far (in engine mode: those the worker reports at
    /// shutdown; `None` until then).
    fn stats(&self) -> Option<Stats>;
    /// The largest payload posted inline.
    fn inline_threshold(&self) -> usize;
    /// Waits until every operation posted so far has completed (the
    /// peer's queue pair must still be there to acknowledge them).
    fn quiesce(&mut self) -> Result<()>;
    /// Drains in-flight work and releases the connection; returns the
    /// final counters.
    fn finish(self: Box<Self>) -> Result<Stats>;
}

/// Direct mode: this thread owns the connection.
#[derive(Debug)]
pub struct DirectClient {
    conn: Connection,
    plan: Plan,
    buf: Vec<u8>,
    counter: u64,
    posted: u64,
    acked: u64,
    depth: u64,
    timeout: Duration,
    /// Send-ring slots already holding the payload (bandwidth tests).
    primed: u64,
    /// Turns of this driver's own latency waits that found nothing
    /// (added to the connection's in [`Driver::stats`]).
    wait_turns: u64,
}

impl DirectClient {
    pub fn new(conn: Connection, plan: Plan, cfg: &EngineConfig) -> DirectClient {
        // Calibrated now, not at a wait's first clock check mid-measurement.
        clock::ns_per_tick();
        let mut buf = vec![0u8; plan.size];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        DirectClient {
            conn,
            plan,
            buf,
            counter: 0,
            posted: 0,
            acked: 0,
            depth: u64::from(cfg.qp.max_send_wr),
            timeout: cfg.completion_timeout,
            primed: 0,
            wait_turns: 0,
        }
    }

    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Takes credits (the server's count of consumed messages) and send
    /// completions; returns how many completions it took.
    #[inline]
    fn poll_credits(&mut self) -> Result<usize> {
        let mut acked = self.acked;
        let mut failed = None;
        let n = self.conn.poll(|ev| match ev {
            Event::Received { data } => {
                if let Some(count) = read_credit(data) {
                    acked = acked.max(count);
                }
            }
            Event::Failed(e) => failed = Some(e),
            _ => {}
        })?;
        self.acked = acked;
        match failed {
            Some(e) => Err(Error::Completion(e).into()),
            None => Ok(n),
        }
    }
}

/// A credit: the server's running count of messages consumed.
#[inline]
pub fn read_credit(data: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = data.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Posts one operation on its own (the connection's batch-of-one fast
/// path), reaping send completions while the send queue (or a ring) is
/// full. The connection's own `write`/`send`/`read` do the same with the
/// OS clock; this one reads the TSC, and only when it has to wait.
#[inline]
fn post_one(
    conn: &mut Connection,
    timeout: Duration,
    turns: &mut u64,
    mut op: impl FnMut(&mut Connection) -> pinpoll::Result<u64>,
) -> Result<u64> {
    let mut spin = Spin::new(timeout, "send-queue room");
    loop {
        match op(conn) {
            Err(Error::Full { .. }) => {
                if conn.reap()? == 0 {
                    *turns += 1;
                    spin.tick()?;
                }
            }
            done => return Ok(done?),
        }
    }
}

/// Busy-waits until the send `seq` has completed (its signaled
/// completion reaped), as perftest polls its send CQ after every post.
#[inline]
fn await_send(conn: &mut Connection, timeout: Duration, seq: u64, turns: &mut u64) -> Result<()> {
    let mut spin = Spin::new(timeout, "a send completion (--await-sends)");
    loop {
        conn.reap()?;
        if conn.is_retired(seq) {
            return Ok(());
        }
        *turns += 1;
        spin.tick()?;
    }
}

/// Busy-waits for the next message and returns its length, as perftest
/// polls its receive CQ: never yielding nor napping, however long the
/// wait (the connection's `recv` yields after 1 ms and naps after 10, which
/// a loaded host turns into tail latency perftest does not pay).
#[inline]
fn spin_recv(conn: &mut Connection, timeout: Duration, turns: &mut u64) -> Result<usize> {
    let mut spin = Spin::new(timeout, "the peer's SEND (send-lat pong)");
    loop {
        if let Some(len) = conn.try_recv()?.map(|m| m.data.len()) {
            return Ok(len);
        }
        *turns += 1;
        if spin.tick()? {
            // Surfaces a failed send instead of waiting it out.
            conn.reap()?;
        }
    }
}

/// The measured latency loop: `iters` round trips, each one's duration in
/// clock ticks handed to `record` (one clock read per round trip, as
/// perftest's `get_cycles` before each post). Never inlined, so that its
/// instructions can be counted alone (`callgrind --toggle-collect`, see
/// scripts/count-instructions.sh).
#[inline(never)]
pub fn timed_round_trips(
    driver: &mut dyn Driver,
    iters: u64,
    mut record: impl FnMut(u64),
) -> Result<()> {
    let mut prev = clock::ticks();
    for _ in 0..iters {
        driver.round_trip()?;
        let now = clock::ticks();
        record(now.saturating_sub(prev));
        prev = now;
    }
    Ok(())
}

/// The measured bandwidth run: `n` operations through to the last
/// completion; returns the ticks it took. Never inlined, as
/// [`timed_round_trips`].
#[inline(never)]
pub fn timed_stream(driver: &mut dyn Driver, n: u64) -> Result<u64> {
    let start = clock::ticks();
    driver.stream(n)?;
    Ok(clock::ticks().saturating_sub(start))
}

impl Driver for DirectClient {
    #[inline]
    fn round_trip(&mut self) -> Result<()> {
        let size = self.plan.size;
        let timeout = self.timeout;
        match self.plan.kind {
            Kind::WriteLat => {
                self.counter += 1;
                let v = ping_value(self.counter);
                let last = size - 1;
                self.buf[last] = v;
                let turns = &mut self.wait_turns;
                let seq = post_ping(
                    &mut self.conn,
                    timeout,
                    &self.buf,
                    None,
                    &mut self.primed,
                    turns,
                )?;
                if self.plan.await_sends {
                    await_send(&mut self.conn, timeout, seq, turns)?;
                }
                let mut spin = Spin::new(timeout, "the peer's RDMA WRITE (write-lat pong)");
                while self.conn.target_byte(last) != v {
                    *turns += 1;
                    if spin.tick()? {
                        // Surfaces a failed write instead of waiting it out.
                        self.conn.reap()?;
                    }
                }
                Ok(())
            }
            Kind::SendLat => {
                let buf = &self.buf[..];
                let turns = &mut self.wait_turns;
                let seq = post_one(&mut self.conn, timeout, turns, |c| c.try_send(buf))?;
                if self.plan.await_sends {
                    await_send(&mut self.conn, timeout, seq, turns)?;
                }
                // Only the receive CQ while the pong is due; the send CQ is
                // reaped when the send queue fills (and by recv while it waits).
                let len = if self.plan.await_sends {
                    spin_recv(&mut self.conn, timeout, turns)?
                } else {
                    self.conn.recv()?.data.len()
                };
                if len != size {
                    return Err(anyhow!(
                        "send-lat: the server answered {len} bytes, expected {size}"
                    ));
                }
                Ok(())
            }
            Kind::ReadLat => {
                let turns = &mut self.wait_turns;
                let seq = post_one(&mut self.conn, timeout, turns, |c| c.try_read(0, size))?;
                // Only the send CQ: the READ's completion retires it (the
                // data stay in the READ ring; perftest does not look either).
                let mut spin = Spin::new(timeout, "an RDMA READ completion");
                loop {
                    self.conn.reap()?;
                    if self.conn.is_retired(seq) {
                        return Ok(());
                    }
                    *turns += 1;
                    spin.tick()?;
                }
            }
            other => Err(wrong_kind(other)),
        }
    }

    fn stream(&mut self, n: u64) -> Result<()> {
        let kind = self.plan.kind;
        if kind.is_latency() {
            return Err(wrong_kind(kind));
        }
        let credits = kind.consumes_receives();
        let end = self.posted + n;
        let mut spin = Spin::new(self.timeout, "send-queue room");
        while self.posted < end {
            let mut allowed = end - self.posted;
            if credits {
                let window = self.acked + self.plan.recv_depth - self.posted;
                if window == 0 {
                    if self.poll_credits()? == 0 {
                        spin.tick()?;
                    }
                    continue;
                }
                allowed = allowed.min(window);
            }
            if self.conn.outstanding() + 1 > self.depth {
                if self.reap_or_credits(credits)? == 0 {
                    spin.tick()?;
                }
                continue;
            }
            // Above the inline threshold a WRITE or SEND goes from a
            // send-ring slot built in place (zero copy), as perftest posts
            // from its own registered buffer: the payload never changes,
            // so each slot is filled on its first use and then sent as is.
            let in_place = self.buf.len() > self.conn.inline_threshold()
                && matches!(kind, Kind::WriteBw | Kind::WriteImmBw | Kind::SendBw);
            let posted = self.post_batch(end, allowed, in_place)?;
            self.posted += posted;
            if posted == 0 || credits {
                if self.reap_or_credits(credits)? == 0 && posted == 0 {
                    spin.tick()?;
                }
            } else {
                spin = Spin::new(self.timeout, "send-queue room");
            }
        }
        self.conn.wait_idle(|_| {})?;
        if let Some(e) = self.conn.failure() {
            return Err(Error::Completion(*e).into());
        }
        Ok(())
    }

    fn stats(&self) -> Option<Stats> {
        Some(self.counters())
    }

    fn inline_threshold(&self) -> usize {
        self.conn.inline_threshold()
    }

    fn quiesce(&mut self) -> Result<()> {
        Ok(self.conn.wait_idle(|_| {})?)
    }

    fn finish(mut self: Box<Self>) -> Result<Stats> {
        self.conn.wait_idle(|_| {})?;
        // Closed here, not dropped later: the counters then include the
        // drains of close (their waits too).
        let mut stats = self.conn.close()?;
        stats.wait_turns += self.wait_turns;
        Ok(stats)
    }
}

impl DirectClient {
    /// The connection's counters, with this driver's own waits.
    fn counters(&self) -> Stats {
        let mut stats = self.conn.stats();
        stats.wait_turns += self.wait_turns;
        stats
    }

    /// Posts up to `allowed` operations of the stream ending at `end` as one
    /// batch (the stream's last one signaled); returns how many were posted.
    /// `in_place`: WRITEs and SENDs go from send-ring slots, each filled on
    /// its first use.
    #[inline]
    fn post_batch(&mut self, end: u64, allowed: u64, in_place: bool) -> Result<u64> {
        let kind = self.plan.kind;
        let slots = self.conn.slot_count() as u64;
        let (conn, buf, primed) = (&mut self.conn, &self.buf[..], &mut self.primed);
        let mut b = conn.batch();
        let mut k = 0u64;
        let last = end - 1;
        let imm = (self.posted & 0xffff_ffff) as u32;
        while k < allowed {
            if self.posted + k == last {
                b.signal_next();
            }
            let imm = match kind {
                Kind::WriteImmBw => Some(imm.wrapping_add(k as u32)),
                _ => None,
            };
            let fill = in_place && *primed < slots;
            let prime = |slot: &mut [u8]| {
                if fill {
                    slot.copy_from_slice(buf);
                }
                Ok(())
            };
            let r = match kind {
                Kind::WriteBw | Kind::WriteImmBw if in_place => {
                    b.write_from(buf.len(), 0, imm, prime)
                }
                Kind::WriteBw | Kind::WriteImmBw => b.write(buf, 0, imm),
                Kind::SendBw if in_place => b.send_from(buf.len(), prime),
                Kind::SendBw => b.send(buf),
                Kind::ReadBw => b.read(0, buf.len()),
                _ => unreachable!("stream() refuses latency kinds"),
            };
            *primed += u64::from(fill && r.is_ok());
            match r {
                Ok(_) => k += 1,
                Err(Error::Full { .. } | Error::BatchFull { .. }) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(b.post()? as u64)
    }

    #[inline]
    fn reap_or_credits(&mut self, credits: bool) -> Result<usize> {
        if credits {
            self.poll_credits()
        } else {
            Ok(self.conn.reap()?)
        }
    }
}

/// Engine mode: a pinned worker owns the connection.
#[derive(Debug)]
pub struct EngineClient {
    engine: Engine,
    plan: Plan,
    buf: Vec<u8>,
    counter: u64,
    next_id: u64,
    posted: u64,
    acked: u64,
    inline_threshold: usize,
    timeout: Duration,
}

impl EngineClient {
    pub fn new(conn: Connection, plan: Plan, cfg: &EngineConfig) -> Result<EngineClient> {
        clock::ns_per_tick();
        let inline_threshold = conn.inline_threshold();
        let engine = Engine::spawn(conn, cfg)?;
        let buf = (0..plan.size).map(|i| (i % 251) as u8).collect();
        Ok(EngineClient {
            engine,
            plan,
            buf,
            counter: 0,
            next_id: 0,
            posted: 0,
            acked: 0,
            inline_threshold,
            timeout: cfg.completion_timeout,
        })
    }

    pub fn worker_affinity(&self) -> &[usize] {
        self.engine.worker_affinity()
    }

    /// Submits one operation, taking completions while the hand-off
    /// queues are full. Returns its id.
    #[inline]
    fn submit(&mut self, signal: bool) -> Result<u64> {
        let mut spin = Spin::new(self.timeout, "room in the engine's queues");
        loop {
            if signal {
                self.engine.signal_next();
            }
            let size = self.plan.size;
            let r = match self.plan.kind {
                Kind::WriteLat | Kind::WriteBw => self.engine.try_write(&self.buf, 0, None),
                Kind::WriteImmBw => {
                    let imm = (self.next_id & 0xffff_ffff) as u32;
                    self.engine.try_write(&self.buf, 0, Some(imm))
                }
                Kind::SendLat | Kind::SendBw => self.engine.try_send(&self.buf),
                Kind::ReadLat | Kind::ReadBw => self.engine.try_read(0, size),
            };
            match r {
                Ok(id) => {
                    self.next_id = id + 1;
                    return Ok(id);
                }
                Err(Error::Full { .. }) => {
                    if self.drain()? == 0 {
                        spin.tick()?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Takes every completion handed back so far; returns how many.
    #[inline]
    fn drain(&mut self) -> Result<usize> {
        let mut n = 0;
        let mut acked = self.acked;
        while let Some(c) = self.engine.poll() {
            n += 1;
            match c {
                EngineEvent::Received { data } => {
                    if let Some(count) = read_credit(data) {
                        acked = acked.max(count);
                    }
                }
                EngineEvent::Failed(e) => return Err(Error::Completion(e).into()),
                EngineEvent::Refused { id } => {
                    return Err(anyhow!(
                        "the worker refused operation {id}: the connection had failed"
                    ))
                }
                _ => {}
            }
        }
        self.acked = acked;
        Ok(n)
    }

    /// Waits for the completion `want` picks out (others are dropped).
    /// Spins on `Engine::poll` with our cheap clock rather than
    /// `Engine::wait`, which reads the OS clock on every call.
    #[inline]
    fn wait_for(&mut self, mut want: impl FnMut(&EngineEvent<'_>) -> bool) -> Result<()> {
        let mut spin = Spin::new(self.timeout, "a completion from the worker");
        loop {
            match self.engine.poll() {
                Some(EngineEvent::Failed(e)) => return Err(Error::Completion(e).into()),
                Some(EngineEvent::Refused { id }) => {
                    return Err(anyhow!(
                        "the worker refused operation {id}: the connection had failed"
                    ))
                }
                Some(ref c) if want(c) => return Ok(()),
                Some(_) => {}
                None => {
                    spin.tick()?;
                }
            }
        }
    }
}

impl Driver for EngineClient {
    #[inline]
    fn round_trip(&mut self) -> Result<()> {
        let size = self.plan.size;
        match self.plan.kind {
            Kind::WriteLat => {
                self.counter += 1;
                let v = ping_value(self.counter);
                self.buf[size - 1] = v;
                self.submit(false)?;
                let v = u32::from(v);
                self.wait_for(|c| matches!(c, EngineEvent::WriteImm { imm, .. } if *imm == v))
            }
            Kind::SendLat => {
                self.submit(false)?;
                self.wait_for(|c| matches!(c, EngineEvent::Received { .. }))
            }
            Kind::ReadLat => {
                let id = self.submit(false)?;
                self.wait_for(
                    |c| matches!(c, EngineEvent::ReadCompleted { id: done, .. } if *done == id),
                )
            }
            other => Err(wrong_kind(other)),
        }
    }

    fn stream(&mut self, n: u64) -> Result<()> {
        let kind = self.plan.kind;
        if kind.is_latency() {
            return Err(wrong_kind(kind));
        }
        let credits = kind.consumes_receives();
        let reads = kind == Kind::ReadBw;
        let end = self.posted + n;
        let mut reads_done = 0u64;
        let mut last_id = 0;
        let mut spin = Spin::new(self.timeout, "credits from the server");
        while self.posted < end {
            if credits && self.posted >= self.acked + self.plan.recv_depth {
                if self.drain()? == 0 {
                    spin.tick()?;
                }
                continue;
            }
            let last = self.posted + 1 == end;
            if reads {
                // Count READ completions as they come back.
                let mut done = 0;
                while let Some(c) = self.engine.poll() {
                    match c {
                        EngineEvent::ReadCompleted { .. } => done += 1,
                        EngineEvent::Failed(e) => return Err(Error::Completion(e).into()),
                        _ => {}
                    }
                }
                reads_done += done;
                last_id = self.submit_counting(&mut reads_done)?;
            } else {
                last_id = self.submit(last)?;
                if self.posted.is_multiple_of(16) {
                    self.drain()?;
                }
            }
            self.posted += 1;
            spin = Spin::new(self.timeout, "credits from the server");
        }
        if reads {
            let mut spin = Spin::new(self.timeout, "the last READ completions");
            while reads_done < n {
                match self.engine.poll() {
                    Some(EngineEvent::ReadCompleted { .. }) => reads_done += 1,
                    Some(EngineEvent::Failed(e)) => return Err(Error::Completion(e).into()),
                    Some(_) => {}
                    None => {
                        spin.tick()?;
                    }
                }
            }
            Ok(())
        } else {
            self.wait_for(|c| matches!(c, EngineEvent::Completed { id, .. } if *id == last_id))
        }
    }

    fn stats(&self) -> Option<Stats> {
        None
    }

    fn inline_threshold(&self) -> usize {
        self.inline_threshold
    }

    fn quiesce(&mut self) -> Result<()> {
        // The engine has no wait-idle: a signaled empty WRITE behind
        // everything submitted retires it all when it completes.
        self.drain()?;
        let mut spin = Spin::new(self.timeout, "room in the engine's queues");
        let id = loop {
            match self.engine.signal_next().try_write(&[], 0, None) {
                Ok(id) => break id,
                Err(Error::Full { .. }) => {
                    if self.drain()? == 0 {
                        spin.tick()?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.wait_for(|c| matches!(c, EngineEvent::Completed { id: done, .. } if *done == id))
    }

    fn finish(self: Box<Self>) -> Result<Stats> {
        Ok(self.engine.shutdown()?.stats)
    }
}

impl EngineClient {
    /// `submit` for READs, counting READ completions met while the queues
    /// are full.
    fn submit_counting(&mut self, reads_done: &mut u64) -> Result<u64> {
        let mut spin = Spin::new(self.timeout, "room in the engine's queues");
        loop {
            match self.engine.try_read(0, self.plan.size) {
                Ok(id) => return Ok(id),
                Err(Error::Full { .. }) => {
                    let mut any = false;
                    while let Some(c) = self.engine.poll() {
                        any = true;
                        match c {
                            EngineEvent::ReadCompleted { .. } => *reads_done += 1,
                            EngineEvent::Failed(e) => return Err(Error::Completion(e).into()),
                            _ => {}
                        }
                    }
                    if !any {
                        spin.tick()?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Builds the client driver for `plan.mode`.
pub fn client(conn: Connection, plan: Plan, cfg: &EngineConfig) -> Result<Box<dyn Driver + Send>> {
    Ok(match plan.mode {
        Mode::Direct => Box::new(DirectClient::new(conn, plan, cfg)),
        Mode::Engine => Box::new(EngineClient::new(conn, plan, cfg)?),
    })
}

/// What the server did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Pings answered (latency) or messages consumed (SEND, WRITE_WITH_IMM).
    pub messages: u64,
    pub stats: Stats,
}

/// How long the server sleeps between checks while the client works
/// alone (READ and WRITE streams need nothing from the server's CPU).
const PASSIVE_NAP: Duration = Duration::from_millis(1);

/// How long nothing must arrive before the server asks `stop`.
const QUIET: Duration = Duration::from_millis(1);

/// The end of a client's session on the server (`--max-session`): serving
/// past it fails with [`SessionLimit`].
#[derive(Debug, Clone, Copy)]
pub struct Until(pub Option<Instant>);

/// How many messages the server serves between two looks at the clock
/// for [`Until`]: rare enough to cost nothing per message, and at any
/// rate a device reaches, a small fraction of a second.
const SESSION_CHECK: u64 = 1024;

impl Until {
    /// Fails once the session is over; on the fast path (`served`
    /// messages so far) it looks at the clock every [`SESSION_CHECK`].
    #[inline]
    pub fn check(self, served: u64) -> Result<()> {
        match self.0 {
            Some(end) if served.is_multiple_of(SESSION_CHECK) && Instant::now() >= end => {
                Err(SessionLimit.into())
            }
            _ => Ok(()),
        }
    }
}

/// The client's session reached the server's `--max-session`.
#[derive(Debug)]
pub struct SessionLimit;

impl std::fmt::Display for SessionLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("session limit reached (the server's --max-session)")
    }
}

impl std::error::Error for SessionLimit {}

/// The server's side of `plan`, until `stop` says so. `stop` is asked only
/// when nothing arrived for a while (never on the fast path); `idle_limit`
/// bounds how long the server waits with nothing arriving. `timeout`
/// bounds each of its own completion waits; `until` the whole of it, busy
/// or not (else a client pinging within `idle_limit` would hold the
/// server as long as it liked).
pub fn serve(
    conn: &mut Connection,
    plan: Plan,
    timeout: Duration,
    idle_limit: Duration,
    until: Until,
    stop: &mut dyn FnMut() -> Result<bool>,
) -> Result<Served> {
    // Calibrated before serving, not at an idle wait's second clock check
    // while the client is measuring.
    clock::ns_per_tick();
    let buf: Vec<u8> = (0..plan.size).map(|i| (i % 251) as u8).collect();
    // Idle: our spin's clock starts at its first check; after QUIET the
    // server asks `stop`, after idle_limit it gives up.
    let mut idle = Spin::new(idle_limit, "the client's next operation (server idle)");
    let served = match plan.kind {
        Kind::WriteLat => serve_write_lat(conn, &plan, buf, timeout, &mut idle, until, stop)?,
        Kind::SendLat => serve_send_lat(conn, &plan, &buf, timeout, &mut idle, until, stop)?,
        Kind::ReadLat | Kind::WriteBw | Kind::ReadBw => serve_passively(conn, until, stop)?,
        Kind::SendBw | Kind::WriteImmBw => {
            serve_stream(conn, &plan, timeout, &mut idle, until, stop)?
        }
    };
    conn.set_completion_timeout(timeout);
    conn.wait_idle(|_| {})?;
    Ok(Served {
        messages: served,
        stats: conn.stats(),
    })
}

/// write-lat: answers each new last byte of the target ring with a WRITE
/// of the same byte (and an immediate when the plan asks for one).
fn serve_write_lat(
    conn: &mut Connection,
    plan: &Plan,
    mut buf: Vec<u8>,
    timeout: Duration,
    idle: &mut Spin,
    until: Until,
    stop: &mut dyn FnMut() -> Result<bool>,
) -> Result<u64> {
    let last = plan.size - 1;
    let (mut seen, mut primed, mut served) = (0u8, 0u64, 0u64);
    let reply_imm = plan.reply_with_imm();
    loop {
        let v = conn.target_byte(last);
        if v != seen {
            seen = v;
            buf[last] = v;
            let imm = reply_imm.then_some(u32::from(v));
            // The server's waits are not measured: their turns go nowhere.
            let seq = post_ping(conn, timeout, &buf, imm, &mut primed, &mut 0)?;
            if plan.await_sends {
                await_send(conn, timeout, seq, &mut 0)?;
            }
            served += 1;
            idle.reset();
            until.check(served)?;
            continue;
        }
        if quiet_turn(conn, idle, until, stop)? {
            return Ok(served);
        }
    }
}

/// An idle turn of a latency server: once nothing arrived for [`QUIET`],
/// asks `stop` (true: the server stops) and otherwise reaps completions.
#[inline]
fn quiet_turn(
    conn: &mut Connection,
    idle: &mut Spin,
    until: Until,
    stop: &mut dyn FnMut() -> Result<bool>,
) -> Result<bool> {
    if idle.tick()? && idle.waited() > QUIET {
        until.check(0)?;
        if stop()? {
            return Ok(true);
        }
        conn.reap()?;
    }
    Ok(false)
}

/// send-lat: answers each message with one of the same length.
fn serve_send_lat(
    conn: &mut Connection,
    plan: &Plan,
    buf: &[u8],
    timeout: Duration,
    idle: &mut Spin,
    until: Until,
    stop: &mut dyn FnMut() -> Result<bool>,
) -> Result<u64> {
    let mut served = 0u64;
    loop {
        if let Some(len) = conn.try_recv()?.map(|m| m.data.len()) {
            let data = &buf[..len.min(buf.len())];
            let seq = post_one(conn, timeout, &mut 0, |c| c.try_send(data))?;
            if plan.await_sends {
                await_send(conn, timeout, seq, &mut 0)?;
            }
            served += 1;
            idle.reset();
            until.check(served)?;
            continue;
        }
        if quiet_turn(conn, idle, until, stop)? {
            return Ok(served);
        }
    }
}

/// read-lat, write-bw, read-bw: the client's READs and WRITEs need nothing
/// from this CPU, so the server naps (the core stays free for the device,
/// rxe runs in the kernel, and for the client) until `stop`.
fn serve_passively(
    conn: &mut Connection,
    until: Until,
    stop: &mut dyn FnMut() -> Result<bool>,
) -> Result<u64> {
    loop {
        until.check(0)?;
        if stop()? {
            return Ok(0);
        }
        conn.reap()?;
        if conn.peer_gone()? {
            return Err(Error::Disconnected.into());
        }
        std::thread::sleep(PASSIVE_NAP);
    }
}

/// send-bw, write-imm-bw: counts arrivals and SENDs a credit every
/// `credit_window` of them.
fn serve_stream(
    conn: &mut Connection,
    plan: &Plan,
    timeout: Duration,
    idle: &mut Spin,
    until: Until,
    stop: &mut dyn FnMut() -> Result<bool>,
) -> Result<u64> {
    let (mut served, mut credited) = (0u64, 0u64);
    loop {
        let mut got = 0u64;
        let mut failed = None;
        conn.poll(|ev| match ev {
            Event::Received { .. } | Event::WriteImm { .. } => got += 1,
            Event::Failed(e) => failed = Some(e),
            _ => {}
        })?;
        if let Some(e) = failed {
            return Err(Error::Completion(e).into());
        }
        if got > 0 {
            // `got` may step over a multiple of SESSION_CHECK.
            if (served + got) / SESSION_CHECK != served / SESSION_CHECK {
                until.check(0)?;
            }
            served += got;
            idle.reset();
            if served - credited >= plan.credit_window {
                credited = served;
                let credit = credited.to_le_bytes();
                post_one(conn, timeout, &mut 0, |c| c.try_send(&credit))?;
            }
            continue;
        }
        if idle.tick()? && idle.waited() > QUIET {
            until.check(0)?;
            if stop()? {
                return Ok(served);
            }
        }
    }
}
