//! What one measurement is: the test, the message size, the iterations and
//! the connection's configuration. The client decides all of it; the
//! server receives it as [`Params`], checks every field
//! ([`Params::check`]) and follows within its own limits (`admit`).

use std::time::Duration;

use pinpoll::{EngineConfig, PageSize};
use serde::{Deserialize, Serialize};

/// The largest message: perftest's `-a` goes up to 2^23 bytes.
pub const MAX_SIZE: usize = 1 << 23;
/// Bytes per registered ring at most (send, target and READ rings each);
/// large messages get fewer slots instead of more memory.
pub const RING_BUDGET: usize = 16 << 20;

/// Fewest measured iterations (`-n`).
pub const MIN_ITERS: u64 = 5;
/// Most measured iterations (`-n`) and warm-up operations (`--warmup`).
pub const MAX_ITERS: u64 = 1 << 40;
/// Longest completion timeout a client may name: a day, as `--timeout`.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// Latency tests signal one send in this many unless `-Q` says otherwise.
/// (perftest's latency tests signal every send and wait for each
/// completion: `--await-sends` asks pinpoll-perf for the same.)
pub const LATENCY_SIGNAL_INTERVAL: u32 = 16;

/// The tests, named as perftest names its programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// RDMA WRITE ping-pong; each side spins on the last byte.
    WriteLat,
    /// SEND/RECV ping-pong.
    SendLat,
    /// RDMA READ round trips.
    ReadLat,
    /// A stream of RDMA WRITEs.
    WriteBw,
    /// A stream of RDMA WRITE_WITH_IMMs (each consumes a receive).
    WriteImmBw,
    /// A stream of SENDs.
    SendBw,
    /// A stream of RDMA READs.
    ReadBw,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::WriteLat,
        Kind::SendLat,
        Kind::ReadLat,
        Kind::WriteBw,
        Kind::WriteImmBw,
        Kind::SendBw,
        Kind::ReadBw,
    ];

    /// The subcommand name, e.g. `write-lat`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::WriteLat => "write-lat",
            Kind::SendLat => "send-lat",
            Kind::ReadLat => "read-lat",
            Kind::WriteBw => "write-bw",
            Kind::WriteImmBw => "write-imm-bw",
            Kind::SendBw => "send-bw",
            Kind::ReadBw => "read-bw",
        }
    }

    /// perftest's banner for the same test.
    pub fn title(self) -> &'static str {
        match self {
            Kind::WriteLat => "RDMA_Write Latency Test",
            Kind::SendLat => "Send Latency Test",
            Kind::ReadLat => "RDMA_Read Latency Test",
            Kind::WriteBw => "RDMA_Write BW Test",
            Kind::WriteImmBw => "RDMA_Write_With_Imm BW Test",
            Kind::SendBw => "Send BW Test",
            Kind::ReadBw => "RDMA_Read BW Test",
        }
    }

    pub fn is_latency(self) -> bool {
        matches!(self, Kind::WriteLat | Kind::SendLat | Kind::ReadLat)
    }

    /// Whether every operation consumes a receive at the server, so the
    /// client must not run ahead of the server's posted receives.
    pub fn consumes_receives(self) -> bool {
        matches!(self, Kind::SendLat | Kind::SendBw | Kind::WriteImmBw)
    }

    /// Whether the reported latency is half a round trip (perftest's
    /// convention for WRITE and SEND) rather than the whole one (READ).
    pub fn reports_half_round_trip(self) -> bool {
        matches!(self, Kind::WriteLat | Kind::SendLat)
    }

    /// perftest's default message size for the test.
    pub fn default_size(self) -> usize {
        if self.is_latency() {
            2
        } else {
            65536
        }
    }

    /// perftest's default iteration count.
    pub fn default_iters(self) -> u64 {
        if self.is_latency() {
            1000
        } else {
            5000
        }
    }

    /// The tuning profile a test starts from unless `--profile` says otherwise.
    pub fn default_profile(self) -> &'static str {
        if self.is_latency() {
            "latency"
        } else {
            "throughput"
        }
    }
}

/// Who posts on the client side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The measuring thread owns the connection and posts and polls itself.
    Direct,
    /// A pinned worker thread owns the connection (pinpoll::Engine); the
    /// measuring thread hands it operations and takes completions back.
    Engine,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Engine => "engine",
        }
    }
}

/// Connection settings both sides must agree on, as they travel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireConfig {
    pub send_depth: u32,
    pub recv_depth: u32,
    pub cq_depth: u32,
    pub batch_size: u32,
    pub signal_interval: u32,
    pub inline_threshold: u32,
    pub max_inline_data: u32,
    pub slot_size: u32,
    pub slot_count: u32,
    pub hugepages: bool,
    pub qp_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub completion_timeout_ms: u64,
}

impl WireConfig {
    pub fn from_config(c: &EngineConfig) -> WireConfig {
        WireConfig {
            send_depth: c.qp.max_send_wr,
            recv_depth: c.qp.max_recv_wr,
            cq_depth: c.qp.cq_depth,
            batch_size: c.batch_size,
            signal_interval: c.signal_interval,
            inline_threshold: c.inline_threshold,
            max_inline_data: c.qp.max_inline_data,
            slot_size: c.slot_size,
            slot_count: c.slot_count,
            hugepages: c.pages != PageSize::Base,
            qp_timeout: c.qp.timeout,
            retry_count: c.qp.retry_count,
            rnr_retry: c.qp.rnr_retry,
            max_rd_atomic: c.qp.max_rd_atomic,
            completion_timeout_ms: c.completion_timeout.as_millis() as u64,
        }
    }

    /// The engine configuration these settings describe, on top of `base`
    /// (which supplies what does not travel: the core, connect timeout...).
    pub fn apply(&self, base: &EngineConfig) -> anyhow::Result<EngineConfig> {
        let mut c = base.clone();
        c.qp.max_send_wr = self.send_depth;
        c.qp.max_recv_wr = self.recv_depth;
        c.qp.cq_depth = self.cq_depth;
        c.batch_size = self.batch_size;
        c.signal_interval = self.signal_interval;
        c.inline_threshold = self.inline_threshold;
        c.qp.max_inline_data = self.max_inline_data;
        c.slot_size = self.slot_size;
        c.slot_count = self.slot_count;
        c.pages = if self.hugepages {
            PageSize::Huge2M
        } else {
            PageSize::Base
        };
        c.qp.timeout = self.qp_timeout;
        c.qp.retry_count = self.retry_count;
        c.qp.rnr_retry = self.rnr_retry;
        c.qp.max_rd_atomic = self.max_rd_atomic;
        c.completion_timeout = Duration::from_millis(self.completion_timeout_ms);
        c.validate()?;
        Ok(c)
    }

    /// Checks every field on its own, as it arrives: the ranges
    /// [`EngineConfig::validate`] enforces, and a completion timeout of at
    /// most [`MAX_TIMEOUT_MS`].
    pub fn check(&self) -> anyhow::Result<()> {
        if self.completion_timeout_ms > MAX_TIMEOUT_MS {
            anyhow::bail!(
                "completion_timeout_ms = {} is out of range 1..={MAX_TIMEOUT_MS}",
                self.completion_timeout_ms
            );
        }
        self.apply(&EngineConfig::default()).map(drop)
    }
}

/// One measurement, as the client sends it to the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub kind: Kind,
    pub mode: Mode,
    pub size: usize,
    pub iters: u64,
    pub warmup: u64,
    /// Latency tests: every send is signaled and its completion awaited
    /// before the test goes on, on both sides (perftest's way). Needs a
    /// signal interval of 1 and direct mode.
    pub await_sends: bool,
    pub config: WireConfig,
}

impl Params {
    /// Checks every field against the ranges the client's command line
    /// allows, and that a message fits a slot: a server serves nothing
    /// else.
    pub fn check(&self) -> anyhow::Result<()> {
        let bad = |what: String| Err(anyhow::Error::msg(what));
        if self.size == 0 || self.size > MAX_SIZE {
            return bad(format!(
                "message size {} is out of range 1..={MAX_SIZE}",
                self.size
            ));
        }
        if !(MIN_ITERS..=MAX_ITERS).contains(&self.iters) {
            return bad(format!(
                "iterations {} are out of range {MIN_ITERS}..={MAX_ITERS}",
                self.iters
            ));
        }
        if self.warmup > MAX_ITERS {
            return bad(format!(
                "warm-up {} is out of range 0..={MAX_ITERS}",
                self.warmup
            ));
        }
        self.config.check()?;
        check_await_sends(
            self.await_sends,
            self.kind,
            self.mode,
            self.config.signal_interval,
        )
        .map_err(anyhow::Error::msg)?;
        if self.size > self.config.slot_size as usize {
            return bad(format!(
                "message size {} does not fit a slot of {} bytes",
                self.size, self.config.slot_size
            ));
        }
        Ok(())
    }

    /// What the server needs to serve this measurement.
    pub fn plan(&self) -> Plan {
        Plan::new(self.kind, self.mode, self.size, self.config.recv_depth)
            .awaiting_sends(self.await_sends)
    }
}

/// Awaiting every send's completion is a latency test's, in direct mode
/// (the engine's worker owns its completions), and every send must be
/// signaled: an unsignaled one completes only with a later one.
pub fn check_await_sends(
    await_sends: bool,
    kind: Kind,
    mode: Mode,
    signal_interval: u32,
) -> Result<(), String> {
    if !await_sends {
        return Ok(());
    }
    if !kind.is_latency() {
        return Err(format!(
            "--await-sends is for latency tests, not {}",
            kind.name()
        ));
    }
    if mode != Mode::Direct {
        return Err("--await-sends is for --mode direct".into());
    }
    if signal_interval != 1 {
        return Err(format!(
            "--await-sends signals every send: a signal interval of {signal_interval} (-Q) cannot be awaited"
        ));
    }
    Ok(())
}

/// What both sides' loops need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub kind: Kind,
    pub mode: Mode,
    pub size: usize,
    /// Receives the server keeps posted (its receive queue depth).
    pub recv_depth: u64,
    /// The server returns a credit every this many consumed messages.
    pub credit_window: u64,
    /// Latency tests: both sides wait for each send's completion before
    /// going on ([`Params::await_sends`]).
    pub await_sends: bool,
}

impl Plan {
    pub fn new(kind: Kind, mode: Mode, size: usize, recv_depth: u32) -> Plan {
        let recv_depth = u64::from(recv_depth.max(1));
        Plan {
            kind,
            mode,
            size,
            recv_depth,
            credit_window: (recv_depth / 4).max(1),
            await_sends: false,
        }
    }

    /// This plan, with every send's completion awaited or not.
    pub fn awaiting_sends(self, await_sends: bool) -> Plan {
        Plan {
            await_sends,
            ..self
        }
    }

    /// In engine mode the client cannot see its target ring, so the
    /// server answers a write-latency ping with WRITE_WITH_IMM, whose
    /// immediate reaches the client as a completion.
    pub fn reply_with_imm(&self) -> bool {
        self.kind == Kind::WriteLat && self.mode == Mode::Engine
    }
}

/// Overrides of the profile from perftest-style flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `-t`: send-queue depth.
    pub tx_depth: Option<u32>,
    /// `-l`: work requests per doorbell.
    pub post_list: Option<u32>,
    /// `-Q`: one completion per this many sends.
    pub cq_mod: Option<u32>,
    /// `-I`: largest inline payload.
    pub inline_size: Option<u32>,
    /// `-x`: the GID index to route by (it does not travel: each side
    /// applies its own).
    pub gid_index: Option<u32>,
    /// `--hugepages`: rings on 2 MiB pages.
    pub hugepages: bool,
    /// `--timeout`: every wait's bound.
    pub timeout: Option<Duration>,
}

fn prev_power_of_two(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

/// The connection configuration for `kind` at `size` bytes: the profile,
/// the flags on top, and rings sized to the message (slots as large as
/// the message, as many as fit [`RING_BUDGET`]).
pub fn data_config(
    base: &EngineConfig,
    kind: Kind,
    size: usize,
    o: &Overrides,
) -> anyhow::Result<EngineConfig> {
    if size == 0 || size > MAX_SIZE {
        anyhow::bail!("message size {size} is out of range 1..={MAX_SIZE}");
    }
    let mut c = base.clone();
    if let Some(t) = o.tx_depth {
        c.qp.max_send_wr = t;
    }
    if let Some(l) = o.post_list {
        c.batch_size = l;
    }
    if let Some(q) = o.cq_mod {
        c.signal_interval = q;
    } else if kind.is_latency() {
        // A ping-pong needs no completion per send: one in 16 frees the
        // queue in time and saves the device a CQE per operation
        // (perftest signals every send and waits for it: --await-sends).
        c.signal_interval = LATENCY_SIGNAL_INTERVAL
            .min(c.qp.max_send_wr.saturating_sub(c.batch_size))
            .max(1);
    }
    if let Some(i) = o.inline_size {
        c.inline_threshold = i;
        c.qp.max_inline_data = i;
    }
    if o.hugepages {
        c.pages = PageSize::Huge2M;
    }
    if o.gid_index.is_some() {
        c.qp.gid_index = o.gid_index;
    }
    if let Some(t) = o.timeout {
        c.completion_timeout = t;
        c.qp.connect_timeout = t;
    }
    let slot = size.div_ceil(64) * 64;
    c.slot_size = slot as u32;
    let fit = prev_power_of_two((RING_BUDGET / slot).max(2));
    let mut slots = (base.slot_count as usize).min(fit).max(2);
    // Unsignaled requests hold their ring slots until a later signal, so
    // a ring holds at least batch_size + signal_interval slots. Where
    // large slots leave fewer, the profile's batching shrinks to fit;
    // batching asked for with -l/-Q gets the memory instead.
    let need = (c.batch_size + c.signal_interval) as usize;
    if slots < need {
        if o.post_list.is_none() && o.cq_mod.is_none() {
            c.batch_size = c.batch_size.min((slots / 2).max(1) as u32);
            c.signal_interval = c
                .signal_interval
                .min((slots as u32).saturating_sub(c.batch_size).max(1));
        } else {
            slots = need.next_power_of_two();
        }
    }
    c.slot_count = slots as u32;
    c.qp.max_recv_wr = if kind.consumes_receives() {
        (base.qp.max_recv_wr as usize).min(fit).max(4) as u32
    } else {
        // Nothing but the odd message arrives: keep the receive ring small.
        (base.qp.max_recv_wr as usize).clamp(4, 8) as u32
    };
    c.qp.max_recv_wr = prev_power_of_two(c.qp.max_recv_wr as usize) as u32;
    c.qp.cq_depth =
        c.qp.max_send_wr
            .max(c.qp.max_recv_wr)
            .max(c.qp.cq_depth.min(
                // Never below what the queues need; never needlessly above.
                2 * c.qp.max_send_wr.max(c.qp.max_recv_wr),
            ));
    c.validate()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_shrink_for_large_messages_and_stay_valid() {
        let base = EngineConfig::default();
        for size in [1, 2, 8, 64, 65, 4096, 65536, 1 << 20, MAX_SIZE] {
            for kind in Kind::ALL {
                let c = data_config(&base, kind, size, &Overrides::default()).unwrap();
                assert!(c.slot_size as usize >= size);
                assert!(c.slot_count.is_power_of_two() && c.slot_count >= 2);
                assert!(c.qp.max_recv_wr.is_power_of_two());
                assert!(
                    c.slot_size as usize * c.slot_count as usize <= RING_BUDGET.max(2 * size + 64),
                    "{kind:?} {size}"
                );
                assert!(c.slot_count >= c.batch_size + c.signal_interval);
            }
        }
        assert!(data_config(&base, Kind::WriteBw, 0, &Overrides::default()).is_err());
        assert!(data_config(&base, Kind::WriteBw, MAX_SIZE + 1, &Overrides::default()).is_err());
    }

    #[test]
    fn wire_config_round_trips() {
        let base = EngineConfig::default();
        let c = data_config(&base, Kind::SendBw, 4096, &Overrides::default()).unwrap();
        let w = WireConfig::from_config(&c);
        assert_eq!(w.apply(&base).unwrap(), c);
    }
}
