//! The rig: both connections on the device, the peer thread, and the
//! loop that applies a sequence — each operation asked of the model
//! first, done on the device, judged, then every standing promise checked
//! again (canaries, parked regions, the ledger's counters, the peer).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use pinpoll::{Connection, EngineConfig, Posted};
use pinpoll_testkit::pair::{cm_pair, engine_config, oob_pair, pair, Method, Side, RECV_SLOT};

use crate::bytes::static_area;
use crate::canary::{Owned, Shadow, Stamper};
use crate::gen::Op;
use crate::peer::Peer;
use crate::spec::{Ledger, Queues, Regions, Request, Shape, Where};

/// A sequence that broke the model: at which step, and how.
#[derive(Debug, Clone)]
pub struct Failure {
    pub step: usize,
    pub what: String,
}

/// How often the paths worth reaching were reached, so that a run proves
/// it went where it should.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub steps: u64,
    pub completed: u64,
    pub timed_out: u64,
    pub other_completion: u64,
    pub kept_handed_over: u64,
    pub parked_freed: u64,
    pub dropped: u64,
    pub refused_posts: u64,
    pub messages_in: u64,
    pub batches_posted: u64,
    pub batches_dropped: u64,
    pub refused_pushes: u64,
    pub reclaimed: u64,
    pub reads: u64,
    pub reconnects: u64,
    pub canary_checks: u64,
    /// Steps and the time they took, per kind of operation.
    pub time: BTreeMap<&'static str, (u64, Duration)>,
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        macro_rules! sum { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        sum!(
            steps,
            completed,
            timed_out,
            other_completion,
            kept_handed_over,
            parked_freed,
            dropped,
            refused_posts,
            messages_in,
            batches_posted,
            batches_dropped,
            refused_pushes,
            reclaimed,
            reads,
            reconnects,
            canary_checks
        );
        for (op, (n, t)) in &o.time {
            let (total_n, total_t) = self.time.entry(op).or_default();
            *total_n += n;
            *total_t += *t;
        }
    }
}

/// A wait for what is coming.
pub const LONG: Duration = Duration::from_secs(10);
/// A wait that sees only what is there already.
pub const SHORT: Duration = Duration::ZERO;
/// This side's messages the peer may have unread, per connection.
pub const ENDPOINT_WINDOW: u64 = 6;
pub const CONNECTION_WINDOW: u64 = 16;

/// This side's endpoint: requests held, regions in hand, the model.
pub struct EndpointSide {
    pub side: Side,
    pub held: HashMap<u64, (Posted, Shadow)>,
    pub pool: Vec<Owned>,
    pub queues: Queues,
    /// This side's messages sent to the peer.
    pub sent: u64,
}

/// This side's connection: regions in hand and lent, the model.
pub struct ConnectionSide {
    pub conn: Connection,
    pub pool: Vec<Owned>,
    pub lent: VecDeque<Shadow>,
    pub ledger: Ledger,
}

pub struct Rig {
    pub ep: EndpointSide,
    pub cs: ConnectionSide,
    pub peer: Peer,
    pub regions: Regions,
    pub stamper: Stamper,
    pub tally: Tally,
}

/// The connection's settings: small queues and rings so that every limit
/// is met, and no heartbeats (their markers would be the engine's own
/// traffic in the model's sequence numbers).
pub fn connection_config() -> EngineConfig {
    let mut built = engine_config();
    built.heartbeat_interval = None;
    built
}

/// Applies `ops` to fresh connections.
pub fn run(seed: u64, ops: &[Op]) -> Result<Tally, Failure> {
    let fail = |step: usize| move |what: String| Failure { step, what };
    let mut rig = Rig::new(seed);
    for (step, op) in ops.iter().enumerate() {
        let failed = |what: String| Failure {
            step,
            what: format!("{op:?}: {what}"),
        };
        let started = Instant::now();
        if let Op::Reconnect { tcp, reclaim_first } = *op {
            rig = rig.reconnect(tcp, reclaim_first).map_err(failed)?;
        } else {
            rig.apply(op).map_err(failed)?;
        }
        rig.check().map_err(failed)?;
        rig.tally.steps += 1;
        let (n, time) = rig.tally.time.entry(op.name()).or_default();
        *n += 1;
        *time += started.elapsed();
    }
    let (_, _, tally) = rig.close(true).map_err(fail(ops.len()))?;
    Ok(tally)
}

impl Rig {
    fn new(seed: u64) -> Rig {
        Rig::connect(
            false,
            Regions::default(),
            Stamper::new(seed),
            Tally::default(),
        )
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Register { class } => self.register(class),
            Op::Free { pick } => self.free(pick),
            Op::PostRecv { pick } => self.post_recv(pick),
            Op::Post {
                pick,
                verb,
                len,
                at,
            } => self.post(pick, verb, len, at),
            Op::Complete { pick, oldest, long } => self.complete(pick, oldest, long),
            Op::Drop { pick } => self.drop_posted(pick),
            Op::PeerSends { count } => {
                let n = u64::from(count).min(self.ep.queues.unclaimed_receives());
                self.ep.queues.peer_sends(n);
                self.peer.endpoint_sends(n);
                Ok(())
            }
            Op::RegisterLent { class } => self.register_lent(class),
            Op::Batch {
                items,
                signal,
                post,
            } => self.batch(&items, signal, post),
            Op::TrySend { len } => self.try_send(len),
            Op::TryRead { len, at } => self.try_read(len, at),
            Op::Poll => self.poll(),
            Op::Reclaim => self.reclaim(),
            Op::PeerMessages { count } => {
                let n = self.cs.ledger.allow(count.into(), CONNECTION_WINDOW);
                self.peer.connection_sends(n);
                Ok(())
            }
            Op::WaitIdle => self.wait_idle(),
            Op::Reconnect { .. } => unreachable!("the run loop reconnects"),
        }
    }

    /// Every standing promise, after every step.
    fn check(&mut self) -> Result<(), String> {
        if let Some(f) = self.peer.failure() {
            return Err(f);
        }
        for owned in self.ep.pool.iter().chain(&self.cs.pool) {
            owned.check("held by safe code")?;
            self.tally.canary_checks += 1;
        }
        let parked = self.ep.side.ep.parked_regions();
        if parked != self.ep.queues.parked() {
            return Err(format!(
                "the endpoint keeps {parked} parked regions; {} requests were dropped and have not completed",
                self.ep.queues.parked()
            ));
        }
        let (conn, ledger) = (&self.cs.conn, &self.cs.ledger);
        let counts = (conn.outstanding(), conn.lent_regions(), conn.stats().posted);
        let model = (ledger.outstanding(), ledger.lent(), ledger.posted());
        if counts != model {
            return Err(format!(
                "the connection has (outstanding, lent, posted) = {counts:?}; the model {model:?}"
            ));
        }
        Ok(())
    }

    fn reconnect(self, tcp: bool, reclaim_first: bool) -> Result<Rig, String> {
        let (regions, stamper, mut tally) = self.close(reclaim_first)?;
        tally.reconnects += 1;
        Ok(Rig::connect(tcp, regions, stamper, tally))
    }

    /// Closes both connections in order (the lent regions reclaimed first
    /// when `reclaim_first`), checking what comes back.
    fn close(mut self, reclaim_first: bool) -> Result<(Regions, Stamper, Tally), String> {
        if reclaim_first {
            self.wait_idle()?;
            while self.cs.ledger.lent() > 0 {
                self.reclaim()?;
            }
        }
        self.peer.closing();
        self.close_endpoint()?;
        let Rig {
            ep,
            cs,
            peer,
            mut regions,
            stamper,
            tally,
        } = self;
        // abort: the model's peer stops taking messages when told to close,
        // and what this checks is that nothing is freed while named.
        let stats = cs.conn.abort().map_err(|e| format!("abort: {e}"))?;
        if stats.failed != 0 {
            return Err(format!("close: {} requests failed", stats.failed));
        }
        for owned in cs.pool.iter().chain(&ep.pool) {
            owned.check("at close")?;
        }
        peer.stop()?;
        // The queue pair is destroyed: what it kept is freed, and so is
        // what safe code held.
        drop(ep);
        drop(cs.pool);
        regions.all_gone();
        Ok((regions, stamper, tally))
    }

    /// Both connections, the peer started on their other ends.
    fn connect(tcp: bool, mut regions: Regions, stamper: Stamper, tally: Tally) -> Rig {
        let (ep, cs, peer) = connect(tcp, &mut regions);
        Rig {
            ep,
            cs,
            peer,
            regions,
            stamper,
            tally,
        }
    }
}

/// Both connections, the peer started on their other ends.
/// (The kit's pairs fail the test themselves when they cannot connect.)
fn connect(tcp: bool, regions: &mut Regions) -> (EndpointSide, ConnectionSide, Peer) {
    let method = if tcp { Method::Oob } else { Method::Cm };
    let (mut ours, mut theirs) = pair(method);
    theirs
        .exposed
        .copy_from(0, static_area())
        .expect("the peer's static area");
    let cfg = connection_config();
    let (conn, mut peer_conn) = if tcp { oob_pair(&cfg) } else { cm_pair(&cfg) };
    peer_conn
        .target_mut()
        .copy_from(0, static_area())
        .expect("the peer's static area");
    let mut queues = Queues::default();
    let mut held = HashMap::new();
    // The kit posted receives before connecting: they are this side's
    // first requests.
    for p in ours.receives.drain(..) {
        let id = regions
            .registered(None, Where::Posted(p.wr_id()))
            .expect("no address to collide");
        let work = queues.next_receive();
        queues.posted(Request {
            wr_id: p.wr_id(),
            region: id,
            work,
            held: true,
        });
        held.insert(p.wr_id(), (p, Shadow::zeroed(id, RECV_SLOT)));
    }
    let shape = Shape {
        depth: cfg.qp.max_send_wr.into(),
        batch: cfg.batch_size as usize,
        slot_size: conn.slot_size(),
        slot_count: conn.slot_count() as u64,
        inline: conn.inline_threshold(),
        ring: conn.peer_ring().len as usize,
    };
    let ep = EndpointSide {
        side: ours,
        held,
        pool: Vec::new(),
        queues,
        sent: 0,
    };
    let cs = ConnectionSide {
        conn,
        pool: Vec::new(),
        lent: VecDeque::new(),
        ledger: Ledger::new(shape),
    };
    (ep, cs, Peer::start(theirs, peer_conn))
}
