//! The generator: a seeded stream of operations on the public API.
//!
//! An operation names what it works on by a small number (`pick`) that
//! the runner reads modulo what exists at that moment, and does nothing
//! when nothing fits. So every subsequence of a sequence is a sequence
//! too — what lets the shrinker drop operations freely.

/// splitmix64: the same seed gives the same operations on every machine
/// and with every version of every crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn small(&mut self) -> u8 {
        self.next() as u8
    }

    fn word(&mut self) -> u16 {
        self.next() as u16
    }

    /// True `percent` times in 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a request of an [`Op::Post`] does with its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Send,
    Write,
    Read,
}

/// One request of a connection's batch. Lengths and offsets are read
/// relative to the slot size and the peer's ring by the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    Send {
        len: u16,
    },
    Write {
        len: u16,
        at: u16,
    },
    Read {
        len: u16,
        at: u16,
    },
    /// `write_region` of a region of this side's connection pool.
    WriteRegion {
        pick: u8,
        len: u16,
        at: u16,
    },
}

/// One step of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    // The endpoint: whole regions posted, completed, dropped.
    /// Registers a region of size class `class` into the pool.
    Register {
        class: u8,
    },
    /// Frees a pool region.
    Free {
        pick: u8,
    },
    /// Posts a receive into a pool region.
    PostRecv {
        pick: u8,
    },
    /// Posts a SEND, WRITE or READ of a pool region's first bytes
    /// (`len` of 65535ths of the region: above 1.0 it does not fit).
    Post {
        pick: u8,
        verb: Verb,
        len: u16,
        at: u16,
    },
    /// `complete` on a held request: the oldest of its queue, or any.
    Complete {
        pick: u8,
        oldest: bool,
        long: bool,
    },
    /// Drops a held request.
    Drop {
        pick: u8,
    },
    /// The peer sends this many messages into the posted receives.
    PeerSends {
        count: u8,
    },

    // The connection: rings, batches, lent regions.
    /// Registers a region into the connection's pool.
    RegisterLent {
        class: u8,
    },
    /// A batch of up to four requests, `signal` marking the one pushed
    /// after `signal_next`, then posted or dropped.
    Batch {
        items: [Option<Item>; 4],
        signal: Option<u8>,
        post: bool,
    },
    TrySend {
        len: u16,
    },
    TryRead {
        len: u16,
        at: u16,
    },
    Poll,
    Reclaim,
    /// The peer may send this many more messages to the connection.
    PeerMessages {
        count: u8,
    },
    WaitIdle,

    /// Closes both connections and connects anew (rdma_cm, or the
    /// out-of-band exchange when `tcp`), after reclaiming every lent
    /// region when `reclaim_first`.
    Reconnect {
        tcp: bool,
        reclaim_first: bool,
    },
}

impl Op {
    /// The operation's kind, for timings.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Register { .. } => "Register",
            Op::Free { .. } => "Free",
            Op::PostRecv { .. } => "PostRecv",
            Op::Post { .. } => "Post",
            Op::Complete { .. } => "Complete",
            Op::Drop { .. } => "Drop",
            Op::PeerSends { .. } => "PeerSends",
            Op::RegisterLent { .. } => "RegisterLent",
            Op::Batch { .. } => "Batch",
            Op::TrySend { .. } => "TrySend",
            Op::TryRead { .. } => "TryRead",
            Op::Poll => "Poll",
            Op::Reclaim => "Reclaim",
            Op::PeerMessages { .. } => "PeerMessages",
            Op::WaitIdle => "WaitIdle",
            Op::Reconnect { .. } => "Reconnect",
        }
    }
}

/// `n` operations from `seed`.
pub fn sequence(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| op(&mut rng)).collect()
}

/// Lengths mostly inside what they apply to, one in eight beyond it.
fn fraction(rng: &mut Rng) -> u16 {
    if rng.chance(12) {
        u16::MAX
    } else {
        rng.word() / 2 + rng.word() / 3
    }
}

fn item(rng: &mut Rng) -> Item {
    match rng.below(10) {
        0..=2 => Item::Send { len: fraction(rng) },
        3..=5 => Item::Write {
            len: fraction(rng),
            at: rng.word(),
        },
        6..=7 => Item::Read {
            len: fraction(rng),
            at: rng.word(),
        },
        _ => Item::WriteRegion {
            pick: rng.small(),
            len: fraction(rng),
            at: rng.word(),
        },
    }
}

fn batch(rng: &mut Rng) -> Op {
    let n = 1 + rng.below(4) as usize;
    let mut items = [None; 4];
    for slot in items.iter_mut().take(n) {
        *slot = Some(item(rng));
    }
    Op::Batch {
        items,
        signal: rng.chance(30).then(|| rng.below(n as u64) as u8),
        post: !rng.chance(15),
    }
}

fn op(rng: &mut Rng) -> Op {
    match rng.below(1000) {
        0..=59 => Op::Register { class: rng.small() },
        60..=89 => Op::Free { pick: rng.small() },
        90..=189 => Op::PostRecv { pick: rng.small() },
        190..=339 => Op::Post {
            pick: rng.small(),
            verb: [Verb::Send, Verb::Write, Verb::Read][rng.below(3) as usize],
            len: fraction(rng),
            at: rng.word(),
        },
        340..=479 => Op::Complete {
            pick: rng.small(),
            oldest: !rng.chance(20),
            long: rng.chance(60),
        },
        480..=509 => Op::Drop { pick: rng.small() },
        510..=569 => Op::PeerSends {
            count: 1 + rng.below(4) as u8,
        },
        570..=599 => Op::RegisterLent { class: rng.small() },
        600..=749 => batch(rng),
        750..=789 => Op::TrySend { len: fraction(rng) },
        790..=819 => Op::TryRead {
            len: fraction(rng),
            at: rng.word(),
        },
        820..=899 => Op::Poll,
        900..=939 => Op::Reclaim,
        940..=979 => Op::PeerMessages {
            count: 1 + rng.below(6) as u8,
        },
        980..=998 => Op::WaitIdle,
        _ => Op::Reconnect {
            tcp: rng.chance(50),
            reclaim_first: rng.chance(70),
        },
    }
}
