//! What a server lets one client's measurement take. The client chooses
//! the connection's configuration (rings, depths, timeouts); the server
//! registers the rings that configuration describes, so it bounds them:
//! a client that asks for more registered memory than the server allows
//! is refused, and the refusal says why in words the client prints.

use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use pinpoll::{EngineConfig, PageSize};

use crate::plan::{data_config, Kind, Overrides, Params, MAX_SIZE};

/// The bounds a server puts on its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The test this server runs.
    pub kind: Kind,
    /// Bytes one data connection may pin: its four rings and queues
    /// ([`pinned_bytes`]).
    pub max_registered: u64,
    /// Where `max_registered` comes from, for the refusal's text.
    pub origin: String,
    /// The server's own bound on every wait: a client's longer completion
    /// timeout is cut to it.
    pub timeout: Duration,
}

/// The bytes a data connection of `cfg` pins: each ring rounded up to its
/// page size (a huge-page ring of 4 KiB pins 2 MiB), and its queues — the
/// work-queue entries and completions that a provider keeps in pinned
/// memory (e.g. mlx5), sized as the largest entries of common hardware
/// (a send entry of 64 bytes, its inline data and its gather list, a
/// receive entry of 16 bytes per gather entry, a 64-byte completion), each
/// rounded up to a power of two and the queues to whole base pages.
pub fn pinned_bytes(cfg: &EngineConfig) -> u64 {
    let round = |bytes: u64, page: u64| bytes.div_ceil(page) * page;
    let page = cfg.pages.bytes() as u64;
    let base = PageSize::Base.bytes() as u64;
    let rings: u64 = cfg.ring_bytes().iter().map(|&r| round(r, page)).sum();
    let qp = &cfg.qp;
    let send_entry =
        (64 + u64::from(qp.max_inline_data) + 16 * u64::from(qp.max_sge)).next_power_of_two();
    let recv_entry = (16 * u64::from(qp.max_sge)).next_power_of_two();
    let queues = round(send_entry * u64::from(qp.max_send_wr), base)
        + round(recv_entry * u64::from(qp.max_recv_wr), base)
        + round(64 * u64::from(qp.cq_depth), base);
    rings + queues
}

/// The most `profile` pins for `kind` at any message size (rings
/// shrink in slots as messages grow, so it is the largest size's, but
/// every power of two is asked).
pub fn profile_limit(profile: &EngineConfig, kind: Kind) -> anyhow::Result<u64> {
    let mut most = 0;
    let mut size = 1;
    while size <= MAX_SIZE {
        let cfg = data_config(profile, kind, size, &Overrides::default())?;
        most = most.max(pinned_bytes(&cfg));
        size *= 2;
    }
    Ok(most)
}

/// `n` bytes, with MiB when that is shorter to read.
pub fn show_bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{n} bytes ({:.1} MiB)", n as f64 / f64::from(1u32 << 20))
    } else {
        format!("{n} bytes")
    }
}

impl Limits {
    /// The limits of a server running `kind` with `base` (its profile):
    /// `max_registered` if given (`--max-registered`), else what the
    /// profile itself registers at most ([`profile_limit`]).
    pub fn new(
        kind: Kind,
        base: &EngineConfig,
        profile: &str,
        max_registered: Option<u64>,
        timeout: Duration,
    ) -> Result<Limits> {
        let (max_registered, origin) = match max_registered {
            Some(bytes) => (bytes, "--max-registered".to_owned()),
            None => (
                profile_limit(base, kind)
                    .with_context(|| format!("the server's profile {profile}"))?,
                format!(
                    "the most its profile `{profile}` registers for {}; raise it with --max-registered",
                    kind.name()
                ),
            ),
        };
        Ok(Limits {
            kind,
            max_registered,
            origin,
            timeout,
        })
    }

    /// The data connection's configuration that `params` asks for, on top
    /// of the server's `base`, if this server allows it; otherwise an
    /// error whose text is meant for the client.
    pub fn admit(&self, params: &Params, base: &EngineConfig) -> Result<EngineConfig> {
        if params.kind != self.kind {
            bail!(
                "the server runs {} but the client asked for {}",
                self.kind.name(),
                params.kind.name()
            );
        }
        params
            .check()
            .context("the client's parameters are out of range")?;
        let mut cfg = params
            .config
            .apply(base)
            .context("the client's configuration is invalid here")?;
        cfg.completion_timeout = cfg.completion_timeout.min(self.timeout);
        let need = pinned_bytes(&cfg);
        if need > self.max_registered {
            bail!(
                "the client's rings and queues need {} registered (3 rings of {} x {} B, {} receive slots, \
                 on {} pages, and queues of {} + {} entries), \
                 more than this server allows: {} ({}); ask for smaller messages or fewer slots",
                show_bytes(need),
                cfg.slot_count,
                cfg.slot_size,
                cfg.qp.max_recv_wr,
                show_bytes(cfg.pages.bytes() as u64),
                cfg.qp.max_send_wr,
                cfg.qp.max_recv_wr,
                show_bytes(self.max_registered),
                self.origin,
            );
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Mode, WireConfig};
    use proptest::prelude::*;

    fn throughput() -> EngineConfig {
        let mut base = EngineConfig::load("throughput").unwrap();
        base.core = None;
        base
    }

    fn params(kind: Kind, size: usize, o: &Overrides, base: &EngineConfig) -> Params {
        let cfg = data_config(base, kind, size, o).unwrap();
        Params {
            kind,
            mode: Mode::Direct,
            size,
            iters: 100,
            warmup: 0,
            await_sends: false,
            config: WireConfig::from_config(&cfg),
        }
    }

    fn limits(kind: Kind, base: &EngineConfig, max: Option<u64>) -> Limits {
        Limits::new(kind, base, "throughput", max, Duration::from_secs(30)).unwrap()
    }

    #[test]
    fn the_default_profiles_allow_every_size_of_their_own_flags() {
        for profile in ["latency", "throughput", "softroce"] {
            let mut base = EngineConfig::load(profile).unwrap();
            base.core = None;
            for kind in Kind::ALL {
                let limit = profile_limit(&base, kind).unwrap();
                // The rings of the largest message: 3 x 16 MiB plus at
                // least 4 receive slots of 8 MiB, and the queues.
                assert!(limit >= (48 + 32) << 20, "{profile} {kind:?}: {limit}");
                assert!(limit <= 113 << 20, "{profile} {kind:?}: {limit}");
            }
        }
    }

    #[test]
    fn a_client_over_the_limit_is_refused_with_the_numbers() {
        let base = throughput();
        let p = params(Kind::WriteBw, 65536, &Overrides::default(), &base);
        let cfg = p.config.apply(&base).unwrap();
        assert_eq!(
            cfg.registered_bytes(),
            (3 * 256 + 8) * 65536,
            "3 rings of 256 slots, 8 receive slots"
        );
        let need = pinned_bytes(&cfg);
        assert!(need > cfg.registered_bytes(), "the queues count too");
        let at = limits(Kind::WriteBw, &base, Some(need));
        at.admit(&p, &base).unwrap();
        let below = limits(Kind::WriteBw, &base, Some(need - 1));
        let err = format!("{:#}", below.admit(&p, &base).unwrap_err());
        assert!(
            err.contains(&format!("need {} registered", show_bytes(need)))
                && err.contains("on 4096 bytes pages")
                && err.contains("3 rings of 256 x 65536 B, 8 receive slots")
                && err.contains(&format!("allows: {} bytes", need - 1))
                && err.contains("(--max-registered)"),
            "{err}"
        );
    }

    #[test]
    fn deep_batching_needs_a_larger_limit_than_the_profile() {
        let base = throughput();
        // -l 4096 -Q 4096 -t 65536 at 8 MiB: 8192 slots of 8 MiB per ring.
        let o = Overrides {
            tx_depth: Some(65536),
            post_list: Some(4096),
            cq_mod: Some(4096),
            ..Overrides::default()
        };
        let p = params(Kind::WriteBw, MAX_SIZE, &o, &base);
        let by_profile = limits(Kind::WriteBw, &base, None);
        let err = format!("{:#}", by_profile.admit(&p, &base).unwrap_err());
        assert!(
            err.contains("profile `throughput` registers for write-bw")
                && err.contains("--max-registered"),
            "{err}"
        );
        let cfg = p.config.apply(&base).unwrap();
        assert_eq!(cfg.registered_bytes(), 3 * 8192 * (8 << 20) + 8 * (8 << 20));
        let need = pinned_bytes(&cfg);
        limits(Kind::WriteBw, &base, Some(need))
            .admit(&p, &base)
            .unwrap();
    }

    #[test]
    fn a_client_of_another_test_or_out_of_range_is_refused() {
        let base = throughput();
        let l = limits(Kind::WriteBw, &base, None);
        let p = params(Kind::SendLat, 8, &Overrides::default(), &base);
        let err = format!("{:#}", l.admit(&p, &base).unwrap_err());
        assert_eq!(
            err,
            "the server runs write-bw but the client asked for send-lat"
        );
        let mut p = params(Kind::WriteBw, 4096, &Overrides::default(), &base);
        p.config.slot_size = 1 << 30;
        p.config.slot_count = 3;
        let err = format!("{:#}", l.admit(&p, &base).unwrap_err());
        assert!(err.contains("slot_count = 3 is out of range"), "{err}");
        p.config.slot_count = 2;
        p.config.batch_size = 1;
        p.config.signal_interval = 1;
        let err = format!("{:#}", l.admit(&p, &base).unwrap_err());
        assert!(err.contains("more than this server allows"), "{err}");
    }

    /// Rings on huge pages pin whole 2 MiB pages, and the queues pin
    /// memory of their own: a limit that the rings' bytes alone would fit
    /// refuses them.
    #[test]
    fn huge_page_rounding_and_queues_count_against_the_limit() {
        let base = throughput();
        let o = Overrides {
            hugepages: true,
            ..Overrides::default()
        };
        let p = params(Kind::WriteBw, 64, &o, &base);
        let cfg = p.config.apply(&base).unwrap();
        assert_eq!(cfg.pages, PageSize::Huge2M);
        let rings = cfg.registered_bytes();
        assert!(rings < 4 << 21, "small rings: {rings}");
        let need = pinned_bytes(&cfg);
        assert!(
            need >= 4 << 21,
            "four rings of at least a 2 MiB page each: {need}"
        );
        let err = format!(
            "{:#}",
            limits(Kind::WriteBw, &base, Some(rings))
                .admit(&p, &base)
                .unwrap_err()
        );
        assert!(err.contains("on 2097152 bytes (2.0 MiB) pages"), "{err}");
        limits(Kind::WriteBw, &base, Some(need))
            .admit(&p, &base)
            .unwrap();
    }

    #[test]
    fn a_longer_client_timeout_is_cut_to_the_servers() {
        let base = throughput();
        let l = limits(Kind::SendBw, &base, None);
        let mut p = params(Kind::SendBw, 64, &Overrides::default(), &base);
        p.config.completion_timeout_ms = 3_600_000;
        let cfg = l.admit(&p, &base).unwrap();
        assert_eq!(cfg.completion_timeout, Duration::from_secs(30));
        p.config.completion_timeout_ms = 1500;
        let cfg = l.admit(&p, &base).unwrap();
        assert_eq!(cfg.completion_timeout, Duration::from_millis(1500));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The profile's limit holds whatever message size a client of
        /// the same profile and default flags picks.
        #[test]
        fn the_profile_limit_covers_every_size(
            size in 1..=MAX_SIZE,
            kind in prop::sample::select(Kind::ALL.to_vec()),
            profile in prop::sample::select(vec!["latency", "throughput", "softroce"]),
        ) {
            let mut base = EngineConfig::load(profile).unwrap();
            base.core = None;
            let limit = profile_limit(&base, kind).unwrap();
            let l = Limits::new(kind, &base, profile, None, Duration::from_secs(30)).unwrap();
            prop_assert_eq!(l.max_registered, limit);
            let p = params(kind, size, &Overrides::default(), &base);
            let cfg = l.admit(&p, &base).unwrap();
            prop_assert!(pinned_bytes(&cfg) <= limit);
        }
    }
}
