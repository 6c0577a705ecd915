//! Engine profiles: where they live, and the effective configuration of
//! one, printed in the profile format itself (so it loads back unchanged).
//!
//! Parsing and validation are the engine's own ([`EngineConfig::load`]):
//! unknown keys and out-of-range values are errors naming the key and what
//! it accepts.

use std::collections::BTreeSet;

use pinpoll::config::profile::{self, ProfileSource};
use pinpoll::{EngineConfig, IdlePolicy, PageSize};

use crate::doctor::{pages_needed, pinned_bytes};
use crate::facts::error_chain;

/// What a name or path refers to, as [`EngineConfig::load`] resolves it.
pub fn locate(name_or_path: &str) -> Option<ProfileSource> {
    profile::locate(name_or_path).ok()
}

/// A profile that loaded and validated.
#[derive(Debug, Clone)]
pub struct Checked {
    pub name: String,
    pub source: Option<ProfileSource>,
    pub config: EngineConfig,
    /// The keys the file sets (the rest are engine defaults).
    pub set_keys: BTreeSet<String>,
}

/// Loads and validates a profile by name or path. The error is one line
/// naming the file, the key and the allowed range.
pub fn check(name_or_path: &str) -> Result<Checked, String> {
    let config = EngineConfig::load(name_or_path).map_err(|e| load_error(&e))?;
    let source = locate(name_or_path);
    let set_keys = source
        .as_ref()
        .and_then(|s| s.text().ok())
        .and_then(|t| t.parse::<toml::Table>().ok())
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default();
    Ok(Checked {
        name: name_or_path.to_owned(),
        source,
        config,
        set_keys,
    })
}

/// A profile error as one line, its causes after it: the profile, then
/// the key and the allowed range.
pub fn load_error(err: &pinpoll::Error) -> String {
    error_chain(err)
}

/// Every profile key with its effective value, in file order.
pub fn effective_keys(cfg: &EngineConfig) -> Vec<(&'static str, String)> {
    let q = &cfg.qp;
    let mut keys = vec![
        ("send_queue_depth", q.max_send_wr.to_string()),
        ("recv_queue_depth", q.max_recv_wr.to_string()),
        ("cq_depth", q.cq_depth.to_string()),
        ("batch_size", cfg.batch_size.to_string()),
        ("signal_interval", cfg.signal_interval.to_string()),
        ("inline_threshold", cfg.inline_threshold.to_string()),
        ("slot_size", cfg.slot_size.to_string()),
        ("slot_count", cfg.slot_count.to_string()),
        (
            "hugepages",
            match cfg.pages {
                PageSize::Base => "\"none\"",
                PageSize::Huge2M => "\"2M\"",
                PageSize::Huge1G => "\"1G\"",
            }
            .to_owned(),
        ),
        ("core", cfg.core.map_or("-1".to_owned(), |c| c.to_string())),
    ];
    match cfg.idle {
        IdlePolicy::Spin => keys.push(("idle", "\"spin\"".to_owned())),
        IdlePolicy::Backoff { spins } => {
            keys.push(("idle", "\"backoff\"".to_owned()));
            keys.push(("backoff_spins", spins.to_string()));
        }
    }
    keys.extend([
        ("handoff_depth", cfg.handoff_depth.to_string()),
        (
            "completion_timeout_ms",
            cfg.completion_timeout.as_millis().to_string(),
        ),
        (
            "heartbeat_interval_ms",
            cfg.heartbeat_interval
                .map_or(0, |d| d.as_millis())
                .to_string(),
        ),
        ("heartbeat_misses", cfg.heartbeat_misses.to_string()),
        (
            "connect_timeout_ms",
            q.connect_timeout.as_millis().to_string(),
        ),
        ("qp_timeout", q.timeout.to_string()),
        ("retry_count", q.retry_count.to_string()),
        ("rnr_retry", q.rnr_retry.to_string()),
        ("min_rnr_timer", q.min_rnr_timer.to_string()),
        ("max_rd_atomic", q.max_rd_atomic.to_string()),
    ]);
    if let Some(g) = q.gid_index {
        keys.push(("gid_index", g.to_string()));
    }
    keys
}

/// The effective configuration as a profile file: every key, those the
/// file does not set marked as engine defaults, plus what one connection
/// pins. Loads back to the same configuration.
pub fn effective_toml(cfg: &EngineConfig, set_keys: &BTreeSet<String>) -> String {
    let keys = effective_keys(cfg);
    let width = keys
        .iter()
        .map(|(k, v)| k.len() + v.len() + 3)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (key, value) in &keys {
        let line = format!("{key} = {value}");
        if set_keys.contains(*key) {
            out.push_str(&line);
        } else {
            out.push_str(&format!("{line:<width$}  # engine default"));
        }
        out.push('\n');
    }
    if cfg.qp.gid_index.is_none() {
        out.push_str("# gid_index unset: the first RoCE v2 GID of the port (else the first GID)\n");
    }
    let pinned = pinned_bytes(cfg);
    out.push_str(&format!(
        "# per connection: {pinned} bytes registered and locked (3 rings of slot_size x slot_count, 1 of slot_size x recv_queue_depth)"
    ));
    for (page, label) in [(PageSize::Huge2M, "2 MiB"), (PageSize::Huge1G, "1 GiB")] {
        let n = pages_needed(cfg, page);
        if n > 0 {
            out.push_str(&format!(", {n} {label} huge pages"));
        }
    }
    out.push('\n');
    out
}
