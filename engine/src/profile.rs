//! Engine tunables in one type, loadable from TOML profile files
//! (`tuning/profiles/*.toml`). Unknown keys and out-of-range values are
//! errors that name the key and what it accepts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::QpConfig;
use crate::error::{Error, Result};
use crate::sys::mem::PageSize;

/// What the busy-poll worker does when a poll finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Spin forever: lowest latency, one core at 100 %.
    Spin,
    /// Spin `spins` empty polls, then yield the CPU between polls
    /// (`sched_yield`) until work arrives; spinning resumes on the first hit.
    Backoff { spins: u32 },
}

/// Every tunable of a connection's fast path and of its worker thread.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The worker hands back up to this many events per poll of both CQs, so
/// its event queue must hold at least that many.
pub const MIN_HANDOFF_DEPTH: u32 = 128;

fn out_of_range(key: &str, value: impl std::fmt::Display, allowed: &str) -> Error {
    Error::Config(format!(
        "{key} = {value} is out of range: allowed {allowed}"
    ))
}

impl EngineConfig {
    /// Checks every field and the relations between them.
    pub fn validate(&self) -> Result<()> {
        self.qp.validate()?;
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
            return Err(out_of_range(
                "inline_threshold",
                self.inline_threshold,
                &format!("0..={} (max_inline_data)", self.qp.max_inline_data),
            ));
        }
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
            let cores = core_affinity::get_core_ids().map(|c| c.len()).unwrap_or(0);
            if core >= cores {
                return Err(Error::Config(format!(
                    "core = {core} does not exist: this machine has cores 0..={} available to this process",
                    cores.saturating_sub(1)
                )));
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

    /// Parses a profile; every key is optional and defaults as in
    /// [`EngineConfig::default`].
    pub fn from_toml(text: &str) -> Result<EngineConfig> {
        let file: ProfileFile =
            toml::from_str(text).map_err(|e| Error::Config(e.message().to_owned()))?;
        let cfg = file.into_config()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Loads `name_or_path`: a path to a `.toml` file, or the name of a
    /// profile in `tuning/profiles/` (found next to the executable's
    /// workspace, or under `$PINPOLL_PROFILE_DIR`).
    pub fn load(name_or_path: &str) -> Result<EngineConfig> {
        let path = locate_profile(name_or_path)?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::Config(format!("cannot read profile {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| match e {
            Error::Config(msg) => Error::Config(format!("profile {}: {msg}", path.display())),
            other => other,
        })
    }
}

/// Where a profile name is looked for, in order: `$PINPOLL_PROFILE_DIR`,
/// the workspace's `tuning/profiles`, then `./tuning/profiles`.
pub fn profile_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("PINPOLL_PROFILE_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    // The workspace this engine was built in (engine/ is one level down).
    if let Some(workspace) = Path::new(env!("CARGO_MANIFEST_DIR")).parent() {
        dirs.push(workspace.join("tuning/profiles"));
    }
    if let Ok(cwd) = std::env::current_dir() {
        dirs.push(cwd.join("tuning/profiles"));
    }
    dirs
}

/// The file `name_or_path` refers to: a path to a `.toml` file, or a
/// profile name looked up in [`profile_dirs`].
pub fn locate_profile(name_or_path: &str) -> Result<PathBuf> {
    let direct = Path::new(name_or_path);
    if name_or_path.ends_with(".toml") || name_or_path.contains('/') {
        return Ok(direct.to_path_buf());
    }
    let dirs = profile_dirs();
    dirs.iter().map(|d| d.join(format!("{name_or_path}.toml"))).find(|p| p.is_file()).ok_or_else(|| {
        Error::Config(format!(
            "no profile named {name_or_path:?} (looked in {}); give a name from tuning/profiles/ or a path to a .toml file",
            dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// The file format: flat keys, each optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    send_queue_depth: Option<u32>,
    recv_queue_depth: Option<u32>,
    cq_depth: Option<u32>,
    batch_size: Option<u32>,
    signal_interval: Option<u32>,
    inline_threshold: Option<u32>,
    slot_size: Option<u32>,
    slot_count: Option<u32>,
    hugepages: Option<String>,
    core: Option<i64>,
    idle: Option<String>,
    backoff_spins: Option<u32>,
    handoff_depth: Option<u32>,
    completion_timeout_ms: Option<u64>,
    heartbeat_interval_ms: Option<u64>,
    heartbeat_misses: Option<u32>,
    connect_timeout_ms: Option<u64>,
    qp_timeout: Option<u8>,
    retry_count: Option<u8>,
    rnr_retry: Option<u8>,
    min_rnr_timer: Option<u8>,
    max_rd_atomic: Option<u8>,
    gid_index: Option<u32>,
}

impl ProfileFile {
    fn into_config(self) -> Result<EngineConfig> {
        let mut c = EngineConfig::default();
        macro_rules! set {
            ($field:expr, $value:expr) => {
                if let Some(v) = $value {
                    $field = v;
                }
            };
        }
        set!(c.qp.max_send_wr, self.send_queue_depth);
        set!(c.qp.max_recv_wr, self.recv_queue_depth);
        set!(c.qp.cq_depth, self.cq_depth);
        set!(c.batch_size, self.batch_size);
        set!(c.signal_interval, self.signal_interval);
        if let Some(t) = self.inline_threshold {
            c.inline_threshold = t;
            c.qp.max_inline_data = t;
        }
        set!(c.slot_size, self.slot_size);
        set!(c.slot_count, self.slot_count);
        if let Some(h) = self.hugepages {
            c.pages = match h.as_str() {
                "none" | "off" => PageSize::Base,
                "2M" | "2MiB" => PageSize::Huge2M,
                "1G" | "1GiB" => PageSize::Huge1G,
                other => {
                    return Err(Error::Config(format!(
                        "hugepages = {other:?} is not one of \"none\", \"2M\", \"1G\""
                    )))
                }
            };
        }
        if let Some(core) = self.core {
            c.core = match core {
                -1 => None,
                n if n >= 0 => Some(n as usize),
                n => return Err(out_of_range("core", n, "-1 (unpinned) or a core number")),
            };
        }
        let spins = self.backoff_spins.unwrap_or(10_000);
        if let Some(idle) = self.idle {
            c.idle = match idle.as_str() {
                "spin" => IdlePolicy::Spin,
                "backoff" => IdlePolicy::Backoff { spins },
                other => {
                    return Err(Error::Config(format!(
                        "idle = {other:?} is not one of \"spin\", \"backoff\""
                    )))
                }
            };
        } else if self.backoff_spins.is_some() {
            c.idle = IdlePolicy::Backoff { spins };
        }
        set!(c.handoff_depth, self.handoff_depth);
        if let Some(ms) = self.heartbeat_interval_ms {
            c.heartbeat_interval = (ms > 0).then(|| Duration::from_millis(ms));
        }
        set!(c.heartbeat_misses, self.heartbeat_misses);
        set!(
            c.completion_timeout,
            self.completion_timeout_ms.map(Duration::from_millis)
        );
        set!(
            c.qp.connect_timeout,
            self.connect_timeout_ms.map(Duration::from_millis)
        );
        set!(c.qp.timeout, self.qp_timeout);
        set!(c.qp.retry_count, self.retry_count);
        set!(c.qp.rnr_retry, self.rnr_retry);
        set!(c.qp.min_rnr_timer, self.min_rnr_timer);
        set!(c.qp.max_rd_atomic, self.max_rd_atomic);
        if self.gid_index.is_some() {
            c.qp.gid_index = self.gid_index;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        EngineConfig::default().validate().unwrap();
    }

    #[test]
    fn a_profile_sets_every_key() {
        let cfg = EngineConfig::from_toml(
            r#"
            send_queue_depth = 512
            recv_queue_depth = 128
            cq_depth = 1024
            batch_size = 32
            signal_interval = 32
            inline_threshold = 64
            slot_size = 65536
            slot_count = 64
            hugepages = "2M"
            core = 1
            idle = "backoff"
            backoff_spins = 500
            handoff_depth = 256
            completion_timeout_ms = 250
            connect_timeout_ms = 3000
            qp_timeout = 14
            retry_count = 7
            rnr_retry = 6
            min_rnr_timer = 12
            max_rd_atomic = 8
            gid_index = 1
            "#,
        )
        .unwrap();
        assert_eq!(
            (cfg.qp.max_send_wr, cfg.qp.max_recv_wr, cfg.qp.cq_depth),
            (512, 128, 1024)
        );
        assert_eq!(
            (
                cfg.batch_size,
                cfg.signal_interval,
                cfg.inline_threshold,
                cfg.qp.max_inline_data
            ),
            (32, 32, 64, 64)
        );
        assert_eq!(
            (cfg.slot_size, cfg.slot_count, cfg.pages),
            (65536, 64, PageSize::Huge2M)
        );
        assert_eq!(
            (cfg.core, cfg.idle, cfg.handoff_depth),
            (Some(1), IdlePolicy::Backoff { spins: 500 }, 256)
        );
        assert_eq!(cfg.completion_timeout, Duration::from_millis(250));
        assert_eq!(
            (
                cfg.qp.timeout,
                cfg.qp.retry_count,
                cfg.qp.rnr_retry,
                cfg.qp.max_rd_atomic,
                cfg.qp.gid_index
            ),
            (14, 7, 6, 8, Some(1))
        );
    }

    #[test]
    fn bad_profiles_name_the_key_and_the_allowed_range() {
        let cases = [
            ("batch_sise = 4", "unknown field `batch_sise`"),
            (
                "batch_size = 0",
                "batch_size = 0 is out of range: allowed 1..=256",
            ),
            (
                "signal_interval = 250",
                "signal_interval = 250 is out of range: allowed 1..=240",
            ),
            (
                "slot_count = 100",
                "slot_count = 100 is out of range: allowed a power of two",
            ),
            (
                "slot_size = 100",
                "slot_size = 100 is out of range: allowed 64..=1073741824, a multiple of 64",
            ),
            ("hugepages = \"4K\"", "hugepages = \"4K\" is not one of"),
            (
                "idle = \"nap\"",
                "idle = \"nap\" is not one of \"spin\", \"backoff\"",
            ),
            ("qp_timeout = 0", "timeout = 0 disables retransmission"),
            ("core = 4096", "core = 4096 does not exist"),
            (
                "batch_size = \"big\"",
                "invalid type: string \"big\", expected u32",
            ),
            (
                "completion_timeout_ms = 0",
                "completion_timeout_ms = 0 is out of range",
            ),
            (
                "slot_count = 16",
                "slot_count = 16 is out of range: allowed at least batch_size + signal_interval = 32",
            ),
            (
                "handoff_depth = 64",
                "handoff_depth = 64 is out of range: allowed 128..=1048576",
            ),
        ];
        for (text, expected) in cases {
            let err = EngineConfig::from_toml(text).unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{text:?}: {err:?} should contain {expected:?}"
            );
        }
    }

    #[test]
    fn shipped_profiles_load() {
        for name in ["latency", "throughput"] {
            let cfg = EngineConfig::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            cfg.validate().unwrap();
        }
        let err = EngineConfig::load("no-such-profile")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no profile named \"no-such-profile\""),
            "{err}"
        );
    }
}
