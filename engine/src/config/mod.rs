//! Every tunable, checked before any verb runs: [`QpConfig`] (queue
//! pair, CQ and transport) inside [`EngineConfig`] (rings, batching,
//! signaling, worker, timeouts), loadable from TOML [`profile`]s.

#[cfg(feature = "profiles")]
pub mod profile;

use std::time::Duration;

use crate::error::{Error, Result};

/// The pages that back registered memory ([`PageSize::bytes`] says how
/// large each is on this system).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSize {
    /// The system's base page (4 KiB on x86-64).
    Base,
    /// 2 MiB huge pages (hugetlbfs, `vm.nr_hugepages`).
    Huge2M,
    /// 1 GiB huge pages (reserved at boot: `hugepagesz=1G hugepages=N`).
    Huge1G,
}

/// Transport and queue settings of one reliable-connected queue pair.
///
/// Defaults suit production: a local ACK timeout of 14 (4.096 µs × 2^14 ≈ 67 ms)
/// with 7 retries, and a finite RNR retry so a stuck receiver surfaces as an
/// error instead of an endless stall.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpConfig {
    /// Send-queue depth in work requests.
    pub max_send_wr: u32,
    /// Receive-queue depth in work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send and per receive.
    pub max_sge: u32,
    /// Bytes that may be posted inline (0 disables inline).
    pub max_inline_data: u32,
    /// Completion-queue depth of each of the send and receive CQs.
    pub cq_depth: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout), 1..=31. Never 0:
    /// on rxe and many HCAs 0 means "wait forever" and nothing is retransmitted.
    pub timeout: u8,
    /// Transport retries before RETRY_EXC_ERR, 0..=7.
    pub retry_count: u8,
    /// RNR retries before RNR_RETRY_EXC_ERR, 0..=6 (7 would mean infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code advertised to the peer, 0..=31 (12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READs this side may issue and serve, 1..=16.
    pub max_rd_atomic: u8,
    /// Port of the device to use (1-based).
    pub port: u8,
    /// GID index to use on RoCE; `None` selects the first RoCE v2 entry,
    /// or the first non-zero one where the table says no types.
    pub gid_index: Option<u32>,
    /// Bound on rdma_cm address and route resolution, and on connection
    /// establishment.
    pub connect_timeout: Duration,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_sge: 1,
            max_inline_data: 0,
            cq_depth: 256,
            timeout: 14,
            retry_count: 7,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            port: 1,
            gid_index: None,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl QpConfig {
    /// Checks every field against what the verbs accept, naming the field
    /// and its range on failure.
    pub fn validate(&self) -> Result<()> {
        fn range(name: &'static str, value: u64, lo: u64, hi: u64) -> Result<()> {
            if (lo..=hi).contains(&value) {
                Ok(())
            } else {
                Err(bad_setting(
                    name,
                    value,
                    format!("is out of range {lo}..={hi}"),
                ))
            }
        }
        range("max_send_wr", self.max_send_wr.into(), 1, 1 << 16)?;
        range("max_recv_wr", self.max_recv_wr.into(), 1, 1 << 16)?;
        range("max_sge", self.max_sge.into(), 1, 32)?;
        range("max_inline_data", self.max_inline_data.into(), 0, 4096)?;
        range("cq_depth", self.cq_depth.into(), 1, 1 << 20)?;
        if self.timeout == 0 {
            return Err(bad_setting(
                "timeout",
                0,
                "disables retransmission (a lost packet then hangs the QP forever); use 1..=31, e.g. 14",
            ));
        }
        range("timeout", self.timeout.into(), 1, 31)?;
        range("retry_count", self.retry_count.into(), 0, 7)?;
        if self.rnr_retry == 7 {
            return Err(bad_setting(
                "rnr_retry",
                7,
                "means retry forever (a stopped receiver then hangs the sender); use 0..=6",
            ));
        }
        range("rnr_retry", self.rnr_retry.into(), 0, 6)?;
        range("min_rnr_timer", self.min_rnr_timer.into(), 0, 31)?;
        range("max_rd_atomic", self.max_rd_atomic.into(), 1, 16)?;
        range("port", self.port.into(), 1, 255)?;
        if self.connect_timeout.is_zero() {
            return Err(bad_setting(
                "connect_timeout",
                0,
                "is not allowed: the connection set-up needs a positive timeout",
            ));
        }
        Ok(())
    }
}

/// What the busy-poll worker does when a poll finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Spin forever: lowest latency, one core at 100 %.
    Spin,
    /// Spin `spins` empty polls, then yield the CPU between polls
    /// (`sched_yield`) until work arrives; spinning resumes on the first hit.
    Backoff {
        /// Consecutive empty polls to spin (each with a PAUSE hint) before
        /// yielding; a profile's `backoff_spins`, 10 000 when it gives none.
        spins: u32,
    },
}

/// Every tunable of a connection's fast path and of its worker thread.
/// Build one from [`EngineConfig::default`] or a profile
/// ([`EngineConfig::load`]) and set fields: it gains fields as the engine
/// grows (`#[non_exhaustive]`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Queue pair, CQ and transport settings (depths, timeouts, retries).
    pub qp: QpConfig,
    /// N: work requests posted with one doorbell, at most.
    pub batch_size: u32,
    /// K: one send in K is signaled (READs and explicitly signaled
    /// operations always are).
    pub signal_interval: u32,
    /// Payloads up to this many bytes are posted inline (0 = never);
    /// capped by the device's max_inline_data at connect time.
    pub inline_threshold: u32,
    /// Bytes per ring slot (send, receive, RDMA target and READ rings).
    pub slot_size: u32,
    /// Slots per send / target / READ ring (a power of two).
    pub slot_count: u32,
    /// Backing pages of the rings.
    pub pages: PageSize,
    /// Core the worker thread is pinned to (engine mode); `None` = unpinned.
    pub core: Option<usize>,
    /// What the engine-mode worker does after polls that found nothing
    /// (profile keys `idle` and `backoff_spins`); direct mode ignores it.
    pub idle: IdlePolicy,
    /// Depth of each engine-mode hand-off queue (operations in, events out).
    pub handoff_depth: u32,
    /// Bound on every completion wait.
    pub completion_timeout: Duration,
    /// An idle connection sends a heartbeat (a signaled zero-length RDMA
    /// WRITE, which needs no receive and no CPU at the peer) this often, so
    /// a dead peer is noticed even when nothing else is sent; `None` = off.
    pub heartbeat_interval: Option<Duration>,
    /// Intervals a heartbeat may stay unanswered before the peer is
    /// declared dead.
    pub heartbeat_misses: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            qp: QpConfig {
                max_send_wr: 256,
                max_recv_wr: 256,
                cq_depth: 512,
                max_inline_data: 128,
                ..QpConfig::default()
            },
            batch_size: 16,
            signal_interval: 16,
            inline_threshold: 128,
            slot_size: 4096,
            slot_count: 256,
            pages: PageSize::Base,
            core: None,
            idle: IdlePolicy::Spin,
            handoff_depth: 1024,
            completion_timeout: Duration::from_secs(5),
            heartbeat_interval: Some(Duration::from_secs(1)),
            heartbeat_misses: 3,
        }
    }
}

/// The least `handoff_depth`: the worker's hand-off rings hold at least
/// this many slots (its event queue also at least the connection's send
/// queue depth plus one poll's receives, whichever is more).
pub const MIN_HANDOFF_DEPTH: u32 = 128;

pub(crate) fn out_of_range(
    key: &'static str,
    value: impl std::fmt::Display,
    allowed: &str,
) -> Error {
    bad_setting(key, value, format!("is out of range: allowed {allowed}"))
}

/// [`Error::Setting`] for the setting `name` (its profile key or its
/// field) with `value`, and what is wrong with it.
pub(crate) fn bad_setting(
    name: &'static str,
    value: impl std::fmt::Display,
    problem: impl Into<String>,
) -> Error {
    let (key, field) = key_and_field(name);
    Error::Setting {
        key,
        field,
        value: value.to_string(),
        problem: problem.into(),
    }
}

/// A profile's key and the field of [`EngineConfig`] it sets, where the
/// two names differ.
const KEY_AND_FIELD: &[(&str, &str)] = &[
    ("send_queue_depth", "qp.max_send_wr"),
    ("recv_queue_depth", "qp.max_recv_wr"),
    ("cq_depth", "qp.cq_depth"),
    ("qp_timeout", "qp.timeout"),
    ("retry_count", "qp.retry_count"),
    ("rnr_retry", "qp.rnr_retry"),
    ("min_rnr_timer", "qp.min_rnr_timer"),
    ("max_rd_atomic", "qp.max_rd_atomic"),
    ("connect_timeout_ms", "qp.connect_timeout"),
    ("completion_timeout_ms", "completion_timeout"),
    ("heartbeat_interval_ms", "heartbeat_interval"),
    ("hugepages", "pages"),
    ("inline_threshold", "qp.max_inline_data"),
    ("gid_index", "qp.gid_index"),
    // No profile sets these: the key is the field's own name.
    ("max_sge", "qp.max_sge"),
    ("port", "qp.port"),
];

/// A setting's profile key and field, given either (or a `QpConfig`
/// field alone, as `QpConfig::validate` knows it).
fn key_and_field(name: &'static str) -> (&'static str, &'static str) {
    KEY_AND_FIELD
        .iter()
        .copied()
        .find(|(key, field)| {
            *key == name || *field == name || field.strip_prefix("qp.") == Some(name)
        })
        .unwrap_or((name, name))
}

impl EngineConfig {
    /// Checks every field and the relations between them.
    pub fn validate(&self) -> Result<()> {
        self.qp.validate()?;
        self.validate_send_side()?;
        self.validate_rings()?;
        self.validate_worker()
    }

    /// Batching, signalling and inlining against the send queue.
    fn validate_send_side(&self) -> Result<()> {
        let sq = self.qp.max_send_wr;
        if self.batch_size == 0 || self.batch_size > sq {
            return Err(out_of_range(
                "batch_size",
                self.batch_size,
                &format!("1..={sq} (send_queue_depth)"),
            ));
        }
        if self.signal_interval == 0 || self.batch_size + self.signal_interval > sq {
            return Err(out_of_range(
                "signal_interval",
                self.signal_interval,
                &format!("1..={} (batch_size + signal_interval must fit send_queue_depth {sq}, so a signaled request is always in flight when the queue is full)", sq.saturating_sub(self.batch_size)),
            ));
        }
        if self.inline_threshold > self.qp.max_inline_data {
            // The profile key sets both; a program set this field.
            return Err(Error::Setting {
                key: "inline_threshold",
                field: "inline_threshold",
                value: self.inline_threshold.to_string(),
                problem: format!(
                    "is out of range: allowed 0..={} (qp.max_inline_data)",
                    self.qp.max_inline_data
                ),
            });
        }
        Ok(())
    }

    /// The rings' slots, the receive queue and the completion queue.
    fn validate_rings(&self) -> Result<()> {
        let sq = self.qp.max_send_wr;
        if self.slot_size < 64 || self.slot_size > 1 << 30 || !self.slot_size.is_multiple_of(64) {
            return Err(out_of_range(
                "slot_size",
                self.slot_size,
                "64..=1073741824, a multiple of 64",
            ));
        }
        if !self.slot_count.is_power_of_two() || self.slot_count > 1 << 20 {
            return Err(out_of_range(
                "slot_count",
                self.slot_count,
                "a power of two, 1..=1048576",
            ));
        }
        if self.batch_size + self.signal_interval > self.slot_count {
            // Unsignaled requests hold their ring slots until a later
            // signal: the ring, like the queue, must always hold one.
            return Err(out_of_range(
                "slot_count",
                self.slot_count,
                &format!(
                    "at least batch_size + signal_interval = {}",
                    self.batch_size + self.signal_interval
                ),
            ));
        }
        if !self.qp.max_recv_wr.is_power_of_two() {
            return Err(out_of_range(
                "recv_queue_depth",
                self.qp.max_recv_wr,
                "a power of two (it is also the receive ring's slot count)",
            ));
        }
        if self.qp.cq_depth < sq.max(self.qp.max_recv_wr) {
            return Err(out_of_range(
                "cq_depth",
                self.qp.cq_depth,
                "at least max(send_queue_depth, recv_queue_depth)",
            ));
        }
        Ok(())
    }

    /// The worker's hand-off ring, heartbeats, timeouts and core.
    /// The settings of engine mode's worker alone (what `Engine::spawn`
    /// takes from its config; the rest is the connection's).
    pub(crate) fn validate_worker(&self) -> Result<()> {
        if !(MIN_HANDOFF_DEPTH..=1 << 20).contains(&self.handoff_depth) {
            return Err(out_of_range(
                "handoff_depth",
                self.handoff_depth,
                &format!("{MIN_HANDOFF_DEPTH}..=1048576"),
            ));
        }
        if self.heartbeat_misses == 0 || self.heartbeat_misses > 1000 {
            return Err(out_of_range(
                "heartbeat_misses",
                self.heartbeat_misses,
                "1..=1000",
            ));
        }
        if self.completion_timeout.is_zero() {
            return Err(out_of_range("completion_timeout_ms", 0, "1.. milliseconds"));
        }
        if let Some(core) = self.core {
            // Only whether the machine has it: the calling thread's CPU set
            // says nothing (an application may pin itself elsewhere), and
            // pinning the worker reports a core this process may not use
            // (Error::Pin).
            let cores = crate::sys::cpu::possible_cpus();
            if core >= cores {
                return Err(bad_setting(
                    "core",
                    core,
                    format!(
                        "does not exist: this machine's CPUs are numbered 0..={}",
                        cores.saturating_sub(1)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Bytes of the send, RDMA-target and READ rings (`slot_count` slots
    /// each) and of the receive ring (`recv_queue_depth` slots): what one
    /// connection registers, and so locks.
    pub fn ring_bytes(&self) -> [u64; 4] {
        let slot = u64::from(self.slot_size);
        let ring = slot * u64::from(self.slot_count);
        [ring, ring, ring, slot * u64::from(self.qp.max_recv_wr)]
    }

    /// Bytes one connection registers and locks (the sum of [`ring_bytes`](Self::ring_bytes)).
    pub fn registered_bytes(&self) -> u64 {
        self.ring_bytes().iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_is_named_by_its_profile_key_and_its_field() {
        let named = |name| {
            let Error::Setting { key, field, .. } = bad_setting(name, 0, "") else {
                unreachable!()
            };
            (key, field)
        };
        assert_eq!(named("max_send_wr"), ("send_queue_depth", "qp.max_send_wr"));
        assert_eq!(
            named("send_queue_depth"),
            ("send_queue_depth", "qp.max_send_wr")
        );
        assert_eq!(named("timeout"), ("qp_timeout", "qp.timeout"));
        assert_eq!(
            named("completion_timeout_ms"),
            ("completion_timeout_ms", "completion_timeout")
        );
        assert_eq!(named("slot_count"), ("slot_count", "slot_count"));
        let err = QpConfig {
            max_recv_wr: 0,
            ..QpConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("recv_queue_depth (field qp.max_recv_wr) = 0"),
            "{err}"
        );
    }

    #[test]
    fn engine_defaults_validate() {
        EngineConfig::default().validate().unwrap();
    }
    #[test]
    fn defaults_are_valid_and_never_disable_retransmission() {
        let cfg = QpConfig::default();
        cfg.validate().unwrap();
        assert_ne!(cfg.timeout, 0);
        assert!(cfg.rnr_retry < 7);
    }

    #[test]
    fn bad_values_name_the_field_and_range() {
        type Mutation = fn(&mut QpConfig);
        let cases: [(Mutation, &str); 5] = [
            (
                |c| c.timeout = 0,
                "qp_timeout (field qp.timeout) = 0 disables retransmission",
            ),
            (
                |c| c.timeout = 32,
                "qp_timeout (field qp.timeout) = 32 is out of range 1..=31",
            ),
            (
                |c| c.rnr_retry = 7,
                "rnr_retry (field qp.rnr_retry) = 7 means retry forever",
            ),
            (
                |c| c.retry_count = 8,
                "retry_count (field qp.retry_count) = 8 is out of range 0..=7",
            ),
            (
                |c| c.max_send_wr = 0,
                "send_queue_depth (field qp.max_send_wr) = 0 is out of range",
            ),
        ];
        for (mutate, expected) in cases {
            let mut cfg = QpConfig::default();
            mutate(&mut cfg);
            let err = cfg.validate().unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }
}
