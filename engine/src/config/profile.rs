//! Profiles: an [`EngineConfig`] as a flat TOML file. The built-in ones
//! (`engine/profiles/*.toml`) are compiled into the crate, so they load by
//! name wherever the crate is used; `$PINPOLL_PROFILE_DIR` and explicit
//! paths add more. Unknown keys and out-of-range values are errors that
//! name the key and what it accepts.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::PageSize;
use super::{bad_setting, out_of_range, EngineConfig, IdlePolicy};
use crate::error::{Error, Result};

/// The built-in profiles: name and TOML text.
pub const BUILTIN: &[(&str, &str)] = &[
    ("latency", include_str!("../../profiles/latency.toml")),
    ("throughput", include_str!("../../profiles/throughput.toml")),
    ("softroce", include_str!("../../profiles/softroce.toml")),
];

/// Where a profile's text comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileSource {
    /// Compiled into the crate.
    Builtin(&'static str),
    /// A file: a path given, or a name found in `$PINPOLL_PROFILE_DIR`.
    File(PathBuf),
}

impl ProfileSource {
    /// Its TOML text.
    pub fn text(&self) -> Result<String> {
        match self {
            ProfileSource::Builtin(name) => BUILTIN
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, text)| (*text).to_owned())
                .ok_or_else(|| Error::UnknownProfile {
                    name: (*name).to_owned(),
                    builtin: builtin_names(),
                    dir: None,
                }),
            ProfileSource::File(path) => {
                std::fs::read_to_string(path).map_err(|source| Error::ReadProfile {
                    path: path.clone(),
                    source,
                })
            }
        }
    }
}

impl std::fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfileSource::Builtin(name) => write!(f, "built-in {name}"),
            ProfileSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What `name_or_path` refers to: a path (it names a `.toml` file or
/// contains `/`), else `$PINPOLL_PROFILE_DIR/NAME.toml` if that exists,
/// else a built-in profile.
pub fn locate(name_or_path: &str) -> Result<ProfileSource> {
    if name_or_path.ends_with(".toml") || name_or_path.contains('/') {
        return Ok(ProfileSource::File(PathBuf::from(name_or_path)));
    }
    let dir = std::env::var_os("PINPOLL_PROFILE_DIR").map(PathBuf::from);
    if let Some(path) = dir
        .as_deref()
        .map(|d| d.join(format!("{name_or_path}.toml")))
        .filter(|p| p.is_file())
    {
        return Ok(ProfileSource::File(path));
    }
    if let Some((name, _)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
        return Ok(ProfileSource::Builtin(name));
    }
    Err(Error::UnknownProfile {
        name: name_or_path.to_owned(),
        builtin: builtin_names(),
        dir,
    })
}

fn builtin_names() -> String {
    let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
    names.join(", ")
}

/// The 1-based line and column of byte `at` of `text`.
fn line_and_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..at.min(text.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|b| **b != b'\n').count() + 1;
    (line, column)
}

impl EngineConfig {
    /// Parses a profile; every key is optional and defaults as in
    /// [`EngineConfig::default`].
    ///
    /// ```
    /// use pinpoll::{EngineConfig, Error, ErrorKind};
    ///
    /// let cfg = EngineConfig::from_toml("batch_size = 8\nslot_size = 8192")?;
    /// assert_eq!((cfg.batch_size, cfg.slot_size), (8, 8192));
    ///
    /// // A bad value names its profile key, its field and what is allowed.
    /// let err = EngineConfig::from_toml("qp_timeout = 0").unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Config);
    /// assert!(matches!(err, Error::Setting { key: "qp_timeout", field: "qp.timeout", .. }));
    /// # Ok::<(), pinpoll::Error>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<EngineConfig> {
        let file: ProfileFile = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|span| line_and_column(text, span.start));
            Error::ProfileSyntax {
                at,
                message: e.message().to_owned(),
            }
        })?;
        let cfg = file.into_config()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Loads `name_or_path` (see [`locate`]): a built-in profile by name,
    /// a name in `$PINPOLL_PROFILE_DIR`, or a `.toml` file's path.
    ///
    /// ```
    /// let cfg = pinpoll::EngineConfig::load("latency")?;
    /// assert_eq!(cfg.batch_size, 1);
    /// // An unknown name lists the built-in ones.
    /// let err = pinpoll::EngineConfig::load("fastest").unwrap_err();
    /// assert!(err.to_string().contains("latency, throughput, softroce"), "{err}");
    /// # Ok::<(), pinpoll::Error>(())
    /// ```
    pub fn load(name_or_path: &str) -> Result<EngineConfig> {
        let source = locate(name_or_path)?;
        Self::from_toml(&source.text()?).map_err(|e| Error::InProfile {
            profile: source.to_string(),
            source: Box::new(e),
        })
    }
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
                    return Err(bad_setting(
                        "hugepages",
                        format!("{other:?}"),
                        "is not one of \"none\", \"2M\", \"1G\"",
                    ))
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
                    return Err(bad_setting(
                        "idle",
                        format!("{other:?}"),
                        "is not one of \"spin\", \"backoff\"",
                    ))
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
    fn a_built_in_name_that_does_not_exist_is_an_error_naming_the_ones_that_do() {
        // Builtin is public: a caller may name any &'static str.
        let err = ProfileSource::Builtin("lowlatency").text().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::UnknownProfile { .. }), "{err:?}");
        for (name, _) in BUILTIN {
            assert!(text.contains(name), "{text}");
        }
        assert!(text.contains("\"lowlatency\""), "{text}");
        assert!(ProfileSource::Builtin("latency").text().is_ok());
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
            ("hugepages = \"4K\"", "hugepages (field pages) = \"4K\" is not one of"),
            (
                "idle = \"nap\"",
                "idle = \"nap\" is not one of \"spin\", \"backoff\"",
            ),
            ("qp_timeout = 0", "qp_timeout (field qp.timeout) = 0 disables retransmission"),
            (
                "inline_threshold = 5000",
                "inline_threshold (field qp.max_inline_data) = 5000 is out of range 0..=4096",
            ),
            ("core = 4096", "core = 4096 does not exist"),
            (
                "batch_size = \"big\"",
                "invalid type: string \"big\", expected u32",
            ),
            (
                "completion_timeout_ms = 0",
                "completion_timeout_ms (field completion_timeout) = 0 is out of range",
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
    fn a_toml_error_says_where_it_is() {
        let text = "slot_count = 64\n\nslot_size = \"big\"\n";
        let err = EngineConfig::from_toml(text).unwrap_err().to_string();
        assert!(err.contains("line 3, column 13"), "{err}");
        assert_eq!(line_and_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_and_column("x", 99), (1, 2), "past the end: clamped");
    }

    #[test]
    fn built_in_profiles_load_by_name() {
        for (name, text) in BUILTIN {
            assert_eq!(locate(name).unwrap(), ProfileSource::Builtin(name));
            let cfg = EngineConfig::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cfg, EngineConfig::from_toml(text).unwrap());
        }
        let err = EngineConfig::load("no-such-profile")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no profile named \"no-such-profile\": the built-in ones are latency, throughput, softroce"),
            "{err}"
        );
    }

    #[test]
    fn a_path_or_a_profile_directory_adds_profiles() {
        let dir = std::env::temp_dir().join(format!("pinpoll-profiles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mine.toml");
        std::fs::write(&path, "batch_size = 8\n").unwrap();
        let by_path = EngineConfig::load(path.to_str().unwrap()).unwrap();
        assert_eq!(by_path.batch_size, 8);
        assert_eq!(
            locate(path.to_str().unwrap()).unwrap(),
            ProfileSource::File(path.clone())
        );
        let err = EngineConfig::load(dir.join("absent.toml").to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read profile"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
